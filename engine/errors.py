"""Errors the engine raises for bad input. Each names the offending field, so a server can
answer with an OpenAI-style body whose `param` is that field."""

from __future__ import annotations


class InvalidParamError(ValueError):
    """A request or configuration value is out of range or of the wrong kind."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param
        self.message = message


class ModelLoadError(InvalidParamError):
    """The model path does not exist or holds a model this engine cannot run."""

    def __init__(self, message: str, param: str = "model") -> None:
        super().__init__(param, message)
