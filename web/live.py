"""The live stream: Socket.IO namespace `/live`.

Server -> browser: `metrics` (a snapshot SNAPSHOT_HZ times a second, with the lab's status,
bottleneck readings, recommended shape and levers), `event` (one per discrete event), `trace`
(each tick: the request-trace rows that changed and the new engine steps, engine/serving/telemetry/traces.py;
the whole window, `full: true`, on connect and when the executor switches), `hello`
(on connect: the live state and this browser's role). Both come from the executor the lab runs:
in simulated mode the simulated fleet's, times in simulated seconds, each marked (`executor`,
`badge`; an event's `sim`). Browser -> server: `set_levers`, `flood`, `scenario`, `hang_rank`
({"action": "stop" | "resume"}: the failure gallery's stopped rank, engine/lab/live/rank_hang.py),
each answered through the acknowledgement callback with {ok, ...} or {ok: false, error}.

When SERVELAB_INSTRUCTOR_TOKEN is set, only a connection that presents it (auth.token) may
change anything; the others watch. While a class runs (web/classroom.py), its token is an
instructor's too and every other connection watches, told by a new `hello` when a class starts. Only the app's own origin may connect (Socket.IO's default
same-origin check, kept on explicitly in app.py)."""

from __future__ import annotations

import enum
import hmac
import logging
import threading
from collections.abc import Callable
from typing import Any

from flask import request
from flask_socketio import SocketIO

from engine.errors import InvalidParamError, ServingError
from engine.lab.facade import Executor, LabFacade, RankHangAction, Reading
from web.evolution import EVOLUTION
from web.lessons import LessonLibrary

log = logging.getLogger("servelab.live")

NAMESPACE = "/live"
EVENTS_PER_TICK = 60  # more than this in one tick are summarised, so a flood cannot swamp a browser


class Role(enum.StrEnum):
    """A connection's role, told to its page in `hello` (static/app.js reads the word). The server
    decides it from the token presented; no page names its own."""

    OPEN = "open"  # no instructor token is set and no class runs: anyone may change levers
    INSTRUCTOR = "instructor"  # presented the instructor's (or the running class's) token
    VIEWER = "viewer"  # watches: the levers are the instructor's


