"""The what-if cost model and memory plan against hand arithmetic, and the seam's identity: a
simulated engine runs the engine's own Scheduler and BlockManager classes."""

from __future__ import annotations

import pytest

from engine.clock import VirtualClock
from engine.config import EngineConfig
from engine.core.block_manager import BlockManager
from engine.core.llm_engine import LLMEngine
from engine.core.scheduler import Scheduler
from engine.sim import constants as C
from engine.sim.cost_model import CostModel, StepShape
from engine.sim.deployment import Deployment, SimConfigError
from engine.sim.devices import get_device
from engine.sim.models import get_model
from engine.sim.runner import CostModelRunner, sim_executor

pytestmark = pytest.mark.unit

H100_BW = 3.35e12 * C.BW_EFFICIENCY  # achieved bytes/s
H100_BF16 = 989e12 * C.GEMM_EFFICIENCY  # achieved FLOP/s


def deployment(model: str, device: str = "h100", tp: int = 1, dtype: str = "bf16", kv: str = "bf16") -> Deployment:
    return Deployment(get_model(model), get_device(device), tp, dtype, kv)


def test_model_shapes_match_published_parameter_counts():
    assert get_model("llama-3.1-8b").num_params == pytest.approx(8.03e9, rel=0.002)
    assert get_model("LLAMA-3.1-70B").num_params == pytest.approx(70.6e9, rel=0.002)
    assert get_model("llama-3.1-405b").num_params == pytest.approx(405.8e9, rel=0.002)
    assert get_model("llama-3.1-405b").cfg.kv_bytes_per_token * 2 == 516_096
    smol = get_model("smollm2-135m")  # read from the GGUF the live engine loads
    assert (smol.cfg.num_layers, smol.cfg.hidden_size, smol.cfg.num_kv_heads) == (30, 576, 3)


def test_70b_decode_at_batch_1_on_8_h100_is_weights_over_bandwidth_plus_160_allreduces():
    cost = CostModel(deployment("llama-3.1-70b", tp=8)).step(StepShape(1, 1, 1, 1000, 0.0, 0))
    # Weights read once per step: every linear weight and the LM head (not the embedding table,
    # which a step only gathers rows of), bf16, an eighth on each GPU.
    linear = 80 * (8192 * (8192 + 2 * 1024) + 8192 * 8192 + 3 * 8192 * 28672)
    head = 128256 * 8192
    weights_s = (linear + head) * 2 / 8 / H100_BW
    assert cost.gemm_s == pytest.approx(weights_s, rel=1e-9)
    assert weights_s == pytest.approx(6.49e-3, rel=0.01)  # 139 GB / 8 at 80% of 3.35 TB/s
    # 2 all-reduces per layer x 80 layers, each a latency plus one token's activations on the ring.
    ring_bytes = 2 * 7 / 8 * 8192 * 2
    allreduce_s = 160 * (C.ALLREDUCE_LATENCY_S + ring_bytes / (450e9 * C.LINK_EFFICIENCY))
    assert cost.allreduce_s == pytest.approx(allreduce_s, rel=1e-9)
    fixed = C.STEP_OVERHEAD_S + 80 * C.KERNELS_PER_LAYER * C.KERNEL_LAUNCH_S + C.SAMPLE_OVERHEAD_S
    # The rest (1001 tokens of this GPU's KV heads, 128k float32 logits) is small.
    assert cost.total_s == pytest.approx(weights_s + allreduce_s + fixed, rel=0.02)


