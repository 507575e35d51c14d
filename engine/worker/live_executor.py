"""The live executor: load the weights and the tokenizer, keep this rank's part of them (its
tensor-parallel shard, its pipeline stage's layers), plan the KV budget, build the runner, and
say what the engine runs here and why (machine.EnginePlan)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.memory import plan_kv_blocks
from engine.kernels import pick_impl
from engine.model import int8_linear
from engine.model.compile import compile_model
from engine.model.int8_linear import quantize_model
from engine.model.llama import Llama
from engine.model.llama_config import model_config
from engine.model.loader import load_model
from engine.model.paths import default_gguf_path
from engine.model.sharding import check_split, keep_stage, shard_model
from engine.model.tokenizer import load_tokenizer
from engine.parallel.distributed import ShardGroup, world_size
from engine.platform import machine
from engine.platform.threads import ThreadGovernor
from engine.platform.torch_dtypes import DTYPES, kv_cache_dtype
from engine.worker.cuda_graphs import DecodeGraphs
from engine.worker.executor import Executor
from engine.worker.gpu_memory import TorchCudaProbe, plan_on_card, start_reading
from engine.worker.runner import ModelRunner

log = logging.getLogger("servelab.engine")


@dataclass
class LiveParts:
    config: EngineConfig  # with the dtype resolved
    dtype: torch.dtype
    model: Llama  # rank 0's part: its shard of the first stage's layers, the embeddings and the head
    plan: machine.EnginePlan
    shard_group: ShardGroup | None  # the other ranks, when there are any
    executor: Executor


def _make_startup_visible() -> None:
    """The KV budget is printed at start even where the host application set up no logging."""
    root = logging.getLogger("servelab")
    if not root.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("servelab: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def load_live(config: EngineConfig) -> LiveParts:
    _make_startup_visible()
    # dtype "auto" becomes what this machine runs best (engine/platform/machine.py); every rank and
    # every later reader of the config sees the resolved dtype.
    # device "auto" becomes CUDA where torch sees a GPU (cuda:N, N honoured), else the CPU.
    device = machine.resolve_device(config.device, ranks=world_size(config))
    dtype_name, dtype_reason = machine.resolve_dtype(config.dtype, device)
    config = config.replace(dtype=dtype_name, device=device)
    cuda_start = None
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
        probe = TorchCudaProbe(device)
        cuda_start = start_reading(probe)  # before anything of ours is on the card
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    torch.manual_seed(config.seed)
    path = config.model or str(default_gguf_path())
    dtype = DTYPES[config.dtype]
    kv_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype)
    # More than one rank: this process is rank 0 (engine/parallel/distributed.py), the others spawn now and
    # load while it does.
    if world_size(config) > 1:
        check_split(model_config(path), config.tensor_parallel, config.pipeline_parallel)
    group = ShardGroup(config) if world_size(config) > 1 else None
    try:
        model = load_model(path, dtype, config.device)
        num_layers = model.cfg.num_layers
        if config.tensor_parallel > 1:
            shard_model(model, 0, config.tensor_parallel)
        if config.pipeline_parallel > 1:
            keep_stage(model, 0, config.pipeline_parallel)
        quantize_model(model, config.quantization, config.device)
        if group is not None:
            group.connect()
        if cuda_start is not None:
            memory = plan_on_card(config, model, kv_dtype, probe, cuda_start, profile=group is None)
        else:
            memory = plan_kv_blocks(config, model, kv_dtype)
        if group is not None:  # the rank with the least room sets the block count for all
            blocks = group.start(model, num_layers, memory.weight_bytes, memory.num_blocks, memory.bytes_per_block)
            memory = dataclasses.replace(memory, num_blocks=blocks)
    except BaseException:
        if group is not None:
            group.close()
        raise
    tokenizer = load_tokenizer(path)
    graphs = _wants_graphs(config, model, group, kv_dtype == dtype)
    runner = ModelRunner(
        model, memory.num_blocks, config.block_size, kv_dtype, config.device, config.huge_pages, scratch_block=graphs
    )
    if group is not None:
        runner.on_step = group.send_step
        if config.pipeline_parallel > 1:
            runner.stages = group
    model.batch_invariant = config.batch_invariant
    # One rank on the CPU adapts its threads; batch_invariant keeps them fixed (the split-KV
    # count follows the thread count, and with it the order of a long decode's sums).
    if config.adaptive_threads and config.device == "cpu" and group is None and not config.batch_invariant:
        runner.governor = ThreadGovernor(torch.get_num_threads())
    if config.compile and config.batch_invariant:  # Inductor would fuse the split matmuls back
        log.info("compile: skipped (batch_invariant keeps the eager, row-tiled matmuls)")
    elif config.compile and model.attention_impl == "torch":
        log.info("compile: skipped (an fp8 KV cache takes the torch attention path)")
    elif config.compile:
        compile_model(model, runner.kv_caches, config.max_batched_tokens, config.max_num_seqs)
    notes = ["threads adapt to busy neighbours"] if runner.governor is not None else []
    if graphs:
        max_blocks = -(-min(config.max_model_len or model.cfg.max_position, model.cfg.max_position) // config.block_size)
        runner.graphs = DecodeGraphs(
            model, runner.kv_caches, config.max_num_seqs, max_blocks, memory.num_blocks, config.block_size, config.device
        )
        try:
            runner.graphs.capture()
            notes.append(runner.graphs.describe())
        except Exception as exc:  # noqa: BLE001 - served eager, and the plan says why (the device check reads it)
            runner.graphs = None
            notes.append(f"CUDA graphs failed to capture, decoding eager: {type(exc).__name__}: {exc}")
            log.warning("CUDA graphs failed to capture, decoding eager: %s", exc)
    plan = machine.EnginePlan(
        config.device,
        config.dtype,
        dtype_reason,
        # what the model did, not what it could have: it prepacks only where linear_path allowed
        linear_description(model, config),
        machine.attention_path(config.device, pick_impl(model.attention_impl, model.embed) == "cpu")
        + ("" if kv_dtype == dtype else f", KV cache {config.kv_cache_dtype}"),
        model.compiled_forward is not None,
        torch.get_num_threads(),
        machine.cpu().describe() if config.device == "cpu" else machine.describe_cuda(config.device),
        notes,
    )
    log.info("%s on %s: %s. %s", Path(path).name, config.device, plan.summary(), memory.describe())
    executor = Executor(Path(path).name, model.cfg, memory, runner, tokenizer)
    return LiveParts(config, dtype, model, plan, group, executor)


def _wants_graphs(config: EngineConfig, model: Llama, group: ShardGroup | None, kv_in_model_dtype: bool) -> bool:
    """CUDA graphs where a decode step is one process's Triton forward: not across ranks (their
    collectives would have to be captured too), not an fp8 cache (the torch path), not
    batch_invariant (its row-tiled matmuls), not compiled."""
    return (
        config.device.startswith("cuda") and config.cuda_graphs and group is None and not config.batch_invariant
        and kv_in_model_dtype and model.attention_impl != "torch" and not config.compile
    )


def linear_description(model: Llama, config: EngineConfig) -> str:
    """The linears' path as the plan says it: "onednn-prepacked", "torch", "cublas", or the int8
    GEMM's ("int8 onednn-vnni", "int8 onednn-7bit", "int8 int_mm")."""
    if config.quantization == "int8":
        return int8_linear.describe(config.device)
    if model.packed_lm_head is not None:
        return "onednn-prepacked"
    return "cublas" if config.device.startswith("cuda") else "torch"
