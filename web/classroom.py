"""Classroom mode: `/class/new` (the instructor starts a class and gets a short join code),
`/class/CODE/teach` (the instructor's view), `/join/CODE` (a student gives a name and gets a
student id), and the class's events on the /live socket.

Authority: the instructor token is the only one. Where SERVELAB_INSTRUCTOR_TOKEN is set,
starting a class needs it and it is the class's token; unset, starting a class mints one, kept
in that browser (a cookie for the pages, localStorage for the socket), and until the class ends
every other connection watches (web/live.py's roles). A student's page attaches to its student
with the key it got at join, so it answers only for itself; it never holds a lever.

Browser -> server (each acknowledged {ok, ...} or {ok: false, error}): `class_teach` (the
instructor's page), `class_attach` (a student's page), `class_flood`, `class_poll`,
`class_predict`, `class_end` (instructor only), `class_answer` (a student, for itself).
Server -> browser: `class_state` (the teacher's carries the students and the distributions)."""

from __future__ import annotations

import hmac
import json
import threading
from typing import Any

from flask import Blueprint, Flask, Response, current_app, redirect, render_template, request

from engine.errors import ServingError
from web.classroom_state import (
    NAME_MAX,
    PROMPT_MAX_CHARS,
    ClassPhase,
    Classroom,
    PollAction,
    PredictAction,
    Question,
    QuestionKind,
    parse_action,
)
from web.lessons import CHARTS
from web.live import NAMESPACE, LiveChannel, Role
from web.openai_api import error_response
from web.predictions import PREDICT_METRICS, predict_cards

COOKIE = "servelab_class"
classroom = Blueprint("classroom", __name__)


