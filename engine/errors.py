"""Errors the engine raises for bad input. Each names the offending field, so a server can
answer with an OpenAI-style body whose `param` is that field."""

from __future__ import annotations

from typing import ClassVar


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


class ServingError(Exception):
    """A request the serving stack refuses or fails: the HTTP status it answers with and the
    fields of the OpenAI error body. Raised below the web layer (admission) and in it (parsing)."""

    TYPES: ClassVar[dict[int, str]] = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        429: "rate_limit_error",
        502: "server_error",  # a remote backend that cannot be reached (issue 17)
        503: "service_unavailable_error",
    }

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after_s = retry_after_s

    @property
    def type(self) -> str:
        return self.TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
