"""What a replica's ranks say to each other (engine/parallel/distributed.py has the group): a step's
batch on the wire to the other ranks, the process groups, the all-reduces inside a stage's
tensor-parallel group, and the point-to-point wire between stages (engine/parallel/p2p.py's programme)."""

from __future__ import annotations

import datetime
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.llama import AttentionBatch, Llama, PrefillChunk
from engine.parallel.p2p import P2P, Direction, group_ranks, returned, stage_input, stage_output
from engine.parallel.ranks import (  # noqa: F401 - re-exported: torch-free
    COLLECTIVE_TIMEOUT_S,
    START_TIMEOUT_S,
    STEP_TIMEOUT_S,
    nccl_environment,
)
from engine.parallel.span_timer import SpanTimer


def world_size(config: EngineConfig) -> int:
    return config.tensor_parallel * config.pipeline_parallel


def rank_device(device: str, rank: int) -> str:
    """A rank's device: the ranks take consecutive GPUs from the configured one ("cuda" is cuda:0),
    so with "cuda:2" rank 0 is on cuda:2 and rank 1 on cuda:3; off CUDA they share the device."""
    if not device.startswith("cuda"):
        return device
    index = device.partition(":")[2]
    return f"cuda:{int(index or 0) + rank}"


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


# the process groups ---------------------------------------------------------------------------


@dataclass
class RankGroups:
    """The process groups one rank works in, besides the default group."""

    stage: Any = None  # its stage's TP group (None: the default group is the stage, or no TP)
    pipe: dict[Direction, Any] = field(default_factory=dict)  # each pipeline direction's, where it is a member


def join_group(config: EngineConfig, rank: int, port: int, store: Any = None) -> RankGroups:
    """Join the replica's process group and make the stage and pipeline groups (new_group is
    collective: every rank makes every group, in the same order)."""
    world, tp, pp = world_size(config), config.tensor_parallel, config.pipeline_parallel
    # The guard off is the guard absent: no timeout argument, so torch's own default applies.
    timeout = {"timeout": datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)} if config.collective_timeout else {}
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    device = rank_device(config.device, rank)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":
        os.environ.update(nccl_environment(config))  # read as each ProcessGroupNCCL is made
        torch.cuda.set_device(device)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **timeout)
    groups = RankGroups()
    if pp > 1 and tp > 1:
        stages = [dist.new_group(list(range(s * tp, (s + 1) * tp)), **timeout) for s in range(pp)]
        groups.stage = stages[rank // tp]
    if pp > 1:
        for direction, ranks in group_ranks(tp, pp).items():
            group = dist.new_group(ranks, **timeout)
            if rank in ranks:
                # A collective first, with every member: NCCL then lets a pair alone use the group
                # (batch_isend_irecv's rule), and its communicator forms now, not in a step.
                dist.all_reduce(torch.zeros(1, device=device), group=group)
                groups.pipe[direction] = group
    return groups


class AllReduceTimer:
    """The model's all-reduce hook: sums a row-parallel layer's partial outputs across the stage's
    TP ranks, timing each (which includes waiting for the slowest rank): CUDA events read at the
    step's end on CUDA, where the call only queues it (engine/parallel/span_timer.py). timed=False: no
    timing (a worker, whose times nobody reads)."""

    def __init__(
        self,
        group: Any = None,
        on_error: Callable[[Exception], None] | None = None,
        device: str = "cpu",
        timed: bool = True,
    ) -> None:
        self.group = group
        self.on_error = on_error
        self.spans = SpanTimer(device, limit=100_000) if timed else None
        self.step_count = 0
        self.recent_ms: deque[float] = deque(maxlen=50)  # per step, the latest steps
        self.count_per_step = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.spans is not None:
            self.spans.start()
        try:
            dist.all_reduce(x, group=self.group)
        except Exception as exc:  # gloo's timeout and a peer's reset; NCCL's fail in its watchdog
            if self.on_error is None:
                raise
            self.on_error(exc)
        if self.spans is not None:
            self.spans.stop()
        self.step_count += 1
        return x

    def end_step(self) -> None:
        """The step before is over (rank 0 sampled it): its all-reduce time."""
        spent_s = sum(self.spans.durations_s()) if self.spans is not None else 0.0
        if self.step_count:
            self.recent_ms.append(spent_s * 1e3)
            self.count_per_step = self.step_count
        self.step_count = 0

    @property
    def ms_per_step(self) -> float:
        return sum(self.recent_ms) / len(self.recent_ms) if self.recent_ms else 0.0


class StageLink:
    """One rank's end of the wire between pipeline stages: the ops engine/parallel/p2p.py gives it, each
    posted alone with batch_isend_irecv on its direction's group (so on that group's communicator,
    never on one per rank pair that both directions would share). take brings its input (rank 0:
    what the last stage sends back), give sends its output on; sends stay alive until done, at
    most `depth` outstanding (a later stage that has not taken the oldest holds this one up)."""

    def __init__(self, rank: int, tp: int, pp: int, groups: dict[Direction, Any], depth: int) -> None:
        self.take: P2P | None = returned(tp, pp) if rank == 0 else stage_input(rank, tp, pp)
        self.give: P2P | None = stage_output(rank, tp, pp)
        self.groups, self.depth = groups, depth
        self.pending: deque[tuple[Any, torch.Tensor]] = deque()

    def send(self, out: torch.Tensor) -> None:
        assert self.give is not None
        while len(self.pending) >= self.depth:
            self.pending.popleft()[0].wait()
        out = out.contiguous()
        self.pending.append((self._post(self.give, out), out))

    def receive(self, num_rows: int, width: int, like: Llama, timeout_s: float | None) -> torch.Tensor:
        """[num_rows, width] rows in the model's dtype: the residual stream (width: the hidden
        size) or the last stage's logits (width: the vocabulary). timeout_s None: the group's own.
        On CUDA the wait only orders the stream (NCCL's watchdog times it, see nccl_environment):
        a timed host wait would poll the host on every batch."""
        assert self.take is not None
        buf = torch.empty(num_rows, width, dtype=like.embed.dtype, device=like.embed.device)
        work = self._post(self.take, buf)
        if timeout_s is None or buf.is_cuda:
            work.wait()
        else:
            work.wait(datetime.timedelta(seconds=timeout_s))
        return buf

    def _post(self, op: P2P, tensor: torch.Tensor) -> Any:
        fn = dist.isend if op.kind == "send" else dist.irecv
        return dist.batch_isend_irecv([dist.P2POp(fn, tensor, op.peer, self.groups[op.group])])[0]
