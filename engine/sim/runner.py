"""The what-if runner: prices the scheduler's batch with the cost model instead of running a
model. It returns a token for every sequence that samples, as ModelRunner does, and leaves the
step's predicted time in `last_cost` for the replica to advance its virtual clock by, and the
model's part of it (all but the host's, StepCost.host_s) in `last_model_s` for the step record."""

from __future__ import annotations

from engine.config import EngineConfig
from engine.executor import Executor
from engine.scheduler import SchedulerOutput
from engine.sim.cost_model import ZERO_COST, CostModel, StepCost, StepShape, summed
from engine.sim.deployment import Deployment

# The token every simulated step emits: an ordinary id (the load generator's range), never EOS,
# so lengths are the requests' max_tokens as in `vllm bench serve --ignore-eos`.
SIM_TOKEN = 100


def step_shape(batch: SchedulerOutput) -> tuple[StepShape, dict[str, int]]:
    """The sums the cost model prices, and a token for every sequence that samples this step
    (read before the step runs: num_computed_tokens is each sequence's context so far)."""
    tokens: dict[str, int] = {}
    counts = batch.num_new_tokens
    num_decodes = counts.count(1)
    decode_ctx = prefill_ctx = 0
    prefill_attn = 0.0
    for seq, n in zip(batch.seqs, counts):
        done = seq.num_computed_tokens
        if n == 1:
            decode_ctx += done  # + 1 for each decode, added once below
        else:
            prefill_ctx += done
            prefill_attn += n * (done + (n + 1) / 2)
        if done + n == len(seq.prompt_token_ids) + len(seq.output_token_ids):  # seq.num_tokens, inlined
            tokens[seq.request_id] = SIM_TOKEN
    steady = batch.steady  # steady decodes: a token each, counted (engine/steady_decodes.py)
    num_decodes += steady
    num_tokens, decode_ctx = sum(counts) + steady, decode_ctx + batch.steady_context + num_decodes
    shape = StepShape(
        num_tokens, len(tokens) + steady, num_decodes, decode_ctx, prefill_attn, prefill_ctx, len(counts) + steady,
        not batch.continued,
    )
    return shape, tokens


class CostModelRunner:
    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.last_cost = ZERO_COST
        self.last_stages: list[StepCost] = [ZERO_COST]  # each pipeline stage's part of last_cost
        self.last_model_s = 0.0

    def execute(self, batch: SchedulerOutput) -> dict[str, int]:
        shape, tokens = step_shape(batch)
        self.last_stages = self.cost.stages(shape)
        cost = self.last_cost = summed(self.last_stages)
        self.last_model_s = cost.total_s - cost.host_s  # a replica's step spans total_s
        return tokens

    def forget(self, request_id: str) -> None:
        pass  # no per-request state: the cost model samples nothing


def sim_executor(dep: Deployment, config: EngineConfig) -> Executor:
    """A model spec on a device is enough: the KV plan from the device's memory, no weights."""
    memory = dep.plan_memory(config)
    return Executor(f"{dep.model.name} on {dep.tp * dep.pp} x {dep.device.name}", dep.shard_cfg, memory, CostModelRunner(CostModel(dep)))
