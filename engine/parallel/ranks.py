"""What is known of a replica's ranks without torch: how long their collectives and steps may
take, and the sharding stats every engine reports (its ShardGroup's, or one rank's). A live
replica's front process, the live lab's rank switches and the simulator's engines read these;
engine/parallel/collectives.py and engine/parallel/distributed.py (which need torch) re-export them."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config import EngineConfig

COLLECTIVE_TIMEOUT_S = 10.0  # a collective waiting longer than this fails the group
STEP_TIMEOUT_S = 14.0  # the front process's watchdog on one step of a sharded replica
START_TIMEOUT_S = 300.0
NCCL_WATCHDOG_POLL_S = 0.1  # ProcessGroupNCCL's watchdog looks at its queued work this often
NCCL_DUMP_WAIT_MS = 250  # its wait for a debug dump; it sleeps 4x this before it acts on a timeout


def nccl_environment(config: EngineConfig) -> dict[str, str]:
    """The TORCH_NCCL_* settings every rank sets before its process groups are made (each
    ProcessGroupNCCL reads them as it is made), so that a hung or dead rank fails the whole
    replica within the collective timeout by NCCL's own watchdog. Nothing off CUDA, nor with the
    defence collective_timeout off: torch's defaults then, as with no ServeLab timeout at all.

    NCCL calls return at once (the GPU waits, not the host), so no try/except sees a hang. Each
    group's watchdog thread polls its queued work; once an op has run past the group's timeout
    (COLLECTIVE_TIMEOUT_S, join_group) or NCCL reports an error, it sleeps 4 x the dump wait and:
      ASYNC_ERROR_HANDLING=3     (SkipCleanUp, torch's default, made sure of) logs the op and
                                 rethrows on its own thread without ncclCommAbort (the process is
                                 going, and an abort can itself hang): std::terminate, SIGABRT.
                                 Rank 0 is the replica's process, so the front process sees it
                                 die ("replica N died (exit code -6)": failed, not permanent, so
                                 it is replaced); the workers die with it (PR_SET_PDEATHSIG), and
                                 a worker's own watchdog takes it down the same way.
      BLOCKING_WAIT=0            keeps that watchdog: with 1 torch starts none, and only a host
                                 wait() times out (a hung kernel behind .cpu() never would), each
                                 wait busy-polling the host (every all-reduce).
      RETHROW_CUDA_ERRORS=1      the watchdog rethrows (0 swallows the timeout and hangs).
      DUMP_ON_TIMEOUT=0          no flight-recorder dump to disk on the way down.
      WAIT_TIMEOUT_DUMP_MILSEC   15 s by default, a minute past the timeout; NCCL_DUMP_WAIT_MS
                                 puts the teardown well before the front's STEP_TIMEOUT_S.
    (Read from torch's ProcessGroupNCCL.cpp: the constructor, Watchdog::runLoop and ::run,
    HeartbeatMonitor's constructor; and WorkNCCL::wait, the host-side wait with a timeout.)"""
    if not config.collective_timeout or not config.device.startswith("cuda"):
        return {}
    return {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_BLOCKING_WAIT": "0",
        "TORCH_NCCL_RETHROW_CUDA_ERRORS": "1",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
        "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": str(NCCL_DUMP_WAIT_MS),
    }


@dataclass
class ShardStats:
    """A replica's sharding facts, the same fields for one rank (engine/parallel/distributed.py's
    ShardGroup reports them for several): ranks a stage and what each of the first stage's holds,
    every rank's pid (rank 0 first), rank 0's all-reduce time (mean of the latest steps) and count
    (2 per layer of its stage); with pipeline stages, per stage: its layers, weights (its TP ranks
    together), one KV block's bytes there, busy time a step and idle share (the bubble, over the
    latest STAGE_WINDOW_S)."""

    tensor_parallel: int = 1
    tp_rank_weight_bytes: list[int] = field(default_factory=list)
    tp_rank_pids: list[int] = field(default_factory=list)
    rank_pids: list[int] = field(default_factory=list)
    allreduce_ms_per_step: float = 0.0
    allreduces_per_step: int = 0
    pipeline_parallel: int = 1
    pp_stage_layers: list[int] = field(default_factory=list)
    pp_stage_weight_bytes: list[int] = field(default_factory=list)
    pp_stage_kv_block_bytes: list[int] = field(default_factory=list)
    pp_stage_busy_ms_per_step: list[float] = field(default_factory=list)
    pp_stage_idle_share: list[float] = field(default_factory=list)


def tp_stats(group: Any, weight_bytes: int, block_bytes: int) -> ShardStats:
    """The sharding facts engine.stats() reports. group: the replica's ShardGroup
    (engine/parallel/distributed.py, whose stats() these are), None for one rank."""
    if group is not None:
        return group.stats()
    pid = os.getpid()
    return ShardStats(
        tp_rank_weight_bytes=[weight_bytes],
        tp_rank_pids=[pid],
        rank_pids=[pid],
        pp_stage_weight_bytes=[weight_bytes],
        pp_stage_kv_block_bytes=[block_bytes],
    )
