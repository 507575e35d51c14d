"""Thirty watchers on the live stream: 27 python-socketio clients (over WebSocket) and 3 real pages,
connected for 60 s while the real engine decodes. Each must get at least 5 `metrics` snapshots a
second, 99% of them within 1 s of being sent (none stalled past CLIENT_STALL_BOUND_S), and the engine's own decode step time (its
StepRecords, read from the `trace` event) must stay close to what it is with one watcher.

The watchers stand in for a class's machines: the server (its front process and its replica)
runs on half of this machine's cores and every watcher, the python clients and the browser alike,
on the other half, so what the engine pays for is what the server does for thirty watchers. The
browser also runs at the lowest CPU priority (nice 19) there: a page's drawing is its machine's
cost, not the server's. Every watcher must get at least five snapshots a second; the python
clients get 99% of them within 1 s. The pages (three at nice 19 on one core beside 27 clients at nice 0)
get that core only when the clients leave it, so their stalls measure the test's own contention
(0.7-5.5 s alone, up to 8.5 s inside a full `make test`: PAGE_STALL_BOUND_S); what they must show is that they
keep up: no backlog builds (their median delay over the watch's last 20 s is within
PAGE_BACKLOG_BOUND_S of the first 20 s's), and no stall passes PAGE_STALL_BOUND_S.

"Behind" is the snapshot's `time` (the server's time.monotonic(), CLOCK_MONOTONIC, one clock for
every process on this machine) against the python client's time.monotonic() when the snapshot
arrives. A page cannot read that clock: it is judged by its delay beyond its own quickest
snapshot (receipt minus snapshot time, less the smallest such gap it saw).

`python -m pytest tests/test_traces_load.py -s` prints the figures BENCHMARKS.md quotes."""

from __future__ import annotations

import gc
import os
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import engineio
import pytest
import socketio
from playwright.sync_api import Page, sync_playwright

from tests.support.server_process import ServerProcess, kv_budget_mb
from tests.support.watchers import PINNED_APP, STREAMS, WATCHER_CORES, Streams

CHROMIUM = "/usr/bin/chromium"
WATCH_S = 60.0
BASELINE_S = 10.0  # one watcher, before and after the thirty
PY_CLIENTS = 27
PAGES = 3
# Three pages at nice 19 share one core with 27 python clients (worst stall measured: 0.74-1.28 s
# alone and 2.05 s and 3.80 s inside a full `make test` on a Xeon; 4.38 s and 5.54 s alone on a
# 2-core Zen 3, the second with the pages at nice 10, and 8.49 s inside a full CI run there, all three
# pages at once while every python client stayed under 0.7 s): a student's page has its own machine,
# so pages are held to keeping up, the python clients to the 1 s. A page that cannot keep
# up falls further behind every second (at 5 snapshots a second, tens of seconds over the watch):
# the backlog bound catches that, the stall bound a page that freezes.
PAGE_BACKLOG_BOUND_S = 1.0
# The python clients: 99% of snapshots within 1 s, and no stall past CLIENT_STALL_BOUND_S. One
# stall of 2.26 s (every client at once: the shared machine, not the server's fan-out) failed a
# CI run that held every snapshot to 1 s; a server that cannot keep up falls behind for good.
CLIENT_STALL_BOUND_S = 4.0
PAGE_STALL_BOUND_S = 12.0
SETTLE_S = 10.0  # after the thirty have joined, before the watch
RATIO_BOUND = 1.5  # CI's bound on the 30-watcher / 1-watcher decode step time (a shared machine)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed"),
]


class InlineEngineIOClient(engineio.Client):
    """Runs each message's handler on the client's read loop, in order, as a page runs its handlers
    on its one event loop. engineio.Client starts a thread per message: for 27 clients at ten
    messages a second on one core, those threads were the watchers' core's load, not the server's."""

    def _trigger_event(self, event: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["run_async"] = False
        return super()._trigger_event(event, *args, **kwargs)


class InlineClient(socketio.Client):
    def _engineio_client_class(self) -> type[engineio.Client]:
        return InlineEngineIOClient


@dataclass
class Watcher:
    """One python-socketio client on /live: when each snapshot arrived against its time."""

    url: str
    lags: list[float] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sio = InlineClient(reconnection=False)
        self.sio.on("metrics", self._metrics, namespace="/live")
        self.sio.on("trace", lambda msg: self.steps.extend(msg["steps"]), namespace="/live")

    def _metrics(self, snap: dict) -> None:
        now = time.monotonic()
        self.arrivals.append(now)
        self.lags.append(now - snap["time"])

    def connect(self) -> None:
        self.sio.connect(self.url, namespaces=["/live"], transports=["websocket"], wait_timeout=30)

    def window(self, start: float, end: float) -> tuple[int, float]:
        """Snapshots that arrived in [start, end), and the worst lag among them."""
        lags = [lag for t, lag in zip(self.arrivals, self.lags) if start <= t < end]
        return len(lags), max(lags, default=float("inf"))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "8", command=PINNED_APP)
    yield proc
    proc.stop()


