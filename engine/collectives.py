"""What a replica's ranks say to each other (engine/distributed.py has the group): a step's
batch on the wire to the other ranks, the all-reduces inside a stage's tensor-parallel group, the
residual stream from stage to stage, and each stage's busy time."""

from __future__ import annotations

import datetime
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.llama import AttentionBatch, Llama, PrefillChunk
from engine.ranks import COLLECTIVE_TIMEOUT_S, START_TIMEOUT_S, STEP_TIMEOUT_S  # noqa: F401 - re-exported: torch-free


def world_size(config: EngineConfig) -> int:
    return config.tensor_parallel * config.pipeline_parallel


def rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


# one step on the wire: numpy arrays pickle as bytes (torch tensors would go through shared memory)


def step_to_wire(
    input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBatch, logit_rows: list[int] | None = None
) -> dict[str, Any]:
    """logit_rows: a pipelined step's rows to sample, whose logits the last stage sends back to
    rank 0 (None: the last stage sends the residual stream of every token back instead)."""
    def a(t: torch.Tensor) -> np.ndarray:
        return t.cpu().numpy()

    return {
        "input_ids": a(input_ids),
        "positions": a(positions),
        "slot_mapping": a(attn.slot_mapping),
        "num_decodes": attn.num_decodes,
        "decode_block_tables": a(attn.decode_block_tables),
        "decode_context_lens": a(attn.decode_context_lens),
        "prefills": [(c.start, c.length, c.num_cached, a(c.block_table)) for c in attn.prefills],
        "varlen": None if attn.seq_lens is None else [a(attn.block_tables), a(attn.seq_lens), a(attn.query_start_loc)],
        "logit_rows": logit_rows,
    }


def step_from_wire(msg: dict[str, Any], device: str) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(device)

    attn = AttentionBatch(
        slot_mapping=t(msg["slot_mapping"]),
        num_decodes=msg["num_decodes"],
        decode_block_tables=t(msg["decode_block_tables"]),
        decode_context_lens=t(msg["decode_context_lens"]),
        prefills=[PrefillChunk(s, n, c, t(table)) for s, n, c, table in msg["prefills"]],
    )
    if msg.get("varlen") is not None:  # the C++ CPU op's metadata (engine/kernels/cpu_attention.py)
        attn.block_tables, attn.seq_lens, attn.query_start_loc = (t(a) for a in msg["varlen"])
    return t(msg["input_ids"]), t(msg["positions"]), attn


# the collectives ------------------------------------------------------------------------------


def join_group(config: EngineConfig, rank: int, port: int, store: Any = None) -> Any:
    """Join the replica's process group; returns this rank's stage's TP group (None: the default
    group is the stage, as without pipeline stages)."""
    world, tp = world_size(config), config.tensor_parallel
    # The guard off is the guard absent: no timeout argument, so torch's own default applies.
    timeout = {"timeout": datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)} if config.collective_timeout else {}
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    backend = "nccl" if config.device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **timeout)
    if config.pipeline_parallel == 1 or tp == 1:
        return None
    # new_group is collective: every rank makes every stage's group, in the same order.
    groups = [dist.new_group(list(range(s * tp, (s + 1) * tp)), **timeout) for s in range(config.pipeline_parallel)]
    return groups[rank // tp]


class AllReduceTimer:
    """The model's all-reduce hook: sums a row-parallel layer's partial outputs across the stage's
    TP ranks, timing each (wall time, which includes waiting for the slowest rank; on CUDA only
    the launch)."""

    def __init__(self, group: Any = None, on_error: Callable[[Exception], None] | None = None) -> None:
        self.group = group
        self.on_error = on_error
        self.step_s = 0.0
        self.step_count = 0
        self.recent_ms: deque[float] = deque(maxlen=50)  # per step, the latest steps
        self.count_per_step = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        try:
            dist.all_reduce(x, group=self.group)
        except Exception as exc:
            if self.on_error is None:
                raise
            self.on_error(exc)
        self.step_s += time.perf_counter() - start
        self.step_count += 1
        return x

    def end_step(self) -> None:
        if self.step_count:
            self.recent_ms.append(self.step_s * 1e3)
            self.count_per_step = self.step_count
        self.step_s, self.step_count = 0.0, 0

    @property
    def ms_per_step(self) -> float:
        return sum(self.recent_ms) / len(self.recent_ms) if self.recent_ms else 0.0


class StageSender:
    """Point-to-point sends of the residual stream to one rank, each kept alive until done; at
    most `depth` outstanding (a later stage that has not taken the oldest holds the sender up)."""

    def __init__(self, dst: int, depth: int) -> None:
        self.dst, self.depth = dst, depth
        self.pending: deque[tuple[Any, torch.Tensor]] = deque()

    def send(self, hidden: torch.Tensor) -> None:
        while len(self.pending) >= self.depth:
            self.pending.popleft()[0].wait()
        hidden = hidden.contiguous()
        self.pending.append((dist.isend(hidden, self.dst), hidden))


def receive_rows(num_rows: int, width: int, like: Llama, src: int, timeout_s: float | None) -> torch.Tensor:
    """[num_rows, width] rows in the model's dtype from rank src: the residual stream (width: the
    hidden size) or the last stage's logits (width: the vocabulary); None: the group's own timeout."""
    buf = torch.empty(num_rows, width, dtype=like.embed.dtype, device=like.embed.device)
    work = dist.irecv(buf, src)
    if timeout_s is None:
        work.wait()
    else:
        work.wait(datetime.timedelta(seconds=timeout_s))
    return buf