def test_2048_token_prefill_on_one_h100_is_flops_over_achieved_compute():
    cost = CostModel(deployment("llama-3.1-8b")).step(StepShape(2048, 1, 0, 0, 2048 * (0 + 2049 / 2), 0))
    linear = 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336)
    gemm_flops = 2 * 2048 * linear + 2 * 1 * 128256 * 4096
    assert cost.gemm_s == pytest.approx(gemm_flops / H100_BF16, rel=1e-9)  # compute-bound, not weight-bound
    assert cost.gemm_s > 8.03e9 * 2 / H100_BW
    # Causal attention: each query attends to itself and the tokens before it, QK^T and PV.
    attn_flops = 4 * 32 * 128 * 32 * (2048 * 2049 / 2)
    assert cost.attention_s == pytest.approx(attn_flops / (989e12 * C.ATTENTION_EFFICIENCY), rel=1e-9)
    # Norms, RoPE and SwiGLU stream each token's activations: 4h + 2(q + kv) + 3f elements a layer.
    elementwise = 2048 * 32 * (4 * 4096 + 2 * (4096 + 1024) + 3 * 14336) * 2 / H100_BW
    assert cost.elementwise_s == pytest.approx(elementwise, rel=1e-9)
    assert cost.total_s == pytest.approx((gemm_flops + attn_flops) / H100_BF16 + elementwise, rel=0.06)


def test_kv_blocks_per_gpu_for_70b_tp8_bf16_come_from_the_memory_plan():
    config = EngineConfig(max_num_seqs=256, max_batched_tokens=8192)
    plan = deployment("llama-3.1-70b", tp=8).plan_memory(config)
    weights = 70_552_387_584 * 2 // 8  # every weight, bf16, one eighth each
    # bf16 activations of the widest layer for 8192 tokens (this GPU's heads and FFN share),
    # plus float32 logits twice over for 256 rows: engine/core/memory.py's formula.
    activations = 8192 * 2 * (3 * 8192 + (8 + 2 * 1) * 128 + 3 * 3584) + 2 * 256 * 128256 * 4
    reserve = 3.5 * 2**30 + 392 * 2**20
    budget = 0.90 * (80 * 2**30 - weights - activations - reserve)
    block_bytes = 16 * 2 * 80 * 1 * 128 * 2  # 16 tokens x K,V x 80 layers x 1 KV head per GPU x 128 x bf16
    assert plan.bytes_per_block == block_bytes == 655_360
    assert plan.num_blocks == int(budget) // block_bytes
    assert 80_000 < plan.num_blocks < 90_000  # ~1.37M tokens of KV per TP8 replica


def test_configurations_that_cannot_run_say_why():
    with pytest.raises(SimConfigError, match="812 GB of weights; 8 x h100 hold 640 GB.*use fp8"):
        deployment("llama-3.1-405b", tp=8)
    deployment("llama-3.1-405b", tp=8, dtype="fp8")  # fits
    with pytest.raises(SimConfigError, match="must divide.*8 KV heads"):
        deployment("llama-3.1-70b", tp=3)
    with pytest.raises(SimConfigError, match="only b200"):
        deployment("llama-3.1-8b", dtype="fp4")
    deployment("llama-3.1-8b", "b200", dtype="fp4")
    with pytest.raises(KeyError, match="known models: smollm2-135m"):
        get_model("gpt-5")
    with pytest.raises(KeyError, match="known devices: h100"):
        get_device("tpu")


def test_a_simulated_engine_runs_the_engines_own_scheduler_and_block_manager():
    config = EngineConfig(max_num_seqs=4, max_batched_tokens=64)
    engine = LLMEngine(config, VirtualClock(), sim_executor(deployment("llama-3.1-8b"), config))
    assert type(engine.scheduler) is Scheduler
    assert type(engine.kv) is BlockManager
    assert isinstance(engine.runner, CostModelRunner)
    assert engine.model is None and engine.tokenizer is None  # no weights, no tokenizer