class LiveChannel:
    def __init__(self, socketio: SocketIO, lab: LabFacade, lessons: LessonLibrary, token: str | None) -> None:
        self.socketio = socketio
        self.lab = lab
        self.lessons = lessons
        self.token = token or None
        self.roles: dict[str, Role] = {}
        # A running class's instructor token (web/classroom.py): while one is set, it is an
        # instructor's too and every other connection watches. Those told of a closed connection:
        self.class_token: Callable[[], str | None] = lambda: None
        self.leave_listeners: list[Callable[[str], None]] = []
        self._presented: dict[str, str | None] = {}
        self._cursor = 0
        self._log = lab.events  # which executor's event log the cursor is in
        self._traces = lab.traces  # which executor's traces the last `trace` tick read
        self._tick_lock = threading.Lock()
        socketio.on_event("connect", self.on_connect, namespace=NAMESPACE)
        socketio.on_event("disconnect", self.on_disconnect, namespace=NAMESPACE)
        socketio.on_event("set_levers", self.on_set_levers, namespace=NAMESPACE)
        socketio.on_event("flood", self.on_flood, namespace=NAMESPACE)
        socketio.on_event("scenario", self.on_scenario, namespace=NAMESPACE)
        socketio.on_event("hang_rank", self.on_hang_rank, namespace=NAMESPACE)
        lab.subscribe(self.publish)  # the live fleet's snapshots, or the simulated fleet's

    # server -> browsers --------------------------------------------------------------------------

    def publish(self, reading: Reading) -> None:
        """From the fleet's snapshot thread: metrics to every browser, then the new events."""
        if not self._tick_lock.acquire(blocking=False):
            return  # the previous tick is still sending: skip rather than pile up
        try:
            view = self.lab.snapshot(reading)
            self.socketio.emit("metrics", view, namespace=NAMESPACE)
            self._publish_trace(view["time"], view["run"])
            log = self.lab.events
            if log is not self._log:  # the executor switched: a simulated fleet's log is read whole
                self._log, self._cursor = log, 0 if view["executor"] == Executor.SIM else log.next_seq
            events, self._cursor = log.since(self._cursor, limit=10_000)
            simulated = view["executor"] == Executor.SIM
            for event in events[:EVENTS_PER_TICK]:
                self.socketio.emit("event", event | {"sim": simulated}, namespace=NAMESPACE)
            if len(events) > EVENTS_PER_TICK:
                kinds: dict[str, int] = {}
                for event in events[EVENTS_PER_TICK:]:
                    kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
                summary = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
                self.socketio.emit(
                    "event", {"kind": "summary", "time": view["time"], "message": f"and {summary}", "sim": simulated},
                    namespace=NAMESPACE,
                )
        finally:
            self._tick_lock.release()

    def _publish_trace(self, time: float, run: int) -> None:
        """One `trace` to every browser: built once a tick, only what changed since the last."""
        traces = self.lab.traces
        full = traces is not self._traces  # the executor switched: the new fleet's window, whole
        self._traces = traces
        if traces is None:  # a remote lab: no engine of ours to trace
            return
        body = traces.take_changes(whole=full)
        self.socketio.emit("trace", {"time": time, "run": run, "full": full, **body}, namespace=NAMESPACE)

    # browser -> server ---------------------------------------------------------------------------

    def on_connect(self, auth: dict | None = None) -> None:
        presented = (auth or {}).get("token") if isinstance(auth, dict) else None
        presented = presented if isinstance(presented, str) else None
        role = self._role(presented)
        self._presented[request.sid] = presented  # type: ignore[attr-defined]
        self.roles[request.sid] = role  # type: ignore[attr-defined]
        self.socketio.emit("hello", {"role": role, "lab": self.lab.live_state().to_json()}, to=request.sid, namespace=NAMESPACE)  # type: ignore[attr-defined]
        traces = self.lab.traces
        if traces is not None:
            trace = {"time": traces.clock.now(), "run": self.lab.run, "full": True, **traces.full()}
            self.socketio.emit("trace", trace, to=request.sid, namespace=NAMESPACE)  # type: ignore[attr-defined]

    def _role(self, presented: str | None) -> Role:
        class_token = self.class_token()
        for token in (self.token, class_token):
            if token and presented and hmac.compare_digest(presented.encode(), token.encode()):
                return Role.INSTRUCTOR
        return Role.OPEN if self.token is None and class_token is None else Role.VIEWER

    def refresh_roles(self) -> None:
        """A class started or ended: each connection's role again, and a new hello to those whose
        role changed (an open browser becomes a watcher the moment a class starts)."""
        for sid, presented in list(self._presented.items()):
            role = self._role(presented)
            if self.roles.get(sid) != role:
                self.roles[sid] = role
                self.socketio.emit("hello", {"role": role, "lab": self.lab.live_state().to_json()}, to=sid, namespace=NAMESPACE)

    def on_disconnect(self, *args: Any) -> None:
        sid = request.sid  # type: ignore[attr-defined]
        self.roles.pop(sid, None)
        self._presented.pop(sid, None)
        for listener in list(self.leave_listeners):
            listener(sid)

    def on_set_levers(self, data: Any) -> dict[str, Any]:
        changes = data if isinstance(data, dict) else None
        return self._guarded(lambda: self.lab.set_levers(changes, "a learner").to_json())  # type: ignore[arg-type]

    def on_flood(self, data: Any) -> dict[str, Any]:
        data = data if isinstance(data, dict) else {}
        return self._guarded(
            lambda: self.lab.flood(data.get("action", ""), data.get("to"), data.get("over_s", 30.0)).to_json()
        )

    def on_hang_rank(self, data: Any) -> dict[str, Any]:
        data = data if isinstance(data, dict) else {}
        return self._guarded(lambda: self.lab.hang_rank(RankHangAction.parse(data.get("action"))).to_json())

    def on_scenario(self, data: Any) -> dict[str, Any]:
        return self._guarded(lambda: self._scenario(data if isinstance(data, dict) else {}))

    def _scenario(self, data: dict[str, Any]) -> dict[str, Any]:
        """{"evolution": i} or {"step": n, "kind": "scenarios" | "failure_modes", "index": i}."""
        if "evolution" in data:
            cards = list(EVOLUTION)
            index = data["evolution"]
        else:
            lesson = self.lessons.step(data.get("step")) if isinstance(data.get("step"), int) else None
            kind = data.get("kind")
            if lesson is None or kind not in ("scenarios", "failure_modes"):
                raise ServingError(400, "name a lesson step and kind (scenarios or failure_modes)", "step")
            cards = lesson.meta[kind]
            index = data.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cards):
            raise ServingError(400, f"index must be 0 to {len(cards) - 1}", "index")
        card = cards[index]
        # Simulated, a card runs its experiment at scale where it has one (web/evolution.py).
        at_scale = self.lab.executor == Executor.SIM and bool(card.get("sim_levers"))
        result = self.lab.set_levers(card["sim_levers" if at_scale else "levers"], source=f"scenario '{card['title']}'")
        watch = card.get("sim_watch") if at_scale else None
        return result.to_json() | {"title": card["title"], "watch": watch or card.get("watch") or card.get("expect")}

    def _guarded(self, action: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            if self.roles.get(request.sid) == Role.VIEWER:  # type: ignore[attr-defined]
                raise ServingError(403, "only the instructor can change levers; you are watching", None, "forbidden")
            return {"ok": True, **action()}
        except ServingError as err:
            return {"ok": False, **err.body()}
        except InvalidParamError as err:
            return {"ok": False, **ServingError(400, err.message, err.param).body()}
