"""The remote lab: the same pages drive and watch an existing OpenAI-compatible server (vLLM,
SGLang, another ServeLab) instead of ServeLab's own engine. No replica starts and no model is
loaded here; the remote does the serving.

What works fully, because it is the lab's own doing: the traffic (rate, lengths, burstiness,
the flood, the ramp), the lab's clients (patience, retries after a 429, retry jitter) and the
proxy between them and the remote (stream_flush: a buffering proxy; proxy_idle_timeout_s;
cancel_on_disconnect off: the proxy does not pass a hang-up on, so the remote generates for
nobody). What belongs to the remote (paging, block size, batch slots, TP, ...) is shown
read-only, with the remote's value where its metrics or /v1/models reveal it; set_levers on one
is refused naming it.

RemotePoller, the lab's driver, owns the clock and the thread: SNAPSHOT_HZ times a second it
scrapes the remote's /metrics (remote_metrics.py maps vLLM's and SGLang's names onto the
snapshot's keys), adds what the lab's clients measured at their end, and publishes the
snapshot; while the remote is down or not OpenAI-compatible it probes /v1/models every
PROBE_EVERY_S and says what is wrong (a `remote` event, the log, the page's banner), the page
keeps its clients' figures, and the lab reconnects when the remote answers again."""

from __future__ import annotations

import http.client
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.clock import WALL_CLOCK, Clock
from engine.errors import InvalidParamError, ServingError
from engine.lab.facade import (
    BackgroundWork,
    Executor,
    LabState,
    LabStatus,
    LeverChange,
    RankHangAction,
    RankHangAnswer,
    RemoteView,
    announce,
)
from engine.lab.flood import FloodState, flood, flood_state
from engine.lab.lever_routes import Route, by_route, routes_of
from engine.lab.live_limits import FLOOD_MAX_RATE, LIVE_FLOOD
from engine.lab.proxy import IDLE_TIMEOUT_CODE, ProxySettings
from engine.lab.remote.remote_backend import RemoteConfig, RemoteInfo, error_message, fetch, probe
from engine.lab.remote.remote_errors import EVENT_KIND, RemoteErrors
from engine.lab.remote.remote_levers import REMOTE_LEVERS, belongs_to_remote, readonly_levers
from engine.lab.remote.remote_metrics import RemoteReading, RemoteSnapshot, RemoteWindow, read_exposition
from engine.lab.remote.remote_poller import PROBE_EVERY_S, RemotePoller
from engine.lab.remote.user_streams import UserStreams
from engine.lab.traffic import TrafficDriver
from engine.levers import LEVERS, validate_levers
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.metrics import WINDOW_S
from engine.serving.telemetry.prometheus_text import PrometheusParseError, parse

log = logging.getLogger("servelab.remote")

SCRAPE_TIMEOUT_S = 0.5  # a scrape slower than this is a problem worth naming
PROXY_UNREACHABLE = "the proxy could not reach the server"  # proxy.py's 502
NOT_PROBED = "not probed yet"
LENGTH_SPREAD = 1.5  # the lab's traffic draws lengths up to 1.5x their means (traffic.py, draw_length 0.5)


