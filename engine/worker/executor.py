"""What an engine runs on, handed to LLMEngine: the model's shape, the KV plan and a runner.

The live executor loads weights and a tokenizer (LLMEngine builds it when given none); the
what-if executor (engine/sim) is a model spec, a device's memory plan and a cost model, with no
weights and no tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from engine.core.memory import MemoryPlan
from engine.core.scheduler import SchedulerOutput
from engine.model.llama_config import LlamaConfig
from engine.model.tokenizer import ChatTokenizer
from engine.sample.spec_decode import Proposer, ngram


class Runner(Protocol):
    # The latest step's time in the model (forward + sampling), measured where the model runs:
    # wall seconds live (the one place a step's wall time is read), the cost model's in a simulation.
    last_model_s: float

    def execute(self, batch: SchedulerOutput) -> dict[str, int | list[int]]:
        """Run one step; the new token of every sequence whose known tokens are all computed (a
        speculating decode's: the guesses that stood, then the model's own token, as a list)."""
        ...

    # A pipelined engine with overlap (EngineConfig.pipeline_overlap) keeps several batches in its
    # stages: execute(batch) is collect(launch(batch)), split so others launch between the two.
    def launch(self, batch: SchedulerOutput) -> Any:
        """Start one step; the handle (the runner's own type) goes back to collect."""
        ...

    def collect(self, step: Any) -> dict[str, int | list[int]]:
        """The launched step's new tokens, as execute returns them."""
        ...

    def forget(self, request_id: str) -> None:
        """A request left: drop any per-request state (sampling generators)."""
        ...


@dataclass
class Executor:
    name: str  # what the startup log calls the model
    model_cfg: LlamaConfig  # this rank's shard under tensor parallelism
    memory: MemoryPlan
    runner: Runner
    tokenizer: ChatTokenizer | None = None  # None: token ids in, token ids out (no text)
    proposer: Proposer = ngram  # speculative decoding's guesses (EngineConfig.num_speculative_tokens)