def test_the_cpu_device_is_the_calibration_in_use():
    from engine.sim import calibration

    found = calibration.load()  # this machine's where `make calibrate` ran here, else the reference
    assert found is not None
    fit = found.data
    cpu = get_device("CPU")
    assert cpu.peak_flops["bf16"] == fit["device"]["flops"] and cpu.mem_bw == fit["device"]["mem_bw"]
    assert {"date", "command", "median_abs_error"} <= set(fit)
    # SmolLM2 on this machine: the live engine's own KV plan (2 GB cap, float32 activations).
    plan = Deployment(get_model("smollm2-135m"), cpu).plan_memory(EngineConfig(max_num_seqs=64, max_batched_tokens=512))
    assert plan.num_blocks > 1000


def test_a_cpu_gemm_pays_for_its_weights_and_its_math_where_a_gpu_overlaps_them():
    import dataclasses

    gpu = get_device("h100")
    cpu_like = dataclasses.replace(gpu, gemm_overlaps_memory=False)
    shape = StepShape(32, 1, 0, 0, 32 * 33 / 2, 0)  # a short prompt: both terms of a size
    overlapped = CostModel(Deployment(get_model("llama-3.1-8b"), gpu)).step(shape).gemm_s
    added = CostModel(Deployment(get_model("llama-3.1-8b"), cpu_like)).step(shape).gemm_s
    model = CostModel(Deployment(get_model("llama-3.1-8b"), gpu))
    compute = 2 * (32 * model.linear_params + model.head_params) / model.gemm_flops
    weights = model.weight_read_bytes / model.bandwidth
    assert overlapped == pytest.approx(max(compute, weights), rel=1e-9)
    assert added == pytest.approx(compute + weights, rel=1e-9)
    # The calibration says which this machine is (bench/calibrate.py fits the CPU additive).
    from engine.sim import calibration

    found = calibration.load()
    assert found is not None
    assert get_device("cpu").gemm_overlaps_memory == found.data["device"].get("gemm_overlaps_memory", True)


def test_nvfp4_gemms_run_at_their_own_measured_share_of_the_fp4_peak():
    b200 = get_device("b200")
    assert b200.gemm_flops("fp4") == pytest.approx(9000e12 * C.FP4_GEMM_EFFICIENCY, rel=1e-12)
    assert b200.gemm_flops("fp8") == pytest.approx(4500e12 * C.GEMM_EFFICIENCY, rel=1e-12)
    assert b200.gemm_flops("bf16") == pytest.approx(2250e12 * C.GEMM_EFFICIENCY, rel=1e-12)
    # A compute-bound step (an 8,192-token prefill of 70B on one B200): fp4's GEMMs are not twice
    # as fast as fp8's, only 2 x 0.38 / 0.62 = 1.23x.
    shape = StepShape(8192, 1, 0, 0, 8192 * (0 + 8193 / 2), 0)
    fp4 = CostModel(deployment("llama-3.1-70b", "b200", dtype="fp4", kv="fp8")).step(shape).gemm_s
    fp8 = CostModel(deployment("llama-3.1-70b", "b200", dtype="fp8", kv="fp8")).step(shape).gemm_s
    assert fp8 / fp4 == pytest.approx(2 * C.FP4_GEMM_EFFICIENCY / C.GEMM_EFFICIENCY, rel=0.01)


@pytest.mark.parametrize(("device", "faster"), [("h100", True), ("h200", True), ("b200", True), ("a100", False), ("l4", False)])
def test_prefill_attention_over_an_fp8_cache_runs_in_fp8_on_hopper_and_blackwell(device: str, faster: bool):
    # A 4,096-token prompt's chunk: its attention is compute (query-key pairs), not KV bytes.
    shape = StepShape(4096, 1, 0, 0, 4096 * (0 + 4097 / 2), 0)
    bf16 = CostModel(deployment("llama-3.1-8b", device, kv="bf16")).step(shape).attention_s
    fp8 = CostModel(deployment("llama-3.1-8b", device, kv="fp8")).step(shape).attention_s
    ratio = C.FP8_ATTENTION_SPEEDUP if faster else 1.0
    assert bf16 / fp8 == pytest.approx(ratio, rel=0.02)