def decode_step_s(steps: list[dict], start: float, end: float) -> tuple[float, int]:
    """Median time of the engine's pure-decode steps of STREAMS sequences that began in [start, end)."""
    times = [
        s["end"] - s["start"]
        for s in steps
        if start <= s["start"] < end and len(s["entries"]) == STREAMS and all(e["phase"] == "decode" for e in s["entries"])
    ]
    return (statistics.median(times) if times else float("nan")), len(times)


PAGE_PROBE = """() => {
  const seen = window.loadProbe = { lags: [] };
  window.servelab.socket.on('metrics', (s) => { seen.lags.push([Date.now() / 1000, s.time]); });
}"""


@pytest.fixture
def low_priority_chromium(tmp_path: Path) -> str:
    """Debian's chromium behind nice 19: what the browser and its pages spawn runs below everything.
    Without CAP_SYS_NICE: as root, chromium raises its display threads to nice -8, above every
    python client on the watchers' core (setpriv drops the capability from what it may use)."""
    wrapper = tmp_path / "chromium-nice"
    wrapper.write_text(f'#!/bin/sh\nexec setpriv --bounding-set -sys_nice nice -n 19 {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_thirty_watchers_each_get_five_snapshots_a_second_and_the_decode_step_barely_moves(
    server: ServerProcess, low_priority_chromium: str
) -> None:
    before = os.sched_getaffinity(0)
    # Set before Playwright starts: its driver, the browser and the client threads inherit it.
    os.sched_setaffinity(0, WATCHER_CORES)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=low_priority_chromium, args=["--no-sandbox"])
            # The 27 clients share this pytest process, which holds every test module the suite
            # imported: a full collection over all that (0.4-0.5 s measured here) would stall every
            # client at once, a pause no student's machine has. Frozen, a collection reads only
            # what the watch allocates.
            gc.collect()
            gc.freeze()
            try:
                measure(server, browser)
            finally:
                gc.unfreeze()
                browser.close()
    finally:
        os.sched_setaffinity(0, before)