class ClassRegistry:
    """The running class (one at a time: there is one engine to share) and its socket side."""

    def __init__(self, live: LiveChannel, env_token: str | None) -> None:
        self.live = live
        self.env_token = env_token
        self.current: Classroom | None = None
        self.lock = threading.RLock()
        live.class_token = lambda: None if self.current is None else self.current.token
        live.leave_listeners.append(self.on_leave)
        for name in ("teach", "attach", "flood", "poll", "predict", "answer", "end"):
            live.socketio.on_event(f"class_{name}", self._handler(getattr(self, f"on_{name}")), namespace=NAMESPACE)

    # the class itself ----------------------------------------------------------------------------

    def start(self, step: Any, presented: str | None) -> Classroom:
        lessons = self.live.lessons
        if not isinstance(step, int) or isinstance(step, bool) or lessons.step(step) is None:
            raise ServingError(400, "step must be the step number of a lesson", "step")
        with self.lock:
            if self.env_token and not _same(presented, self.env_token):
                raise ServingError(403, "starting a class needs the instructor token", "token", "forbidden")
            if self.current is not None:
                if _same(presented, self.current.token):
                    return self.current
                raise ServingError(
                    409,
                    "a class is already running on this engine; its instructor's browser holds it",
                    "code",
                    "class_running",
                )
            self.current = Classroom(step, self.env_token)
        self.live.refresh_roles()  # open browsers watch from now on
        return self.current

    def find(self, code: str) -> Classroom:
        cls = self.current
        if cls is None or code.upper() != cls.code:
            raise ServingError(404, f"no class has the join code {code[:16]!r}", "code", "class_not_found")
        return cls

    # socket handlers -------------------------------------------------------------------------------

    def _handler(self, action: Any) -> Any:
        def handle(data: Any = None) -> dict[str, Any]:
            try:
                with self.lock:
                    result = action(request.sid, data if isinstance(data, dict) else {})  # type: ignore[attr-defined]
                self.broadcast()
                return {"ok": True, **result}
            except ServingError as err:
                return {"ok": False, **err.body()}

        return handle

    def _class_of(self, data: dict[str, Any]) -> Classroom:
        code = data.get("code")
        return self.find(code if isinstance(code, str) else "")

    def _teacher(self, sid: str) -> Classroom:
        cls = self.current
        if cls is None:
            raise ServingError(404, "no class is running", "code", "class_not_found")
        if self.live.roles.get(sid) != Role.INSTRUCTOR:
            raise ServingError(403, "only the instructor can do that; you are in the class", None, "forbidden")
        return cls

    def on_teach(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        cls = self._class_of(data)
        self._teacher(sid)
        cls.teacher_sids.add(sid)
        return {"state": cls.state(teacher=True)}

    def on_attach(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        cls = self._class_of(data)
        student = cls.attach(data.get("student_id"), data.get("key"), sid)
        return {
            "state": cls.state(teacher=False, student_id=student.id),
            "student": {"id": student.id, "name": student.name},
        }

    def on_flood(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        cls = self._teacher(sid)
        cls.set_flood(data.get("action"), data)
        return {"flood": cls.flood.view(len(cls.students))}

    def on_poll(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        cls = self._teacher(sid)
        action = parse_action(PollAction, data.get("action"))
        if action is PollAction.OPEN:
            decision = self.live.lessons.step(cls.step).meta["decision"]  # type: ignore[union-attr]
            options = decision["options"]
            cls.poll = Question(
                QuestionKind.POLL,
                decision["question"],
                [o["text"] for o in options],
                next(i for i, o in enumerate(options) if o["correct"]),
                [o["why"] for o in options],
            )
        elif cls.poll is None:
            raise ServingError(409, "no poll is open", "action", "no_poll")
        elif action is PollAction.REVEAL:
            cls.poll.phase = ClassPhase.REVEALED
        else:
            cls.poll = None
        return {}

    def on_predict(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        """ask: a card's prediction goes to every student; apply: answers are fixed and the
        card's levers go to the live engine (each page then reads its own before and after)."""
        cls = self._teacher(sid)
        action = parse_action(PredictAction, data.get("action"))
        if action is PredictAction.ASK:
            cards = predict_cards(self.live.lessons.step(cls.step).meta, numbers=False)  # type: ignore[union-attr]
            index = data.get("index")
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(cards):
                raise ServingError(400, f"index must be 0 to {len(cards) - 1}", "index")
            card = cards[index]
            cls.predict = Question(
                QuestionKind.PREDICT,
                card.question,
                card.options,
                card.answer,
                [],
                card=card,
            )
            return {}
        if cls.predict is None or cls.predict.card is None:  # apply
            raise ServingError(409, "ask a prediction first", "action", "no_prediction")
        card = cls.predict.card
        lesson = self.live.lessons.step(cls.step)
        levers = lesson.meta[card.kind][card.index]["levers"]  # type: ignore[union-attr]
        result = self.live.lab.set_levers(levers, source=f"class prediction '{card.title}'")
        cls.predict.phase = ClassPhase.APPLIED
        # Each page takes its own "before" now and its "after" settle_s later, then shows the answer.
        applied = {"card": card.view(), "correct": cls.predict.correct}
        self.live.socketio.emit("class_applied", applied, namespace=NAMESPACE, to=self._room_sids(cls))
        return {"levers": result.levers}

    def on_answer(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        cls = self._class_of(data) if "code" in data else self.current
        student = cls.student_at(sid) if cls else None
        if cls is None or student is None:
            raise ServingError(403, "only a student of the class can answer", None, "forbidden")
        claimed = data.get("student_id")
        if claimed is not None and claimed != student.id:
            raise ServingError(403, "you can answer only for yourself", "student_id", "forbidden")
        question = cls.predict if data.get("kind") == QuestionKind.PREDICT else cls.poll
        if question is None:
            raise ServingError(409, "nothing is open to answer", "kind", "closed")
        question.answer(student.id, data.get("index"))
        return {"mine": data.get("index")}

    def on_end(self, sid: str, data: dict[str, Any]) -> dict[str, Any]:
        cls = self._teacher(sid)
        sids = self._room_sids(cls)
        self.current = None
        self.live.socketio.emit("class_state", {"code": cls.code, "ended": True}, namespace=NAMESPACE, to=sids)
        self.live.refresh_roles()
        return {"ended": cls.code}

    # leaving, and what every screen is told -------------------------------------------------------

    def on_leave(self, sid: str) -> None:
        """A page closed or lost its connection: a student leaves the list and their requests
        still in the engine are cancelled (the lab finds them by their `user`)."""
        with self.lock:
            cls = self.current
            student = cls.leave(sid) if cls else None
        if student is None:
            return
        self.live.lab.cancel_user(student.id)
        self.broadcast()

    def _room_sids(self, cls: Classroom) -> list[str]:
        return [*cls.teacher_sids, *(s.sid for s in cls.students.values() if s.sid)]

    def broadcast(self) -> None:
        with self.lock:
            cls = self.current
            if cls is None:
                return
            messages = [(sid, cls.state(teacher=True)) for sid in cls.teacher_sids]
            messages += [(s.sid, cls.state(False, s.id)) for s in cls.students.values() if s.sid]
        for sid, state in messages:
            self.live.socketio.emit("class_state", state, namespace=NAMESPACE, to=sid)


def _same(presented: str | None, token: str | None) -> bool:
    if not presented or not token:
        return False
    return hmac.compare_digest(presented.encode(), token.encode())


# HTTP ---------------------------------------------------------------------------------------------


def registry() -> ClassRegistry:
    return current_app.extensions["servelab_classroom"]


def _json_body() -> dict[str, Any] | None:
    """The request's JSON object; None for a form post; a 400 for JSON that is not an object."""
    if not request.is_json:
        return None
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ServingError(400, "the body must be a JSON object", None)
    return body


def _presented(body: dict[str, Any] | None = None) -> str | None:
    for value in (
        request.args.get("token"),
        (body or {}).get("token"),
        request.form.get("token"),
        request.cookies.get(COOKIE),
    ):
        if isinstance(value, str) and value:
            return value
    return None


def _page_error(err: ServingError) -> tuple[str, int]:
    return _render("class_error.html", error=err), err.status


def _render(template: str, **context: Any) -> str:
    live = registry().live
    return render_template(
        template, lessons=live.lessons.lessons(), live=live.lab.live_state().to_json(), chart_titles=CHARTS, **context
    )


@classroom.get("/class/new")
def new_class() -> Any:
    reg = registry()
    cls, presented = reg.current, _presented()
    if cls is not None:
        if _same(presented, cls.token):
            return redirect(f"/class/{cls.code}/teach", 303)
        return _page_error(
            ServingError(
                409,
                "a class is already running on this engine; only its instructor's browser can open it",
                "code",
                "class_running",
            )
        )
    return _render("class_new.html", needs_token=bool(reg.env_token), token=request.args.get("token", ""))


@classroom.post("/class/new")
def start_class() -> Any:
    try:
        body = _json_body()
    except ServingError as err:
        return error_response(err)
    raw_step = body.get("step", 1) if body is not None else request.form.get("step", "1")
    step = int(raw_step) if isinstance(raw_step, str) and raw_step.isdigit() else raw_step
    try:
        cls = registry().start(step, _presented(body))
    except ServingError as err:
        return error_response(err) if body is not None else _page_error(err)
    if body is not None:
        payload = {"code": cls.code, "token": cls.token, "step": cls.step, "join_url": f"/join/{cls.code}"}
        response: Response = current_app.response_class(json.dumps(payload), status=201, mimetype="application/json")
    else:
        response = redirect(f"/class/{cls.code}/teach", 303)
    response.set_cookie(COOKIE, cls.token, httponly=True, samesite="Strict", path="/class")
    return response


@classroom.get("/class/<code>/teach")
def teach(code: str) -> Any:
    try:
        cls = registry().find(code)
    except ServingError as err:
        return _page_error(err)
    if not _same(_presented(), cls.token):
        return _page_error(
            ServingError(
                403,
                "this is the instructor's view; it opens in the browser that started the class",
                "token",
                "forbidden",
            )
        )
    lesson = registry().live.lessons.step(cls.step)
    return _render(
        "class_teach.html",
        cls=cls,
        lesson=lesson,
        token=cls.token,
        join_url=f"{request.host_url.rstrip('/')}/join/{cls.code}",
        cards=predict_cards(lesson.meta, numbers=False),  # type: ignore[union-attr]
    )


@classroom.get("/join/<code>")
def join_page(code: str) -> Any:
    try:
        cls = registry().find(code)
    except ServingError as err:
        return _page_error(err)
    lesson = registry().live.lessons.step(cls.step)
    return _render("class_join.html", cls=cls, lesson=lesson, name_max=NAME_MAX, prompt_max=PROMPT_MAX_CHARS)


@classroom.post("/join/<code>")
def join(code: str) -> Response:
    try:
        cls = registry().find(code)
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            raise ServingError(400, "send a JSON object with your name", "name")
        with registry().lock:
            student = cls.join(body.get("name"))
    except ServingError as err:
        return error_response(err)
    registry().broadcast()
    payload = {"student_id": student.id, "key": student.key, "name": student.name, "code": cls.code}
    return current_app.response_class(json.dumps(payload), status=201, mimetype="application/json")


def install_classroom(app: Flask, live: LiveChannel, env_token: str | None) -> ClassRegistry:
    reg = ClassRegistry(live, env_token)
    app.extensions["servelab_classroom"] = reg
    app.jinja_env.globals["predict_metrics"] = PREDICT_METRICS  # a card's prediction names its metric's words
    app.register_blueprint(classroom)
    return reg
