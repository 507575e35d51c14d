"""The what-if runner: prices the scheduler's batch with the cost model instead of running a
model. It returns a token for every sequence that samples, as ModelRunner does, and leaves the
step's predicted time in `last_cost` for the replica to advance its virtual clock by, and the
model's part of it (all but the host's, StepCost.host_s) in `last_model_s` for the step record."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable

from engine.config import EngineConfig
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import Sequence
from engine.sim.cost_model import ZERO_COST, CostModel, StepCost, StepShape, summed
from engine.sim.deployment import Deployment
from engine.worker.executor import Executor

# The token every simulated step emits: an ordinary id (the load generator's range), never EOS,
# so lengths are the requests' max_tokens as in `vllm bench serve --ignore-eos`.
SIM_TOKEN = 100


def blind_guesses(seq: Sequence, k: int, lookup_min: int, lookup_max: int) -> list[int]:
    """A what-if replica's speculative guesses: k of them, always; how many stand is the cost
    model runner's draw (the acceptance rate stands for the drafter and the text)."""
    return [SIM_TOKEN] * k


def step_shape(
    batch: SchedulerOutput, accepted: Callable[[int], int] | None = None
) -> tuple[StepShape, dict[str, int | list[int]]]:
    """The sums the cost model prices, and a token for every sequence that samples this step
    (read before the step runs: num_computed_tokens is each sequence's context so far). A
    speculating decode is priced as its 1 + k tokens' chunk with a sampled row each, and
    accepted(k) says how many of its guesses stand."""
    tokens: dict[str, int | list[int]] = {}
    counts = batch.num_new_tokens
    num_decodes = counts.count(1)
    decode_ctx = prefill_ctx = verify_rows = 0
    prefill_attn = 0.0
    for seq, n in zip(batch.seqs, counts):
        done = seq.num_computed_tokens
        if n == 1:
            decode_ctx += done  # + 1 for each decode, added once below
        else:
            prefill_ctx += done
            prefill_attn += n * (done + (n + 1) / 2)
            if seq.spec_token_ids and n == 1 + len(seq.spec_token_ids):  # a decode checking its guesses
                assert accepted is not None, "a speculating what-if engine needs its runner's acceptance draw"
                tokens[seq.request_id] = [SIM_TOKEN] * (1 + accepted(n - 1))
                verify_rows += n - 1
                continue
        if done + n == len(seq.prompt_token_ids) + len(seq.output_token_ids):  # seq.num_tokens, inlined
            tokens[seq.request_id] = SIM_TOKEN
    steady = batch.steady  # steady decodes: a token each, counted (engine/core/steady_decodes.py)
    num_decodes += steady
    num_tokens, decode_ctx = sum(counts) + steady, decode_ctx + batch.steady_context + num_decodes
    shape = StepShape(
        num_tokens, len(tokens) + steady + verify_rows, num_decodes, decode_ctx, prefill_attn, prefill_ctx, len(counts) + steady,
        not batch.continued,
    )
    return shape, tokens


class CostModelRunner:
    def __init__(self, cost: CostModel, spec_acceptance: float = 0.0, seed: int = 0, spec_draft_cost: float = 0.0) -> None:
        self.cost = cost
        # Speculative decoding: each guess stands with this probability once those before it did
        # (the i.i.d. acceptance of Leviathan et al. 2023), drawn from a seeded stream; making k
        # guesses takes k draft passes, each spec_draft_cost of the step's model time (their c:
        # about 0 for n-gram lookup, a draft model's cost over the target's).
        self.spec_acceptance = spec_acceptance
        self.spec_draft_cost = spec_draft_cost
        self._rng = random.Random(seed)
        self.last_cost = ZERO_COST
        self.last_stages: list[StepCost] = [ZERO_COST]  # each pipeline stage's part of last_cost
        self.last_model_s = 0.0

    def execute(self, batch: SchedulerOutput) -> dict[str, int | list[int]]:
        shape, tokens = step_shape(batch, self._accepted)
        self.last_stages = self.cost.stages(shape)
        if self.spec_draft_cost and (k := max((len(s.spec_token_ids) for s in batch.seqs), default=0)):
            stage = self.last_stages[0]  # speculation runs on one stage (EngineConfig refuses more)
            draft_s = k * self.spec_draft_cost * (stage.total_s - stage.host_s)
            self.last_stages = [dataclasses.replace(stage, overhead_s=stage.overhead_s + draft_s)]
        cost = self.last_cost = summed(self.last_stages)
        self.last_model_s = cost.total_s - cost.host_s  # a replica's step spans total_s
        return tokens

    # The Runner's split step: a priced step is over at once (a simulated pipeline overlaps its
    # batches in virtual time, engine/sim/pipelined_replica.py), so the handle is its tokens.
    def launch(self, batch: SchedulerOutput) -> dict[str, int | list[int]]:
        return self.execute(batch)

    def collect(self, step: dict[str, int | list[int]]) -> dict[str, int | list[int]]:
        return step

    def _accepted(self, k: int) -> int:
        """How many of k guesses stand: the run of draws under the acceptance rate, at most k."""
        draw, rate, n = self._rng.random, self.spec_acceptance, 0
        while n < k and draw() < rate:
            n += 1
        return n

    def forget(self, request_id: str) -> None:
        pass  # no per-request state: the cost model samples nothing


def sim_executor(dep: Deployment, config: EngineConfig) -> Executor:
    """A model spec on a device is enough: the KV plan from the device's memory, no weights."""
    memory = dep.plan_memory(config)
    runner = CostModelRunner(CostModel(dep), dep.spec_acceptance, config.seed, dep.spec_draft_cost)
    name = f"{dep.model.name} on {dep.tp * dep.pp} x {dep.device.name}"
    return Executor(name, dep.shard_cfg, memory, runner, proposer=blind_guesses)
