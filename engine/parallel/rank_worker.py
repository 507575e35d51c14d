"""A replica's ranks after rank 0 (engine/parallel/distributed.py): each loads the model, keeps its
pipeline stage's layers and its tensor-parallel shard of them, plans its own KV budget, and runs
every step rank 0 sends it down a pipe until None.

A rank of a later stage waits for the previous stage's residual stream, runs its layers and sends
the result on: to the next stage, or from the last stage's TP rank 0 back to rank 0 (the ops
engine/parallel/p2p.py gives it). Rank 0 finds failures (its collectives and its wait for the last stage
time out), so a worker waits for its input as long as it must; rank 0 kills it when the group
fails, and it dies with its parent (on NCCL its own group watchdog may take it down first)."""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Any

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.parallel.collectives import (
    START_TIMEOUT_S,
    AllReduceTimer,
    StageLink,
    join_group,
    rank_device,
    step_from_wire,
    world_size,
)
from engine.parallel.span_timer import SpanTimer
from engine.platform.machine import set_affinity, usable_cores


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that spawned it dies (rank 0 killed)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


def worker_main(config: EngineConfig, rank: int, port: int, conn: Any, cores: list[int] | None, parent: int) -> None:
    """Load the model, keep this rank's part, then run each step rank 0 sends until None."""
    from engine.core.memory import plan_kv_blocks, weight_footprint
    from engine.model.int8_linear import quantize_model
    from engine.model.loader import load_model
    from engine.model.paths import default_gguf_path
    from engine.model.sharding import keep_stage, shard_model
    from engine.platform.torch_dtypes import DTYPES, kv_cache_dtype
    from engine.worker.gpu_memory import TorchCudaProbe, plan_on_card, start_reading
    from engine.worker.runner import ModelRunner

    _die_with_parent()
    if os.getppid() != parent:
        return
    if cores:
        set_affinity(cores)
    tp, pp = config.tensor_parallel, config.pipeline_parallel
    stage, tp_rank = divmod(rank, tp)
    torch.set_num_threads(len(cores) if cores else max(1, usable_cores() // world_size(config)))
    device, dtype = rank_device(config.device, rank), DTYPES[config.dtype]
    card = None
    if device.startswith("cuda"):
        torch.cuda.set_device(device)  # before anything makes a CUDA context (on cuda:0 otherwise)
        probe = TorchCudaProbe(device)
        card = (probe, start_reading(probe))  # what the card held before this rank's weights
    try:
        model = load_model(config.model or str(default_gguf_path()), dtype, device)
        if tp > 1:
            shard_model(model, tp_rank, tp)
        if pp > 1:
            keep_stage(model, stage, pp)
        quantize_model(model, config.quantization, device)
        kv_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype)
        if card is not None:  # this rank's card, as rank 0's (engine/worker/gpu_memory.py), unprofiled
            plan = plan_on_card(config.replace(device=device), model, kv_dtype, *card, profile=False)
        else:
            plan = plan_kv_blocks(config.replace(device=device), model, kv_dtype)
        conn.send(("ready", weight_footprint(model)[0], plan.num_blocks, plan.bytes_per_block))
        groups = join_group(config, rank, port)
        _, num_blocks = conn.recv()
    except Exception as exc:  # noqa: BLE001 - reported to rank 0, which fails the group
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    if tp > 1:
        model.all_reduce = AllReduceTimer(groups.stage, timed=False)
    runner = ModelRunner(model, num_blocks, config.block_size, kv_dtype, device, config.huge_pages)
    last = stage == pp - 1
    link = StageLink(rank, tp, pp, groups.pipe, pp) if pp > 1 else None
    sends = link is not None and link.give is not None  # the last stage's other TP ranks send nothing
    # A later stage's lead tells rank 0 its span on each batch: the device's, read before it goes on.
    timer = SpanTimer(device) if pp > 1 and tp_rank == 0 and stage > 0 else None
    try:
        while True:
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    return
                continue
            msg = conn.recv()
            if msg is None:
                return
            input_ids, positions, attn = step_from_wire(msg[1], device)
            rows = msg[1].get("logit_rows")
            # A later stage waits for its input as long as it takes (rank 0 times the whole trip).
            hidden = None
            if link is not None and stage > 0:
                hidden = link.receive(len(input_ids), model.cfg.hidden_size, model, START_TIMEOUT_S)
            if timer is not None:
                timer.start()
            with torch.inference_mode():
                out = model(input_ids, positions, attn, runner.kv_caches, hidden)
                if sends and last and rows is not None:  # the last stage: the sampled rows' logits
                    out = model.raw_logits(out[torch.tensor(rows, dtype=torch.long, device=out.device)]) if rows else None
            if timer is not None:  # before the batch goes on: rank 0 has it by the time the batch is back
                timer.stop()
                for began, ended in timer.spans(1):  # CUDA: waits for this batch's work
                    conn.send(("step", began, ended))
            if link is not None and sends and out is not None:
                link.send(out)
    except (EOFError, OSError, RuntimeError):
        return  # rank 0 is gone or failed the group; it kills us anyway
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
