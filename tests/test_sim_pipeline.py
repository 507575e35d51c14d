"""Pipeline parallelism in the what-if executor: layers split into stages (vLLM's split), each
stage priced for its own layers, the activations sent between them, KV planned per stage, and a
replica that keeps as many batches in flight as stages (or one, to show the bubble)."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.model.partition import stage_layers
from engine.sampling_params import SamplingParams
from engine.serving.replicas.messages import AddRequest
from engine.sim.assembly import sim_replica
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.devices import get_device
from engine.sim.loop import EventLoop
from engine.sim.models import get_model
from engine.sim.run import simulate
from engine.sim.spec import SimSpec

pytestmark = pytest.mark.unit


def dep(model: str, tp: int, pp: int = 1, dtype: str = "bf16", device: str = "h100") -> Deployment:
    return Deployment(get_model(model), get_device(device), tp, dtype, dtype, pp)


def test_layers_split_as_vllm_splits_them() -> None:
    assert stage_layers(32, 2) == [16, 16]
    assert stage_layers(30, 4) == [7, 8, 8, 7]  # the remainder to the stages before the last
    assert stage_layers(126, 4) == [31, 32, 32, 31]
    assert stage_layers(80, 1) == [80]


def test_stages_share_one_step_and_hand_over_the_activations() -> None:
    decode = StepShape(num_tokens=64, num_sampled=64, num_decodes=64, decode_context=64 * 2000)
    whole = CostModel(dep("llama-3.1-70b", tp=4)).step(decode)
    stages = CostModel(dep("llama-3.1-70b", tp=4, pp=2)).stages(decode)
    assert len(stages) == 2
    # A memory-bound decode reads the same weights and KV, half on each stage.
    assert sum(s.compute_s for s in stages) == pytest.approx(whole.total_s, rel=1e-9)
    assert stages[0].sample_s == 0 and stages[1].sample_s == whole.sample_s  # the last stage samples
    assert stages[0].overhead_s > stages[1].overhead_s  # the first schedules
    # 64 rows of hidden state and residual in bf16 over NVLink: microseconds, plus one send's latency.
    assert 0 < stages[0].transfer_s < 50e-6 and stages[1].transfer_s == 0
    across = CostModel(dep("llama-3.1-405b", tp=8, pp=2)).stages(decode)[0].transfer_s
    assert across > stages[0].transfer_s  # 16 GPUs span two nodes: the fabric joins the stages


def test_405b_in_bf16_takes_two_nodes_by_pipeline_stages() -> None:
    with pytest.raises(SimConfigError, match=r"812 GB of weights; 8 x h100 hold 640 GB.*--pp"):
        dep("llama-3.1-405b", tp=8)
    two_nodes = dep("llama-3.1-405b", tp=8, pp=2)
    assert two_nodes.gpu_weight_bytes < 60e9  # half the layers on each GPU of a stage
    tp16 = dep("llama-3.1-405b", tp=16)  # 8 KV heads: each held by two ranks, as vLLM replicates them
    assert tp16.shard_cfg.num_kv_heads == 1 and tp16.kv_bytes_per_token == dep("llama-3.1-405b", 8, 2).kv_bytes_per_token
    with pytest.raises(SimConfigError, match="query heads.*--pp"):
        dep("llama-3.1-70b", tp=3)
    with pytest.raises(SimConfigError, match="pipeline parallel 81 must be from 1 to llama-3.1-70b's 80 layers"):
        dep("llama-3.1-70b", tp=1, pp=81, dtype="fp8")


def test_each_stage_holds_the_kv_of_its_own_layers() -> None:
    config = EngineConfig(max_num_seqs=256, max_batched_tokens=8192)
    one, two = (dep("llama-3.1-70b", tp=4, pp=pp).plan_memory(config).num_blocks for pp in (1, 2))
    # Half the weights and half the layers' KV per GPU: more than twice the tokens a replica holds.
    assert two > 2 * one


def run(**changes: object) -> dict:
    base = {"model": "llama-3.1-70b", "device": "h100", "gpus": 8, "tp": 4, "pp": 2, "input_tokens": 500,
            "output_tokens": 100, "num_requests": 160, "seed": 2}
    return simulate(SimSpec(**(base | changes)))  # type: ignore[arg-type]


def test_batches_in_flight_fill_the_pipeline_and_one_at_a_time_shows_the_bubble() -> None:
    on, off = run(), run(pp_overlap=False)
    assert on["completed"] == off["completed"] == 160 and on["kv_blocks_free_at_end"]
    assert on["output_tok_s"] > 1.5 * off["output_tok_s"]
    assert max(off["stage_idle_share"]) > 0.4  # each of 2 stages waits while the other works
    assert max(on["stage_idle_share"]) < 0.2
    # One request has nothing to overlap: the same times either way, and each stage idles half.
    lone, lone_off = run(num_requests=1), run(num_requests=1, pp_overlap=False)
    assert lone["ttft_p50_s"] == lone_off["ttft_p50_s"] and lone["tpot_p50_s"] == lone_off["tpot_p50_s"]
    assert min(lone["stage_idle_share"]) > 0.4


def test_pipelined_runs_are_deterministic_and_survive_a_failed_replica() -> None:
    a, b = run(rate=40.0), run(rate=40.0)
    for result in (a, b):
        result.pop("wall_s"), result.pop("sim_s_per_wall_s")
    assert a == b
    failed = run(rate=200.0, kill_replica_at_s=0.5, pp=4, tp=2)
    assert failed["completed"] + sum(failed["refused"].values()) == 160
    assert failed["refused"].get("replica 0 killed", 0) > 0


def test_the_cli_takes_pp_and_names_the_shape() -> None:
    from engine.sim.__main__ import main

    argv = ["run", "--model", "llama-3.1-8b", "--device", "h100", "--gpus", "4", "--tp", "2", "--pp", "2",
            "--num-requests", "20", "--input-tokens", "200", "--output-tokens", "20", "--json"]  # fmt: skip
    assert main(argv) == 0
    argv[argv.index("--gpus") + 1] = "6"
    assert main(argv) == 2  # not a whole number of TP2 x PP2 replicas


@pytest.mark.parametrize("overlap", [True, False])
def test_a_pipelined_batch_record_holds_its_own_host_part(overlap: bool) -> None:
    """Batches in flight together each keep their own split: the span less the model's part is the
    first stage's host overhead (the default profile's), never another batch's."""
    d, loop = dep("llama-3.1-70b", tp=4, pp=2), EventLoop()
    config = SimSpec("llama-3.1-70b", "h100", 8, tp=4, pp=2).engine_config()
    replica = sim_replica(0, config, d, loop, lambda seq: None, pp_overlap=overlap)
    for i in range(6):
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        replica.submit(AddRequest(f"r{i}", list(range(1, 200 + 30 * i)), params))
    loop.run(until=10.0)
    assert replica.engine.step_records is not None
    records = replica.engine.step_records.take()
    assert len(records) >= 8
    for r in records:
        assert r.model_s > 0
        assert r.end - r.start - r.model_s == pytest.approx(d.device.step_overhead_s, rel=1e-6)
