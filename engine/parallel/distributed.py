"""One replica's model across processes (ranks): tensor parallelism inside a pipeline stage,
pipeline parallelism across stages. A replica is tensor_parallel x pipeline_parallel ranks; rank
r is TP rank r % tp of stage r // tp.

Rank 0 is the engine's own process: it runs the scheduler, the block manager and the sampler, and
it is TP rank 0 of the first stage. The other ranks are spawned here (engine/parallel/rank_worker.py); each
loads the model, keeps its stage's layers (engine/model/sharding.py keep_stage) and its TP shard of
them, and its own KV cache for those layers (the same block ids), and runs every step rank 0 sends
it down a pipe. Process groups (gloo on CPU, NCCL on CUDA; rank r on GPU base + r) carry the rest:

  inside a stage   all-reduces over the stage's TP group (o and down are row-parallel: 2 a layer)
  stage to stage   the residual stream, point-to-point on the "forward" group: TP rank t of stage
                   s sends it to TP rank t of stage s + 1
  back to rank 0   on the "back" group: the last stage's TP rank 0 computes the logits of the
                   rows to sample (the final norm and the LM head, as vLLM's last stage does) and
                   sends them to rank 0, which samples (the residual stream of every token, where
                   a step's prompt logprobs need them all)

Each point-to-point op is a batch_isend_irecv on its direction's group, in the order
engine/parallel/p2p.py's programme gives: one communicator a direction is what keeps NCCL's rendezvous
sends from deadlocking with batches in flight both ways (the reason is there, and a simulator
that shows it in tests/test_p2p_programme.py).

Heads split by KV group, as evenly as they go, so tp may be at most the number of KV heads; the
layers split as vLLM splits them, so pp may be at most the number of layers. Every rank plans its
own KV budget; the tightest sets the block count for all.

Overlap (engine/pipelined_steps.py): rank 0 hands a batch to the second stage and forms the next
batch while it is there, up to pipeline_parallel batches in flight (vLLM's virtual engines).

A rank that stops answering fails the whole group: every collective and every wait for the last
stage has COLLECTIVE_TIMEOUT_S. On gloo the call raises: rank 0 kills every worker (SIGKILL works on
a stopped process too) and raises ShardGroupError; workers die with their parent (PR_SET_PDEATHSIG)
and leave on a broken pipe. On NCCL a call only queues work, so nothing raises: each process
group's watchdog takes its process down (engine/parallel/ranks.py nccl_environment says how, and how the
front process sees it), and with it the workers. With the defence lever `collective_timeout` off
(EngineConfig), ServeLab sets no timeout of its own: the group gets torch's built-in default (gloo
cannot wait forever, but its default is half an hour; NCCL's is 10 minutes), and the replica arms no
step watchdog (engine/serving/replicas/replica.py), so a stopped rank leaves rank 0 waiting while
its heartbeats still say it is alive.

Times come from the device (engine/parallel/span_timer.py): CUDA events on CUDA, the clock on the CPU.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.model.llama import AttentionBatch, Llama
from engine.model.partition import split_evenly, stage_layers
from engine.parallel.collectives import (
    COLLECTIVE_TIMEOUT_S,
    START_TIMEOUT_S,
    AllReduceTimer,
    StageLink,
    join_group,
    step_to_wire,
    world_size,
)
from engine.parallel.p2p import Direction
from engine.parallel.ranks import ShardStats
from engine.parallel.span_timer import SpanTimer
from engine.parallel.stage_clock import StageClock
from engine.platform.machine import affinity, set_affinity


class ShardGroupError(RuntimeError):
    """The replica's group of ranks failed (a rank hung, died or could not start); it is one
    failure unit, so every rank is gone by the time this is raised."""


def rank_cores(world: int) -> list[list[int]] | None:
    """Each rank's share of this process's cores (one core each for 2 ranks on 2 cores); None where
    there are fewer cores than ranks (they share, unpinned)."""
    cores = affinity()
    if len(cores) < world:
        return None
    return [cores[lo:hi] for lo, hi in split_evenly(len(cores), world)]


# rank 0's side ----------------------------------------------------------------------------------------


class ShardGroup:
    """Rank 0's handle on the other ranks: spawn them (they load while rank 0 does), connect,
    start (tell them the KV block count), send each step, pass the first stage's output on and
    take the last stage's back, fail them all together."""

    def __init__(self, config: EngineConfig) -> None:
        from engine.parallel.rank_worker import worker_main

        self.config = config
        self.tp, self.pp = config.tensor_parallel, config.pipeline_parallel
        self.world = world_size(config)
        self.cores = rank_cores(self.world)
        self._saved = (affinity(), torch.get_num_threads())
        ctx = mp.get_context("spawn")
        if dist.is_initialized():
            raise ShardGroupError("this process already belongs to a process group (one sharded engine each)")
        store = dist.TCPStore(
            "127.0.0.1", 0, self.world, is_master=True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
        )
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        # A replica process is daemonic, and multiprocessing refuses daemonic parents: it could
        # not reap their children. Ours die with their parent (PR_SET_PDEATHSIG), so allow it.
        me = mp.current_process()
        was_daemon, me.daemon = me.daemon, False
        try:
            for rank in range(1, self.world):
                ours, theirs = ctx.Pipe()
                cores = self.cores[rank] if self.cores else None
                proc = ctx.Process(
                    target=worker_main,
                    args=(config, rank, store.port, theirs, cores, os.getpid()),
                    name=f"servelab-rank{rank}",
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
        finally:
            me.daemon = was_daemon
        if self.cores:
            set_affinity(self.cores[0])
            torch.set_num_threads(len(self.cores[0]))
        self.timer = AllReduceTimer(on_error=self._collective_failed, device=config.device)
        self.rank_weight_bytes: list[int] = []
        self.rank_num_blocks: list[int] = []
        self.rank_kv_block_bytes: list[int] = []
        self.stage_clocks = [StageClock() for _ in range(self.pp)]
        # Each stage's (start, end) on each batch, oldest first, until the batch lands.
        self.stage_spans: list[deque[tuple[float, float]]] = [deque(maxlen=64) for _ in range(self.pp)]
        self.first_stage = SpanTimer(config.device)  # this process's own, read as each batch lands
        self.model: Llama | None = None
        self.num_layers = 0
        self.pipe_groups: dict[Direction, Any] = {}
        self.link: StageLink | None = None
        self._later_wire: tuple[str, dict[str, Any]] | None = None
        self.closed = False
        self._store = store

    def connect(self) -> None:
        """Wait until every rank has loaded its shard (that may take long: not on the collective
        timeout), then join the process group."""
        for rank, conn in enumerate(self.conns, start=1):
            reply = self._recv(conn, rank, START_TIMEOUT_S)
            if reply[0] != "ready":
                self._fail(f"rank {rank} failed to start: {reply[1]}")
            _, weight_bytes, num_blocks, block_bytes = reply
            self.rank_weight_bytes.append(weight_bytes)
            self.rank_num_blocks.append(num_blocks)
            self.rank_kv_block_bytes.append(block_bytes)
        try:
            groups = join_group(self.config, 0, self._store.port, self._store)
        except Exception as exc:  # noqa: BLE001
            self._fail(f"the process group did not form: {exc}")
        self.timer.group, self.pipe_groups = groups.stage, groups.pipe

    @property
    def pids(self) -> list[int]:
        """Every rank's process id, rank 0 (this process) first."""
        return [os.getpid()] + [p.pid for p in self.procs]

    def start(self, model: Llama, num_layers: int, weight_bytes: int, num_blocks: int, block_bytes: int) -> int:
        """Hook the all-reduce into rank 0's model; tell every rank the KV block count: the fewest
        any rank has room for (rank 0's plan is num_blocks). num_layers: the whole model's.
        Returns the block count."""
        self.num_layers = num_layers
        if self.tp > 1:
            model.all_reduce = self.timer
        self.model = model
        if self.pp > 1:
            self.link = StageLink(0, self.tp, self.pp, self.pipe_groups, self.pp)
        self.rank_weight_bytes = [weight_bytes, *self.rank_weight_bytes]
        self.rank_kv_block_bytes = [block_bytes, *self.rank_kv_block_bytes]
        blocks = min([num_blocks, *self.rank_num_blocks])
        self._send(("blocks", blocks), self.conns)
        return blocks

    def send_step(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBatch, logit_rows: list[int] | None = None
    ) -> None:
        """Before rank 0's forward: the step to the first stage's other ranks (they run it beside
        rank 0); the later stages get it once the first stage's output is on its way (pass_on)."""
        self.timer.end_step()
        self._read_reports()
        dead = [r for r, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            self._fail(f"rank {dead[0]} died")
        msg = ("step", step_to_wire(input_ids, positions, attn, logit_rows))
        self._send(msg, self.conns[: self.tp - 1])
        self._later_wire = msg
        if self.pp > 1:
            self.first_stage.start()

    def pass_on(self, hidden: torch.Tensor) -> None:
        """After rank 0's forward: the step to the later stages, the first stage's output to the second."""
        self.first_stage.stop()
        assert self.link is not None and self._later_wire is not None
        self._send(self._later_wire, self.conns[self.tp - 1 :])
        try:
            self.link.send(hidden)
        except Exception as exc:  # noqa: BLE001 - a stage that never takes it
            self._collective_failed(exc)

    def take_back(self, num_rows: int, width: int) -> torch.Tensor:
        """What the last stage sends back for a batch rank 0 passed on (in the order they went):
        the logits of its sampled rows, or the residual stream of every token."""
        assert self.model is not None and self.link is not None
        timeout = COLLECTIVE_TIMEOUT_S if self.config.collective_timeout else None
        try:
            rows = self.link.receive(num_rows, width, self.model, timeout)
        except Exception as exc:
            self._collective_failed(exc)
            raise  # unreachable: _collective_failed raises
        self._read_reports()  # every stage wrote its span to its pipe before it passed the batch on
        return rows

    def landed_stages(self) -> tuple[tuple[float, float], ...]:
        """Each stage's (start, end) on the batch that just came back (stages work in order). The
        first stage's is read now: on CUDA its events are long done (the batch went on from it)."""
        for start, end in self.first_stage.spans(1):
            self._record(0, start, end)
        return tuple(spans.popleft() for spans in self.stage_spans if spans)

    def stats(self) -> ShardStats:
        self._read_reports()
        tp_only = ShardStats(
            tensor_parallel=self.tp,
            tp_rank_weight_bytes=self.rank_weight_bytes[: self.tp],
            tp_rank_pids=self.pids[: self.tp],
            rank_pids=self.pids,
            allreduce_ms_per_step=self.timer.ms_per_step,
            allreduces_per_step=self.timer.count_per_step,
            pp_stage_weight_bytes=[sum(self.rank_weight_bytes)],
            pp_stage_kv_block_bytes=[sum(self.rank_kv_block_bytes)],
        )
        if self.pp == 1:
            return tp_only
        lead = [s * self.tp for s in range(self.pp)]  # each stage's TP rank 0
        return replace(
            tp_only,
            pipeline_parallel=self.pp,
            pp_stage_layers=stage_layers(self.num_layers, self.pp),
            pp_stage_weight_bytes=[sum(self.rank_weight_bytes[r : r + self.tp]) for r in lead],
            pp_stage_kv_block_bytes=[sum(self.rank_kv_block_bytes[r : r + self.tp]) for r in lead],
            pp_stage_busy_ms_per_step=[c.busy_ms_per_step() for c in self.stage_clocks],
            pp_stage_idle_share=[c.idle_share(time.monotonic()) for c in self.stage_clocks],
        )

    def close(self) -> None:
        """Stop the workers cleanly (they leave their loop on None) and leave the group."""
        if self.closed:
            return
        try:
            self._send(None, self.conns)
        except ShardGroupError:
            pass
        for proc in self.procs:
            proc.join(5)
        self.kill()

    def kill(self) -> None:
        """SIGKILL every worker (a stopped one too) and reap it; restore rank 0's cores."""
        for proc in self.procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.join(5)
        for conn in self.conns:
            conn.close()
        if not self.closed and dist.is_initialized():
            dist.destroy_process_group()
        if not self.closed and self.cores:
            set_affinity(self._saved[0])
            torch.set_num_threads(self._saved[1])
        self.closed = True

    # reports and failure ----------------------------------------------------------------------

    def _read_reports(self) -> None:
        """Each later stage's lead rank reports its span on every batch ("step", start, end)."""
        for rank, conn in enumerate(self.conns, start=1):
            try:
                while conn.poll():
                    msg = conn.recv()
                    if msg[0] == "step" and rank % self.tp == 0:
                        self._record(rank // self.tp, msg[1], msg[2])
            except (EOFError, OSError):
                self._fail(f"rank {rank} is gone")

    def _record(self, stage: int, start: float, end: float) -> None:
        self.stage_spans[stage].append((start, end))
        self.stage_clocks[stage].record(start, end)

    def _collective_failed(self, exc: Exception) -> None:
        # A killed rank's socket resets before its process is seen to exit: look a moment longer.
        settle = time.monotonic() + 1.0
        while True:
            stopped = [r for r, p in enumerate(self.procs, start=1) if _is_stopped(p.pid)]
            dead = [r for r, p in enumerate(self.procs, start=1) if not p.is_alive()]
            if stopped or dead or time.monotonic() > settle:
                break
            time.sleep(0.05)
        if stopped:
            why = f"{self._name(stopped[0])} stopped answering (timed out after {COLLECTIVE_TIMEOUT_S:.0f} s)"
        elif dead:
            why = f"{self._name(dead[0])} died"
        else:
            why = f"a collective failed: {str(exc).splitlines()[0][:200]}"
        self._fail(why)

    def _name(self, rank: int) -> str:
        return f"rank {rank}" + (f" (pipeline stage {rank // self.tp})" if self.pp > 1 else "")

    def _fail(self, why: str) -> None:
        self.kill()
        kind = "pipeline" if self.pp > 1 else "tensor-parallel"
        raise ShardGroupError(f"{kind} group failed: {why}")

    def _send(self, msg: Any, conns: list[Any]) -> None:
        if self.closed:
            raise ShardGroupError("the replica's group is closed")
        for conn in conns:
            try:
                conn.send(msg)
            except OSError:
                self._fail(f"{self._name(self.conns.index(conn) + 1)} is gone")

    def _recv(self, conn: Any, rank: int, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not conn.poll(0.2):
            proc = self.procs[rank - 1]
            if not proc.is_alive() or time.monotonic() > deadline:
                self._fail(f"rank {rank} did not start (exit code {proc.exitcode})")
        try:
            return conn.recv()
        except EOFError:
            self._fail(f"rank {rank} is gone")


def process_state(pid: int) -> str | None:
    """Linux's one-letter state of a process (R, S, T: stopped, Z: zombie, ...); None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _is_stopped(pid: int) -> bool:
    return process_state(pid) in ("T", "t")
