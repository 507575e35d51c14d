"""Tensor parallelism: one replica's model split across `tensor_parallel` processes (ranks).

Rank 0 is the engine's own process: it runs the scheduler, the block manager and the sampler.
Ranks 1..t-1 are spawned here; each loads the model, keeps only its shard and its own KV cache
(the same block ids, only its heads), and runs every step rank 0 sends it down a pipe. The
process group (gloo on CPU, NCCL on CUDA) carries only the all-reduces:

    qkv, gate/up   column-parallel: each rank holds its KV-head groups' Q/K/V rows and its slice
                   of the MLP's intermediate rows; attention needs no communication at all
    o, down        row-parallel: each rank's partial product is summed by an all-reduce
                   (2 per layer: 60 a step for SmolLM2-135M, whatever the batch)
    embed, head    replicated (tied, 28 M of the 135 M parameters): every rank embeds its own
                   tokens and rank 0 alone computes logits from the all-reduced hidden state

Heads split by KV group, as evenly as they go (engine/model/sharding.py says which slice each
rank keeps), so t may be at most the number of KV heads. The rank with the most heads sets the
KV block count for all (its memory is the tightest).

A rank that stops answering fails the whole group: every collective has COLLECTIVE_TIMEOUT_S,
after which rank 0 kills every worker (SIGKILL works on a stopped process too) and raises
ShardGroupError; workers die with their parent (PR_SET_PDEATHSIG) and leave on a broken pipe.
With the defence lever `collective_timeout` off (EngineConfig), ServeLab sets no timeout of its
own: the group gets torch's built-in default (gloo cannot wait forever, but its default is half
an hour), and the replica arms no step watchdog (engine/serving/replicas/replica.py), so a stopped rank
leaves rank 0 waiting inside an all-reduce while its heartbeats still say it is alive.
"""

from __future__ import annotations

import ctypes
import datetime
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.machine import affinity, set_affinity, usable_cores
from engine.model.llama import AttentionBatch, Llama, PrefillChunk
from engine.model.sharding import shard_model, split_evenly

COLLECTIVE_TIMEOUT_S = 10.0  # a collective waiting longer than this fails the group
STEP_TIMEOUT_S = 14.0  # the front process's watchdog on one step of a tensor-parallel replica
START_TIMEOUT_S = 300.0


class ShardGroupError(RuntimeError):
    """The tensor-parallel group failed (a rank hung, died or could not start); it is one
    failure unit, so every rank is gone by the time this is raised."""


def rank_device(device: str, rank: int) -> str:
    return f"cuda:{rank}" if device.startswith("cuda") else device


def rank_cores(world: int) -> list[list[int]] | None:
    """Each rank's share of this process's cores (one core each for t=2 on 2 cores); None where
    there are fewer cores than ranks (they share, unpinned)."""
    cores = affinity()
    if len(cores) < world:
        return None
    return [cores[lo:hi] for lo, hi in split_evenly(len(cores), world)]


# one step on the wire: numpy arrays pickle as bytes (torch tensors would go through shared memory)


def step_to_wire(input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBatch) -> dict[str, Any]:
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


def join_group(config: EngineConfig, rank: int, port: int, store: Any = None) -> None:
    world = config.tensor_parallel
    # The guard off is the guard absent: no timeout argument, so torch's own default applies.
    timeout = {"timeout": datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)} if config.collective_timeout else {}
    if store is None:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=datetime.timedelta(seconds=60))
    backend = "nccl" if config.device.startswith("cuda") else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, **timeout)


class AllReduceTimer:
    """The model's all-reduce hook: sums a row-parallel layer's partial outputs across ranks,
    timing each (wall time, which includes waiting for the slowest rank; on CUDA only the launch)."""

    def __init__(self, on_error: Callable[[Exception], None] | None = None) -> None:
        self.on_error = on_error
        self.step_s = 0.0
        self.step_count = 0
        self.recent_ms: deque[float] = deque(maxlen=50)  # per step, the latest steps
        self.count_per_step = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        try:
            dist.all_reduce(x)
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


# rank 0's side --------------------------------------------------------------------------------


