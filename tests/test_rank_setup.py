"""How a replica's ranks set up on NCCL, checked on the CPU: each rank's GPU, the TORCH_NCCL_*
settings that make a hang fail the replica, the process groups join_group makes (torch's NCCL
calls stood in for), the device timers' bookkeeping (CUDA events stood in for) and StageLink's
posting of one batched op on its direction's group."""

from __future__ import annotations

import datetime
import os
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist

from engine.config import EngineConfig
from engine.parallel import collectives
from engine.parallel.collectives import AllReduceTimer, StageLink, join_group, rank_device
from engine.parallel.p2p import P2P
from engine.parallel.ranks import (
    COLLECTIVE_TIMEOUT_S,
    NCCL_DUMP_WAIT_MS,
    NCCL_WATCHDOG_POLL_S,
    STEP_TIMEOUT_S,
    nccl_environment,
)
from engine.parallel.span_timer import SpanTimer

pytestmark = pytest.mark.unit


def test_ranks_take_consecutive_gpus_from_the_configured_one() -> None:
    assert [rank_device("cuda:2", r) for r in range(2)] == ["cuda:2", "cuda:3"]
    assert [rank_device("cuda", r) for r in range(3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert rank_device("cuda:0", 1) == "cuda:1"
    assert rank_device("cpu", 3) == "cpu"


def test_nccl_settings_fail_a_hang_by_the_watchdog_before_the_step_watchdog() -> None:
    env = nccl_environment(EngineConfig(device="cuda:1", tensor_parallel=2))
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"  # tear the process down, no comm abort first
    assert env["TORCH_NCCL_BLOCKING_WAIT"] == "0"  # with 1 there is no watchdog at all
    assert env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "1"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "0"
    # The watchdog sleeps 4 x the dump wait after it sees the timeout: still inside the front's watchdog.
    down_s = COLLECTIVE_TIMEOUT_S + NCCL_WATCHDOG_POLL_S + 4 * int(env["TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC"]) / 1e3
    assert down_s == COLLECTIVE_TIMEOUT_S + NCCL_WATCHDOG_POLL_S + 4 * NCCL_DUMP_WAIT_MS / 1e3 < STEP_TIMEOUT_S
    assert all(key.startswith("TORCH_NCCL_") and isinstance(value, str) for key, value in env.items())


def test_no_nccl_settings_off_cuda_or_with_the_defence_off() -> None:
    assert nccl_environment(EngineConfig(device="cpu", tensor_parallel=2)) == {}
    assert nccl_environment(EngineConfig(device="cuda", tensor_parallel=2, collective_timeout=False)) == {}


class FakeNccl:
    """torch's calls join_group makes, recorded (no GPU here)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[Any, ...]] = []
        monkeypatch.setattr(os, "environ", dict(os.environ))
        monkeypatch.setattr(torch.cuda, "set_device", lambda device: self.calls.append(("set_device", device)))
        monkeypatch.setattr(torch, "zeros", lambda *shape, device: self.calls.append(("zeros", device)) or shape)
        monkeypatch.setattr(dist, "init_process_group", self.init)
        monkeypatch.setattr(
            dist, "new_group", lambda ranks, **kw: self.calls.append(("new_group", ranks, kw)) or tuple(ranks)
        )
        monkeypatch.setattr(dist, "all_reduce", lambda t, group: self.calls.append(("all_reduce", group)))

    def init(self, backend: str, **kw: Any) -> None:
        nccl = {k: v for k, v in os.environ.items() if k.startswith("TORCH_NCCL_")}
        self.calls.append(("init", backend, kw["rank"], kw.get("timeout"), nccl))


def test_join_group_sets_the_rank_s_gpu_and_the_nccl_settings_before_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNccl(monkeypatch)
    config = EngineConfig(device="cuda:2", tensor_parallel=2, pipeline_parallel=2)
    groups = join_group(config, 3, 0, store=object())
    timeout = datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S)
    assert fake.calls[0] == ("set_device", "cuda:5")
    assert fake.calls[1] == ("init", "nccl", 3, timeout, nccl_environment(config))
    made = [(c[1], c[2]) for c in fake.calls if c[0] == "new_group"]
    assert made == [([0, 1], {"timeout": timeout}), ([2, 3], {"timeout": timeout}), ([0, 1, 2, 3], {"timeout": timeout}),
                    ([0, 2], {"timeout": timeout})]  # fmt: skip
    # Rank 3 is in stage 1 and in the forward group only: it warms up that one, on its own GPU.
    assert [c for c in fake.calls if c[0] in ("zeros", "all_reduce")] == [
        ("zeros", "cuda:5"),
        ("all_reduce", (0, 1, 2, 3)),
    ]
    assert groups.stage == (2, 3) and groups.pipe == {"forward": (0, 1, 2, 3)}
    assert join_group(config, 0, 0, store=object()).pipe == {"forward": (0, 1, 2, 3), "back": (0, 2)}


def test_with_the_defence_off_join_group_sets_no_timeout_and_no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNccl(monkeypatch)
    join_group(EngineConfig(device="cuda", tensor_parallel=2, collective_timeout=False), 1, 0, store=object())
    assert fake.calls == [("set_device", "cuda:1"), ("init", "nccl", 1, None, {})]


def test_a_stage_link_posts_one_batched_op_on_its_direction_s_group(monkeypatch: pytest.MonkeyPatch) -> None:
    posted: list[list[dist.P2POp]] = []

    class Work:
        def wait(self, timeout: Any = None) -> None:
            pass

    monkeypatch.setattr(dist, "batch_isend_irecv", lambda ops: posted.append(ops) or [Work()])
    monkeypatch.setattr(dist, "P2POp", lambda fn, tensor, peer, group: (fn, tensor.shape, peer, group))
    link = StageLink(0, 2, 3, {"forward": "FWD", "back": "BACK"}, depth=3)
    assert (link.give, link.take) == (P2P("send", 2, "forward"), P2P("recv", 4, "back"))
    link.send(torch.zeros(2, 8))

    class Like:
        embed = torch.zeros(1, dtype=torch.float32)

    rows = link.receive(3, 5, Like(), 10.0)  # type: ignore[arg-type]
    assert rows.shape == (3, 5)
    assert posted == [[(dist.isend, (2, 8), 2, "FWD")], [(dist.irecv, (3, 5), 4, "BACK")]]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_cpu_span_timer_keeps_the_clock_s_readings() -> None:
    clock = Clock()
    timer = SpanTimer("cpu", clock)
    for start, end in [(1.0, 1.5), (2.0, 2.25), (3.0, 4.0)]:
        clock.now = start
        timer.start()
        clock.now = end
        timer.stop()
    timer.stop()  # no span open: nothing
    assert len(timer) == 3
    assert timer.spans(1) == [(1.0, 1.5)]  # the oldest, and only it
    assert timer.durations_s() == [0.25, 1.0] and len(timer) == 0
    assert timer.spans(1) == [] and timer.durations_s() == []


class FakeEvent:
    """A CUDA event on a made-up GPU clock: it completes at the time the test says the GPU got there."""

    gpu_now: ClassVar[float] = 0.0
    synced: ClassVar[list[FakeEvent]] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = 0.0

    def record(self) -> None:
        self.at = FakeEvent.gpu_now

    def synchronize(self) -> None:
        FakeEvent.synced.append(self)

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1e3


def test_a_cuda_span_timer_reads_events_and_places_them_on_the_host_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.synced = []
    host = Clock()
    timer = SpanTimer("cuda:1", host)
    for start, end in [(1.0, 1.5), (2.0, 2.25)]:  # GPU times; the host launched both at once
        FakeEvent.gpu_now = start
        timer.start()
        FakeEvent.gpu_now = end
        timer.stop()
    # Read once the GPU has reached 3.0, when the host clock says 103.0: the events lie before it.
    FakeEvent.gpu_now, host.now = 3.0, 103.0
    assert timer.spans(1) == [(101.0, 101.5)]
    assert len(FakeEvent.synced) == 1 and FakeEvent.synced[0].at == 3.0  # waited on the anchor
    assert timer.durations_s() == [0.25]
    assert FakeEvent.synced[-1].at == 2.25  # waited on the last span's end


def test_the_all_reduce_timer_sums_a_step_and_counts_its_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist, "all_reduce", lambda x, group: None)
    timer = AllReduceTimer(group="TP")
    x = torch.ones(2)
    for _ in range(4):
        assert timer(x) is x
    timer.end_step()
    assert timer.count_per_step == 4 and len(timer.recent_ms) == 1 and timer.ms_per_step >= 0.0
    timer.end_step()  # a step without all-reduces is not a sample
    assert len(timer.recent_ms) == 1 and timer.spans is not None and len(timer.spans) == 0
    quiet = AllReduceTimer(timed=False)
    quiet(x)
    quiet.end_step()
    assert quiet.spans is None and quiet.count_per_step == 1


def test_a_failed_all_reduce_goes_to_on_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(x: torch.Tensor, group: Any) -> None:
        raise RuntimeError("Connection reset by peer")

    monkeypatch.setattr(dist, "all_reduce", fails)
    seen: list[Exception] = []
    AllReduceTimer(on_error=seen.append)(torch.ones(1))
    assert [str(e) for e in seen] == ["Connection reset by peer"]
    with pytest.raises(RuntimeError):
        AllReduceTimer()(torch.ones(1))


def test_collectives_re_exports_the_settings() -> None:
    assert collectives.nccl_environment is nccl_environment
