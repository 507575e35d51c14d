"""A replica's ranks after rank 0 (engine/distributed.py): each loads the model, keeps its
pipeline stage's layers and its tensor-parallel shard of them, plans its own KV budget, and runs
every step rank 0 sends it down a pipe until None.

A rank of a later stage waits for the previous stage's residual stream, runs its layers and sends
the result on: to the next stage, or from the last stage's TP rank 0 back to rank 0. Rank 0 finds
failures (its collectives and its wait for the last stage time out), so a worker waits for its
input as long as it must; rank 0 kills it when the group fails, and it dies with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

from engine.collectives import (
    START_TIMEOUT_S,
    AllReduceTimer,
    StageSender,
    join_group,
    rank_device,
    receive_rows,
    step_from_wire,
    world_size,
)
from engine.config import EngineConfig
from engine.machine import set_affinity, usable_cores


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
    from engine.memory import plan_kv_blocks, weight_footprint
    from engine.model.int8_linear import quantize_model
    from engine.model.loader import load_model
    from engine.model.paths import default_gguf_path
    from engine.model.sharding import keep_stage, shard_model
    from engine.runner import ModelRunner
    from engine.torch_dtypes import DTYPES, kv_cache_dtype

    _die_with_parent()
    if os.getppid() != parent:
        return
    if cores:
        set_affinity(cores)
    tp, pp = config.tensor_parallel, config.pipeline_parallel
    stage, tp_rank = divmod(rank, tp)
    torch.set_num_threads(len(cores) if cores else max(1, usable_cores() // world_size(config)))
    device, dtype = rank_device(config.device, rank), DTYPES[config.dtype]
    try:
        model = load_model(config.model or str(default_gguf_path()), dtype, device)
        if tp > 1:
            shard_model(model, tp_rank, tp)
        if pp > 1:
            keep_stage(model, stage, pp)
        quantize_model(model, config.quantization, device)
        kv_dtype = kv_cache_dtype(config.kv_cache_dtype, dtype)
        plan = plan_kv_blocks(config, model, kv_dtype)
        conn.send(("ready", weight_footprint(model)[0], plan.num_blocks, plan.bytes_per_block))
        stage_group = join_group(config, rank, port)
        _, num_blocks = conn.recv()
    except Exception as exc:  # noqa: BLE001 - reported to rank 0, which fails the group
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    if tp > 1:
        model.all_reduce = AllReduceTimer(stage_group)
    runner = ModelRunner(model, num_blocks, config.block_size, kv_dtype, device, config.huge_pages)
    last = stage == pp - 1
    # Where this rank's output goes: the next stage's same TP rank, or rank 0 from the last stage's lead.
    dst = None if last and tp_rank != 0 else (0 if last else rank + tp)
    sender = StageSender(dst, pp) if pp > 1 and dst is not None else None
    reports = pp > 1 and tp_rank == 0  # a later stage's lead tells rank 0 its span on each batch
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
            if stage > 0:
                hidden = receive_rows(len(input_ids), model.cfg.hidden_size, model, rank - tp, START_TIMEOUT_S)
            began = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process here
            with torch.inference_mode():
                out = model(input_ids, positions, attn, runner.kv_caches, hidden)
                if sender is not None and last and rows is not None:  # the last stage: the sampled rows' logits
                    out = model.raw_logits(out[torch.tensor(rows, dtype=torch.long, device=out.device)]) if rows else None
            if reports:  # before the batch goes on: rank 0 has it by the time the batch is back
                conn.send(("step", began, time.monotonic()))
            if sender is not None and out is not None:
                sender.send(out)
    except (EOFError, OSError, RuntimeError):
        return  # rank 0 is gone or failed the group; it kills us anyway
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