class ShardGroup:
    """Rank 0's handle on the other ranks: spawn them (they load while rank 0 does), connect,
    start (tell them the KV block count), send each step, fail them all together."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.world = config.tensor_parallel
        self.cores = rank_cores(self.world)
        self._saved = (affinity(), torch.get_num_threads())
        ctx = mp.get_context("spawn")
        if dist.is_initialized():
            raise ShardGroupError("this process already belongs to a process group (one tensor-parallel engine each)")
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
                    name=f"servelab-tp-rank{rank}",
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
        self.timer = AllReduceTimer(on_error=self._collective_failed)
        self.rank_weight_bytes: list[int] = []
        self.closed = False
        self._store = store

    def connect(self) -> None:
        """Wait until every rank has loaded its shard (that may take long: not on the collective
        timeout), then join the process group."""
        for rank, conn in enumerate(self.conns, start=1):
            reply = self._recv(conn, rank, START_TIMEOUT_S)
            if reply[0] != "ready":
                self._fail(f"rank {rank} failed to start: {reply[1]}")
            self.rank_weight_bytes.append(reply[1])
        try:
            join_group(self.config, 0, self._store.port, self._store)
        except Exception as exc:  # noqa: BLE001
            self._fail(f"the process group did not form: {exc}")

    @property
    def pids(self) -> list[int]:
        """Every rank's process id, rank 0 (this process) first."""
        return [os.getpid()] + [p.pid for p in self.procs]

    def start(self, model: Llama, weight_bytes: int, num_blocks: int) -> None:
        """Hook the all-reduce into rank 0's model; tell every rank the KV block count rank 0 planned."""
        model.all_reduce = self.timer
        self.rank_weight_bytes = [weight_bytes, *self.rank_weight_bytes]
        self._send(("blocks", num_blocks))

    def send_step(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionBatch) -> None:
        self.timer.end_step()
        dead = [r for r, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if dead:
            self._fail(f"rank {dead[0]} died")
        self._send(("step", step_to_wire(input_ids, positions, attn)))

    def stats(self) -> dict[str, Any]:
        return {
            "tensor_parallel": self.world,
            "tp_rank_weight_bytes": list(self.rank_weight_bytes),
            "tp_rank_pids": self.pids,
            "allreduce_ms_per_step": self.timer.ms_per_step,
            "allreduces_per_step": self.timer.count_per_step,
        }

    def close(self) -> None:
        """Stop the workers cleanly (they leave their loop on None) and leave the group."""
        if self.closed:
            return
        try:
            self._send(None)
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

    # failure ----------------------------------------------------------------------------------

    def _collective_failed(self, exc: Exception) -> None:
        stopped = [r for r, p in enumerate(self.procs, start=1) if _is_stopped(p.pid)]
        dead = [r for r, p in enumerate(self.procs, start=1) if not p.is_alive()]
        if stopped:
            why = f"rank {stopped[0]} stopped answering (collective timed out after {COLLECTIVE_TIMEOUT_S:.0f} s)"
        elif dead:
            why = f"rank {dead[0]} died"
        else:
            why = f"a collective failed: {str(exc).splitlines()[0][:200]}"
        self._fail(why)

    def _fail(self, why: str) -> None:
        self.kill()
        raise ShardGroupError(f"tensor-parallel group failed: {why}")

    def _send(self, msg: Any) -> None:
        if self.closed:
            raise ShardGroupError("tensor-parallel group is closed")
        for rank, conn in enumerate(self.conns, start=1):
            try:
                conn.send(msg)
            except OSError:
                self._fail(f"rank {rank} is gone")

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


def tp_stats(group: ShardGroup | None, weight_bytes: int) -> dict[str, Any]:
    """The tensor-parallel facts engine.stats() reports, the same keys for one rank:
    tensor_parallel (ranks), tp_rank_weight_bytes (weights each rank holds, rank 0 first),
    tp_rank_pids, allreduce_ms_per_step (rank 0's wall time in all-reduces, mean of the latest
    steps) and allreduces_per_step (2 per layer)."""
    if group is not None:
        return group.stats()
    return {
        "tensor_parallel": 1,
        "tp_rank_weight_bytes": [weight_bytes],
        "tp_rank_pids": [os.getpid()],
        "allreduce_ms_per_step": 0.0,
        "allreduces_per_step": 0,
    }


def process_state(pid: int) -> str | None:
    """Linux's one-letter state of a process (R, S, T: stopped, Z: zombie, ...); None if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _is_stopped(pid: int) -> bool:
    return process_state(pid) in ("T", "t")


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that spawned it dies (rank 0 killed)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except OSError:
        pass


# ranks 1..t-1 ---------------------------------------------------------------------------------


def worker_main(config: EngineConfig, rank: int, port: int, conn: Any, cores: list[int] | None, parent: int) -> None:
    """Load the model, keep this rank's shard, then run each step rank 0 sends until None."""
    from engine.memory import weight_footprint
    from engine.model.loader import load_model
    from engine.model.paths import default_gguf_path
    from engine.runner import ModelRunner
    from engine.torch_dtypes import DTYPES

    _die_with_parent()
    if os.getppid() != parent:
        return
    if cores:
        set_affinity(cores)
    torch.set_num_threads(len(cores) if cores else max(1, usable_cores() // config.tensor_parallel))
    device, dtype = rank_device(config.device, rank), DTYPES[config.dtype]
    try:
        model = shard_model(
            load_model(config.model or str(default_gguf_path()), dtype, device), rank, config.tensor_parallel
        )
        conn.send(("ready", weight_footprint(model)[0]))
        join_group(config, rank, port)
        _, num_blocks = conn.recv()
    except Exception as exc:  # noqa: BLE001 - reported to rank 0, which fails the group
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    model.all_reduce = AllReduceTimer()
    runner = ModelRunner(model, num_blocks, config.block_size, dtype, device, config.huge_pages)
    try:
        while True:
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    return
                continue
            msg = conn.recv()
            if msg is None:
                return
            with torch.inference_mode():
                model(*step_from_wire(msg[1], device), runner.kv_caches)
    except (EOFError, OSError, RuntimeError):
        return  # rank 0 is gone or failed the group; it kills us anyway
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