def measure(server: ServerProcess, browser: Any) -> None:
    observer = Watcher(server.base_url)  # the one watcher of the baselines, and one of the thirty
    observer.connect()
    streams = Streams(server)
    contexts = []
    try:
        time.sleep(5)  # the streams reach their steady batch
        a0 = time.monotonic()
        time.sleep(BASELINE_S)
        a1 = time.monotonic()
        # The pages first: a page loads its scripts at nice 19, slowly once 26 clients busy its core.
        pages: list[Page] = []
        for _ in range(PAGES):
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            contexts.append(context)
            page = context.new_page()
            page.goto(f"{server.base_url}/steps/4")  # its charts include the swimlanes and the batch
            page.wait_for_function("window.servelab && window.servelab.snapshots > 0 && window.servelabTraces")
            page.evaluate(PAGE_PROBE)
            pages.append(page)
        print(f"\n{PAGES} pages open in {time.monotonic() - a1:.1f} s")
        watchers = [Watcher(server.base_url) for _ in range(PY_CLIENTS - 1)]
        for w in watchers:
            w.connect()
        print(f"{PY_CLIENTS - 1} watchers connected in {time.monotonic() - a1:.1f} s from the first page")
        # A class joining is a burst (26 connects and their first snapshots, on the core the nice-19
        # pages share): a CI run's pages began the watch about 1 s behind and took seconds to catch
        # up. The watch measures the class once it has settled.
        time.sleep(SETTLE_S)
        b0, b0_wall = time.monotonic(), time.time()
        time.sleep(WATCH_S)
        b1, b1_wall = time.monotonic(), time.time()
        page_probes = [page.evaluate("window.loadProbe.lags") for page in pages]
        # Each disconnect sends its close at once, then waits on its read loop (seconds, at times):
        # the server has let them go long before, so none is waited for past a few seconds.
        leaving = [threading.Thread(target=w.sio.disconnect, daemon=True) for w in watchers]
        for thread in leaving:
            thread.start()
        for thread in leaving:
            thread.join(max(0.0, b1 + 5 - time.monotonic()))
        for context in contexts:
            context.close()
        contexts.clear()
        time.sleep(2)  # the departed are gone from the stream
        print(f"the thirty gone {time.monotonic() - b1:.1f} s after the watch")
        c0 = time.monotonic()
        time.sleep(BASELINE_S)
        c1 = time.monotonic()
    finally:
        streams.close()
        for context in contexts:
            context.close()
        observer.sio.disconnect()

    everyone = [observer, *watchers]
    assert len(everyone) + len(pages) == 30
    counts = [w.window(b0, b1) for w in everyone]
    # A page's receipt (its wall clock, this machine's) less the snapshot's time is its delay plus
    # a constant: the spread of that over the watch is how far behind its quickest it fell.
    watched = [[(got, sent) for got, sent in probe if b0_wall <= got < b1_wall] for probe in page_probes]
    page_counts = [len(probe) for probe in watched]
    page_delays = [[(got, got - sent) for got, sent in probe] for probe in watched]
    page_worst = [max(d for _, d in delays) - min(d for _, d in delays) for delays in page_delays]
    # When in the watch each page's worst delay came: a stall at the start is the joining's tail.
    page_worst_at = [max(delays, key=lambda gd: gd[1])[0] - b0_wall for delays in page_delays]
    for i, delays in enumerate(page_delays):
        first, last = [d for got, d in delays if got < b0_wall + 20], [d for got, d in delays if got >= b1_wall - 20]
        assert first and last, f"page {i}: no snapshot in the watch's first or last 20 s"
    page_growth = [
        statistics.median(d for got, d in delays if got >= b1_wall - 20)
        - statistics.median(d for got, d in delays if got < b0_wall + 20)
        for delays in page_delays
    ]

    base_before, n_before = decode_step_s(observer.steps, a0, a1)
    loaded, n_loaded = decode_step_s(observer.steps, b0, b1)
    base_after, n_after = decode_step_s(observer.steps, c0, c1)
    base = statistics.median(
        [s["end"] - s["start"] for s in observer.steps if (a0 <= s["start"] < a1 or c0 <= s["start"] < c1)
         and len(s["entries"]) == STREAMS and all(e["phase"] == "decode" for e in s["entries"])]
    )  # fmt: skip
    ratio = loaded / base
    lags = [lag for w in everyone for t, lag in zip(w.arrivals, w.lags) if b0 <= t < b1]
    late = sum(lag > 1.0 for lag in lags)
    print(
        f"\ndecode step ({STREAMS} sequences): 1 watcher {base * 1000:.2f} ms "
        f"(before {base_before * 1000:.2f} ms over {n_before} steps, after {base_after * 1000:.2f} ms over {n_after}); "
        f"30 watchers {loaded * 1000:.2f} ms over {n_loaded} steps: ratio {ratio:.3f}\n"
        f"snapshots per python client in {b1 - b0:.0f} s: min {min(c for c, _ in counts)}; "
        f"lag p50 {statistics.median(lags) * 1000:.0f} ms, p99 {sorted(lags)[int(len(lags) * 0.99)] * 1000:.0f} ms, "
        f"max {max(lags) * 1000:.0f} ms ({late} of {len(lags)} over 1 s); "
        f"pages: {min(page_counts)} snapshots at least, worst delay beyond their quickest {max(page_worst) * 1000:.0f} ms "
        f"(at {', '.join(f'{at:.0f}' for at in page_worst_at)} s into the watch), "
        f"median delay grew {max(page_growth) * 1000:.0f} ms from the first 20 s to the last"
    )
    for i, (count, worst) in enumerate(counts):
        assert count >= 5 * (b1 - b0) * 0.98, f"client {i}: {count} snapshots in {b1 - b0:.0f} s"
        assert worst <= CLIENT_STALL_BOUND_S, f"client {i} fell {worst:.2f} s behind"
    assert late <= 0.01 * len(lags), f"{late} of {len(lags)} snapshots arrived over 1 s behind"
    for i, (count, worst, growth) in enumerate(zip(page_counts, page_worst, page_growth)):
        assert count >= 5 * (b1 - b0) * 0.98, f"page {i}: {count} snapshots handled in {b1 - b0:.0f} s"
        assert growth <= PAGE_BACKLOG_BOUND_S, f"page {i} built a backlog: its median delay grew {growth:.2f} s"
        assert worst <= PAGE_STALL_BOUND_S, f"page {i} stalled {worst:.2f} s behind its quickest snapshot"
    assert n_before >= 20 and n_loaded >= 50 and n_after >= 20, (n_before, n_loaded, n_after)
    assert ratio <= RATIO_BOUND, (
        f"the decode step with 30 watchers is {ratio:.2f}x its time with one "
        f"(load average {os.getloadavg()[0]:.1f}: other work on the engine's cores shows here too)"
    )
