"""What is known of a replica's ranks without torch: how long their collectives and steps may
take, and the sharding stats every engine reports (its ShardGroup's, or one rank's). A live
replica's front process, the live lab's rank switches and the simulator's engines read these;
engine/parallel/collectives.py and engine/parallel/distributed.py (which need torch) re-export them."""

from __future__ import annotations

import os
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


def pp_stats(weight_bytes: int, block_bytes: int) -> dict[str, Any]:
    """The pipeline facts of one stage (no pipeline): the keys a pipelined replica reports."""
    return {
        "pipeline_parallel": 1,
        "pp_stage_layers": [],
        "pp_stage_weight_bytes": [weight_bytes],
        "pp_stage_kv_block_bytes": [block_bytes],
        "pp_stage_busy_ms_per_step": [],
        "pp_stage_idle_share": [],
    }


def tp_stats(group: Any, weight_bytes: int, block_bytes: int) -> dict[str, Any]:
    """The sharding facts engine.stats() reports, the same keys for one rank:
    tensor_parallel (ranks a stage), tp_rank_weight_bytes (weights each rank of the first stage
    holds, rank 0 first), tp_rank_pids, rank_pids (every rank's, rank 0 first), allreduce_ms_per_step (rank 0's wall time in all-reduces,
    mean of the latest steps), allreduces_per_step (2 per layer of the stage); and with pipeline
    stages, pipeline_parallel and per stage: pp_stage_layers, pp_stage_weight_bytes (its TP ranks
    together), pp_stage_kv_block_bytes (one KV block's bytes there), pp_stage_busy_ms_per_step and pp_stage_idle_share (the bubble, over the latest
    STAGE_WINDOW_S). group: the replica's ShardGroup (engine/parallel/distributed.py, whose stats() these
    are), None for one rank."""
    if group is not None:
        return group.stats()
    return {
        "tensor_parallel": 1,
        "tp_rank_weight_bytes": [weight_bytes],
        "tp_rank_pids": [os.getpid()],
        "rank_pids": [os.getpid()],
        "allreduce_ms_per_step": 0.0,
        "allreduces_per_step": 0,
    } | pp_stats(weight_bytes, block_bytes)
