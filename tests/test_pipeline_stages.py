"""Pipeline stages without a model: the layer split (vLLM's, shared with the simulator), what a
stage keeps, the per-stage busy clock, and the live limits and replica bounds of a TP x PP replica."""

from __future__ import annotations

import pytest
import torch

from engine.errors import InvalidParamError
from engine.lab.live_limits import check_live
from engine.lab.replica_bounds import replica_bounds
from engine.levers import LEVERS
from engine.model.llama import Llama, LlamaConfig
from engine.model.partition import stage_range
from engine.model.sharding import check_split, keep_stage, shard_model
from engine.parallel.stage_clock import StageClock

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}
CFG = LlamaConfig(100, 64, 96, 30, num_heads=9, num_kv_heads=3, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                  max_position=32, tie_word_embeddings=True)  # fmt: skip


def test_stages_keep_contiguous_layers_and_only_the_first_embeds() -> None:
    assert [stage_range(30, s, 4) for s in range(4)] == [(0, 7), (7, 15), (15, 23), (23, 30)]
    stages = []
    for stage in range(2):
        with torch.device("meta"):
            model = Llama(CFG)
        first_layer = model.layers[15]
        stages.append((keep_stage(model, stage, 2), first_layer))
    (first, _), (second, layer15) = stages
    assert first.cfg.num_layers == second.cfg.num_layers == 15
    assert second.layers[0] is layer15  # the second stage starts at layer 15
    assert first.embed.shape == (100, 64) and first.lm_head is first.embed  # the first embeds
    assert second.lm_head.shape == (100, 64)  # the last computes the logits (tied: the embeddings)
    with torch.device("meta"):
        middle = keep_stage(Llama(CFG), 1, 3)
    assert middle.cfg.num_layers == 10 and middle.embed.numel() == 0 and middle.lm_head.numel() == 0
    assert CFG.num_layers == 30  # the config is replaced, not changed


def test_a_stage_of_two_tensor_parallel_ranks_keeps_its_shard_of_its_layers() -> None:
    with torch.device("meta"):
        model = keep_stage(shard_model(Llama(CFG), 1, 2), 1, 2)
    assert (model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.intermediate_size) == (15, 1, 48)


def test_impossible_splits_name_their_lever() -> None:
    with pytest.raises(InvalidParamError, match="pipeline_parallel.*30 layers"):
        check_split(CFG, 1, 31)
    with pytest.raises(InvalidParamError, match="tensor_parallel"):
        check_split(CFG, 4, 1)
    check_split(CFG, 3, 30)


def test_the_stage_clock_reads_busy_time_per_step_and_the_idle_share() -> None:
    clock = StageClock()
    clock.record(100.0, 100.0)
    for k in range(10):  # a quarter of a second busy over ten steps in one second
        clock.record(100.075 + k * 0.1, 100.1 + k * 0.1)
    assert clock.busy_ms_per_step() == pytest.approx(25.0)
    assert clock.idle_share(101.0) == pytest.approx(0.75)
    assert clock.idle_share(102.0) == pytest.approx(0.875)  # nothing reported since: idle
    for t in range(102, 120):  # then half of each second busy, over ten steps
        for k in range(10):
            clock.record(t - 1 + k * 0.1 + 0.05, t - 1 + (k + 1) * 0.1)
    assert clock.idle_share(119.0) == pytest.approx(0.5)  # the old quiet second has left the window


def test_a_live_replica_takes_tp_times_pp_cores() -> None:
    levers = DEFAULTS | {"gpu_count": 2, "tensor_parallel": 1, "pipeline_parallel": 2, "min_replicas": 1}
    check_live({"pipeline_parallel": 2}, levers, devices=2)
    with pytest.raises(InvalidParamError, match="pipeline_parallel.*need 4 devices"):
        check_live({"pipeline_parallel": 2}, levers | {"tensor_parallel": 2}, devices=2)
    with pytest.raises(InvalidParamError, match="gpu_count.*tensor_parallel x pipeline_parallel"):
        check_live({"gpu_count": 3}, levers | {"gpu_count": 3}, devices=4)
    with pytest.raises(InvalidParamError, match="at most 4"):
        check_live({"pipeline_parallel": 8}, levers | {"pipeline_parallel": 8}, devices=64)
    assert replica_bounds(levers | {"gpu_count": 8, "max_replicas": 8}, warm_pool_holds_devices=True) == (1, 4)


def test_the_simulated_lab_runs_pipeline_stages_and_streams_their_bubble() -> None:
    from engine.lab.simulated.lab_sim import SimLab

    levers = DEFAULTS | {
        "executor": "sim", "model": "llama-3.1-70b", "device": "h100", "gpu_count": 8, "tensor_parallel": 4,
        "pipeline_parallel": 2, "request_rate": 20.0, "max_num_seqs": 128, "prompt_tokens": 200,
        "output_tokens": 100, "max_batched_tokens": 8192, "queue_cap": 1000,
    }  # fmt: skip
    lab = SimLab(levers, lambda snap: None)
    assert lab.spec.tp == 4 and lab.spec.pp == 2 and lab.spec.pp_overlap
    lab.start_traffic()
    lab.loop.run(until=lab.clock.now() + 10.0)
    snap = lab._latest
    assert snap is not None and snap.tokens_per_s > 0
    assert len(snap.stage_idle) == 2 and all(0 <= share < 1 for share in snap.stage_idle)
    assert "stage_idle" in snap.to_json()
    one_at_a_time = SimLab(levers | {"pipeline_overlap": False}, lambda snap: None)
    one_at_a_time.start_traffic()
    one_at_a_time.loop.run(until=one_at_a_time.clock.now() + 10.0)
    alone = one_at_a_time._latest
    assert alone is not None and min(alone.stage_idle) > max(snap.stage_idle)  # the bubble