class RemoteLab:
    """The LabFacade (engine/lab/facade.py) over a remote server."""

    def __init__(self, config: RemoteConfig, levers: dict[str, Any] | None = None, clock: Clock = WALL_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.events = EventLog(clock)
        self.errors = RemoteErrors(self.events, clock)
        self.window = RemoteWindow()
        self.reading: RemoteReading | None = None  # the newest scrape that mapped
        self.info = RemoteInfo(False, problem=NOT_PROBED)
        self.levers = {key: lever.default for key, lever in LEVERS.items()}
        # The lab's clients send through the lab's proxy to the remote, with its key; the levers
        # below move it (a rate lever ends a ramp), so it is there first.
        self.traffic = TrafficDriver(
            None, lambda: self.levers, api_key=config.api_key, context=lambda: self.info.max_model_len
        )
        self.set_levers(levers or {}, "the command line", quiet=True)
        self.problems: dict[str, str | None] = {"api": None, "metrics": None}
        self._subscribers: list[Callable[[RemoteSnapshot], None]] = []
        self.next_probe = 0.0
        self._orphans: deque[tuple[float, int]] = deque()  # (time, the proxy's orphan_chunks)
        self._lock = threading.RLock()
        self._connected_model: str | None = None
        self.poller = RemotePoller(self)
        self.run = 0  # one remote, one run: the stream's charts never reset
        self.user_streams = UserStreams()  # the app's pass-through streams, by their `user`

    @property
    def executor(self) -> Executor:
        return Executor.REMOTE

    @property
    def traces(self) -> None:
        """No request traces: the remote's engine reports aggregates only (its /metrics)."""
        return None

    @property
    def flavour(self) -> str:
        """vLLM, SGLang or ServeLab (from the metric prefixes or /v1/models), else a plain name."""
        reading = self.reading
        return (reading.flavour if reading else None) or {
            "vllm": "vLLM",
            "sglang": "SGLang",
            "servelab": "ServeLab",
        }.get((self.info.owned_by or "").lower(), "an OpenAI-compatible server")

    def label(self) -> str:
        """The page header's words: "remote: vLLM at http://gpu:8000, model X"."""
        model = self.info.model or "model unknown"
        return f"remote: {self.flavour} at {self.config.base_url}, " + (f"model {model}" if self.info.model else model)

    def subscribe(self, callback: Callable[[RemoteSnapshot], None]) -> None:
        self._subscribers.append(callback)

    def start(self) -> RemoteLab:
        """Probe once (so the first page already names the remote), then poll on a thread."""
        self.poller.tick()
        self.poller.start()
        return self

    def probe_due(self) -> bool:
        """A probe of /v1/models is due while the remote is down, not OpenAI-compatible or has no
        model yet, PROBE_EVERY_S after the last; taking it books the next (RemotePoller.tick)."""
        now = self.clock.now()
        if (not self.info.reachable or self.problems["api"] or not self.info.model) and now >= self.next_probe:
            self.next_probe = now + PROBE_EVERY_S
            return True
        return False

    def poll(self) -> None:
        if self.info.reachable:
            self.scrape()
        self.errors.flush()
        self.publish()

    # levers -------------------------------------------------------------------------------------

    def belongs_to_remote(self, key: str) -> str:
        return belongs_to_remote(key, self.flavour)

    def readonly(self) -> dict[str, str]:
        """Each lever the remote owns, with its value where the remote reveals it."""
        return readonly_levers(self.info, self.reading)

    def set_levers(self, changes: dict[str, Any], source: str = "lab", quiet: bool = False) -> LeverChange:
        clean = validate_levers(changes)
        if clean.pop("executor", Executor.LIVE) != Executor.LIVE:
            raise InvalidParamError(
                "executor",
                "the remote backend has no simulated mode: run `python app.py` without --backend remote for it",
            )
        if clean.get("request_rate", 0) > FLOOD_MAX_RATE:
            raise InvalidParamError("request_rate", f"the lab's clients send at most {FLOOD_MAX_RATE:g} req/s")
        for key, value in clean.items():
            if Route.REMOTE in routes_of(key, Executor.REMOTE) and value != self.levers[key]:
                raise InvalidParamError(key, self.belongs_to_remote(key))
        limit, merged = self.info.max_model_len, self.levers | clean
        longest = int(merged["prompt_tokens"] * LENGTH_SPREAD) + int(merged["output_tokens"] * LENGTH_SPREAD)
        if limit and longest > limit and ({"prompt_tokens", "output_tokens"} & set(clean)):
            key = "prompt_tokens" if "prompt_tokens" in clean else "output_tokens"
            raise InvalidParamError(
                key,
                f"the remote's max_model_len is {limit}: prompts and outputs drawn up to {LENGTH_SPREAD:g}x "
                f"their means ({longest} tokens) would not fit",
            )
        changed = {k: v for k, v in clean.items() if self.levers[k] != v}
        self.levers = self.levers | clean
        self.traffic.levers_moved(by_route(changed, Executor.REMOTE)[Route.LOAD])
        if not quiet:
            announce(self.events, source, changed, "the lab's traffic, clients and proxy")
        return LeverChange(changed, False, dict(self.levers))

    # traffic ------------------------------------------------------------------------------------

    def flood(self, action: str, ramp_to: float | None = None, ramp_s: float = 30.0) -> FloodState:
        return flood(self.traffic, action, ramp_to, ramp_s, LIVE_FLOOD, self.events, "remote ")

    def hang_rank(self, action: RankHangAction | str) -> RankHangAnswer:
        """The failure gallery's "Stop a rank": the remote's processes are not the lab's to signal."""
        RankHangAction.parse(action)  # a bad action is named first, as live
        raise ServingError(
            409,
            "a remote server's ranks are its own processes, not this lab's: stopping one needs ServeLab's "
            "own engine (python app.py without --backend remote) with tensor_parallel 2",
            "executor",
        )

    def traffic_state(self) -> FloodState:
        return flood_state(self.traffic)

    def proxy_settings(self) -> ProxySettings:
        levers = self.levers
        return ProxySettings(
            bool(levers["stream_flush"]), float(levers["proxy_idle_timeout_s"]), bool(levers["cancel_on_disconnect"])
        )

    def _connect_traffic(self, model: str) -> None:
        """Point the lab's clients (through the lab's proxy) at the remote, asking for `model`."""
        if model == self._connected_model:
            return
        self.traffic.connect(self.config.base_url, model, self._client_refusal, self.proxy_settings)
        self._connected_model = model

    def _client_refusal(self, status: int | None, retry_after: str | None, body: str) -> None:
        """What a lab client heard instead of a stream. The lab's own proxy speaks for a remote
        it could not reach (its 502): that is the remote unreachable. Its idle-timeout 504 is
        the lab's proxy's doing, not the remote's, and the client counts show it."""
        if status == 502 and PROXY_UNREACHABLE in body:
            status, body = None, error_message(None, body)
        elif status == 504 and IDLE_TIMEOUT_CODE in body:
            return
        self.errors.report("the lab's clients", status, retry_after, body)

    # the poller's steps -------------------------------------------------------------------------

    def probe_now(self) -> None:
        info = probe(self.config)
        with self._lock:
            self.info = info
            self._note("api", info.problem)
            if info.model:
                self._connect_traffic(info.model)
            elif self._connected_model is None:  # the remote's model is not known yet: send as if "default"
                self._connect_traffic("default")

    def scrape(self) -> None:
        """One scrape of the remote's /metrics into the window (or what went wrong, named)."""
        url, now = self.config.metrics_url, self.clock.now()
        try:
            answer = fetch(url, self.config.api_key, SCRAPE_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as err:
            self._metrics_failed(f"unreachable: {url}: {type(err).__name__}: {err}", down=True)
            return
        if answer.status != 200:
            self._metrics_failed(f"no metrics: {url} answered {error_message(answer.status, answer.text(300))}")
            return
        try:
            exposition = parse(answer.text(4_000_000))
        except PrometheusParseError as err:
            self._metrics_failed(f"{url} is not Prometheus text ({err}); the charts show the lab's clients only")
            return
        reading = read_exposition(exposition, now, self.info.model, self.info.owned_by)
        if not reading.quantities():
            some = ", ".join(sorted(exposition.names())[:4]) or "nothing"
            self._metrics_failed(
                f"{url} has none of vLLM's or SGLang's metric names ({some}); the charts show the lab's clients only"
            )
            return
        with self._lock:
            self.reading = reading
            self.window.add(reading)
            self._note("metrics", None)

    def _metrics_failed(self, problem: str, down: bool = False) -> None:
        with self._lock:
            self.window.clear()
            if down and self.info.reachable:  # the remote went away: find out what it says next
                self.info = RemoteInfo(False, problem=problem)
                self._note("api", problem)
                self.next_probe = self.clock.now() + PROBE_EVERY_S
            self._note("metrics", problem)

    def _note(self, part: str, problem: str | None) -> None:
        """A problem that appears, changes or clears: an event, a log line, the page's banner."""
        before = self.problems[part]
        if problem == before:
            return
        self.problems[part] = problem
        if problem is not None:
            log.warning("remote %s: %s", part, problem)
            self.events.emit(EVENT_KIND, f"remote {'API' if part == 'api' else 'metrics'}: {problem}", status=None)
        elif before is not None:
            log.info("remote %s back: %s", part, self.label())
            self.events.emit(
                EVENT_KIND, f"remote {'API' if part == 'api' else 'metrics'} back: {self.label()}", status=None
            )

    @property
    def status(self) -> LabStatus:
        """The header's word for the remote's state."""
        api, metrics = self.problems["api"], self.problems["metrics"]
        if not self.info.reachable:
            return LabStatus.CONNECTING if self.info.problem == NOT_PROBED else LabStatus.UNREACHABLE
        if api is not None:
            return LabStatus.NOT_OPENAI if api.startswith("not OpenAI") else LabStatus.REFUSED
        return LabStatus.SERVING if metrics is None else LabStatus.SERVING_WITHOUT_METRICS

    def compose(self) -> RemoteSnapshot:
        """The reading the lab publishes: the remote's metrics over the window (None where it has
        none) and the lab's own wasted-token rate; snapshot() adds what the lab's clients measured."""
        with self._lock:
            snap = self.window.snapshot() if self.problems["metrics"] is None else RemoteSnapshot()
            if self.problems["metrics"] is not None:
                snap.missing = snap.unfilled()
            if not self.info.reachable:
                snap.replicas = {"failed": 1}
        snap.time = self.clock.now()
        snap.wasted_tokens_per_s = self._orphan_rate(snap.time)
        return snap

    def _orphan_rate(self, now: float) -> float:
        """Chunks the remote streamed for clients already gone (cancel_on_disconnect off: the
        lab's proxy did not pass their hang-up on), a second over the window: the /failures
        row's wasted_tokens_per_s, one token a chunk as vLLM and ServeLab stream them."""
        proxy = self.traffic.proxy
        total = proxy.counts.orphan_chunks if proxy is not None else 0
        orphans = self._orphans
        if orphans and total < orphans[-1][1]:  # a new proxy (the model changed) counts from 0
            orphans.clear()
        orphans.append((now, total))
        while len(orphans) > 1 and now - orphans[0][0] > WINDOW_S:
            orphans.popleft()
        return (total - orphans[0][1]) / WINDOW_S

    def publish(self) -> None:
        snap = self.compose()
        for callback in list(self._subscribers):
            callback(snap)

    # what the pages and the stream show -----------------------------------------------------------

    def live_state(self) -> LabState:
        reading = self.reading
        return LabState(
            model=self.info.model or "unknown model",
            device=f"remote: {self.flavour} at {self.config.base_url}",
            dtype=(reading.info.get("cache_dtype") if reading else None) or "remote",
            backend=self.label(),
            devices=(sum(reading.replicas.values()) if reading.replicas else reading.engines) if reading else 0,
            status=self.status,
            levers=dict(self.levers),
            envelope=None,
            traffic=self.traffic_state(),
            executor=Executor.REMOTE,
            run=0,
            badge=None,
            sim=None,
            remote=RemoteView(
                base_url=self.config.base_url,
                metrics_url=self.config.metrics_url,
                flavour=self.flavour,
                model=self.info.model,
                max_model_len=self.info.max_model_len,
                server=self.info.server,
                reachable=self.info.reachable,
                problems=[p for p in self.problems.values() if p],
                lab_levers=list(REMOTE_LEVERS),
                readonly=self.readonly(),
                errors=dict(self.errors.counts),
            ),
            running=BackgroundWork(sim_pacers=0, live_traffic=self.traffic.running),
        )

    def snapshot(self, reading: RemoteSnapshot) -> dict[str, Any]:
        """The stream's `metrics` payload: the reading, what the lab's clients measured at their
        end (client_*) and the lab's traffic counters, and the lab's view (`lab`)."""
        lab = self.live_state()
        extra = self.traffic.clients.view().fields() | self.traffic.fields()
        return reading.to_json() | extra | {
            "bottlenecks": [],
            "ttft_target_ms": self.levers["ttft_target_ms"],
            "executor": Executor.REMOTE,
            "badge": None,
            "run": 0,
            "shape": None,
            "autoscaler": None,
            "lab": lab.to_json(),
        }

    def cancel_user(self, user: str) -> int:
        """This user's streams through the app's pass-through, cut: the remote cancels them."""
        return self.user_streams.cancel(user)

    def stop(self) -> None:
        self.poller.stop()
        self.traffic.stop()
        self.traffic.close()
