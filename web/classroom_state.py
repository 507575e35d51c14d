"""A class: one instructor, the students who joined with a code, a class flood, a poll and a
class prediction. Plain state with no Flask in it: web/classroom.py puts it on HTTP and the
/live socket. Every refusal is a ServingError naming the field, so both sides answer the same
OpenAI-style error. Time comes from the clock it is given (the join limiter and the expiry of
joins that never opened their page), so tests drive it without sleeping."""

from __future__ import annotations

import enum
import secrets
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.errors import InvalidParamError, ServingError
from engine.lab.live_limits import FLOOD_MAX_RATE, LIVE_MAX
from engine.levers import LEVERS
from web.predictions import PredictCard

NAME_MAX = 40  # characters of a student's name
PROMPT_MAX_CHARS = 2000  # the student page's prompt box (the API's own limits apply beyond)
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O or 1/I: read off a projector
CODE_LENGTH = 5
MAX_STUDENTS = 60
JOIN_BURST = 40  # a whole class joining at once passes; a script joining in a loop does not
JOIN_RATE_PER_S = 2.0
ATTACH_WITHIN_S = 30.0  # a join whose page never connects gives its seat back after this
FLOOD_RATE_MAX_PER_STUDENT = 5.0  # req/s one browser sends; the class total is capped below
FLOOD_IN_FLIGHT_PER_BROWSER = 4  # browsers open ~6 connections a host; the socket needs one


class ClassPhase(enum.StrEnum):
    """A poll or class prediction: closed, open for answers, applied (a prediction), or revealed."""

    CLOSED = "closed"
    OPEN = "open"
    APPLIED = "applied"  # a prediction's levers are on: answers fixed, the answer not yet shown
    REVEALED = "revealed"


class QuestionKind(enum.StrEnum):
    """What a Question asks; class_answer's `kind` names the one it answers (predict, else the poll)."""

    POLL = "poll"  # the step's decision
    PREDICT = "predict"  # a card's prediction


# The instructor's socket actions (each event's `action`); StrEnums, so a member equals its word.
class ClassFloodAction(enum.StrEnum):  # not engine/lab/flood.py's: no ramp, and a set
    START = "start"
    STOP = "stop"
    SET = "set"  # new settings, running or not as it was


class PollAction(enum.StrEnum):
    OPEN = "open"
    REVEAL = "reveal"
    CLOSE = "close"


class PredictAction(enum.StrEnum):
    ASK = "ask"  # the card's prediction goes to every student
    APPLY = "apply"  # answers fixed, the card's levers go to the engine


Action = TypeVar("Action", ClassFloodAction, PollAction, PredictAction)


def parse_action(kind: type[Action], value: object) -> Action:
    """An event's `action`, or a 400 naming the field and the words it takes."""
    try:
        return kind(value)
    except ValueError:
        *rest, last = kind
        raise ServingError(400, f"action must be {', '.join(rest)} or {last}", "action") from None


@dataclass
class Student:
    id: str
    name: str
    key: str  # the secret the student's own page presents; nobody else holds it
    joined_at: float
    sid: str | None = None  # the /live connection the student's page attached


@dataclass(frozen=True)
class FloodSettings:
    """The class flood as the instructor set it: per-student req/s and the prompts' lengths."""

    running: bool = False
    rate: float = 0.5
    prompt_tokens: int = 64
    output_tokens: int = 32

    def per_student(self, students: int) -> float:
        """The rate each browser sends: the instructor's, held so the class's total stays
        within the live engine's flood ceiling however many joined."""
        return min(self.rate, FLOOD_MAX_RATE / max(1, students))

    def view(self, students: int) -> dict[str, Any]:
        return {
            "running": self.running,
            "rate": self.rate,
            "per_student": self.per_student(students),
            "total": self.per_student(students) * students,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "in_flight_per_browser": FLOOD_IN_FLIGHT_PER_BROWSER,
        }


@dataclass
class Question:
    """A poll (the step's decision) or a class prediction (a card's predict): options, the right
    one, the explanations, and each student's current answer (changeable until the reveal)."""

    kind: QuestionKind
    question: str
    options: list[str]
    correct: int
    whys: list[str]
    phase: ClassPhase = ClassPhase.OPEN
    answers: dict[str, int] = field(default_factory=dict)
    card: PredictCard | None = None  # a prediction's card (the page gets its view())

    def __post_init__(self) -> None:
        self.kind = QuestionKind(self.kind)  # its word works too

    def answer(self, student_id: str, index: Any) -> None:
        if self.phase is not ClassPhase.OPEN:
            raise ServingError(409, f"the {self.kind} is {self.phase.value}: answers are fixed", "index", "closed")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.options):
            raise ServingError(400, f"index must be 0 to {len(self.options) - 1}", "index")
        self.answers[student_id] = index

    def counts(self) -> list[int]:
        return [sum(1 for a in self.answers.values() if a == i) for i in range(len(self.options))]

    def view(self, teacher: bool, student_id: str | None = None) -> dict[str, Any]:
        """What a screen shows: the teacher sees the distribution live; everyone sees the right
        answer and the explanations only once revealed."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "question": self.question,
            "options": self.options,
            "phase": self.phase.value,
            "answered": len(self.answers),
            "card": self.card.view() if self.card is not None else None,
        }
        if teacher or self.phase is ClassPhase.REVEALED:
            out["counts"] = self.counts()
        if self.phase is ClassPhase.REVEALED:
            out |= {"correct": self.correct, "whys": self.whys}
        if student_id is not None:
            out["mine"] = self.answers.get(student_id)
        return out


def check_name(name: Any) -> str:
    """A student's name: a string of 1 to NAME_MAX printable characters, kept as text (pages
    render it with textContent, never as HTML)."""
    if not isinstance(name, str):
        raise ServingError(400, "name must be a string", "name")
    name = " ".join(name.split())  # newlines and runs of spaces collapse
    if not name:
        raise ServingError(400, "name must not be empty", "name")
    if len(name) > NAME_MAX:
        raise ServingError(400, f"name must be at most {NAME_MAX} characters, got {len(name)}", "name")
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn") for ch in name):
        raise ServingError(400, "name holds control or invisible characters", "name")
    return name


def check_flood(data: dict[str, Any], current: FloodSettings) -> FloodSettings:
    """The instructor's class-flood settings, each within the lever's range and the live engine's."""
    values = {"rate": current.rate, "prompt_tokens": current.prompt_tokens, "output_tokens": current.output_tokens}
    for key in values:
        if key not in data:
            continue
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ServingError(400, f"{key} must be a number", key)
        if key == "rate":
            if not 0 < value <= FLOOD_RATE_MAX_PER_STUDENT:
                raise ServingError(
                    400, f"rate must be in (0, {FLOOD_RATE_MAX_PER_STUDENT:g}] req/s per student", "rate"
                )
            values[key] = float(value)
            continue
        try:
            checked = LEVERS[key].validate(value)
        except InvalidParamError as err:
            raise ServingError(400, err.message, key) from err
        if checked > LIVE_MAX[key]:
            raise ServingError(400, f"{key} must be at most {LIVE_MAX[key]} on the live engine", key)
        values[key] = int(checked)
    return FloodSettings(
        current.running, float(values["rate"]), int(values["prompt_tokens"]), int(values["output_tokens"])
    )


class JoinLimiter:
    """A token bucket over a class's joins: a burst the size of a class, then a trickle."""

    def __init__(self, clock: Callable[[], float], burst: int = JOIN_BURST, rate: float = JOIN_RATE_PER_S) -> None:
        self.clock, self.burst, self.rate = clock, burst, rate
        self.tokens, self.at = float(burst), clock()

    def take(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            wait = int((1 - self.tokens) / self.rate) + 1
            raise ServingError(429, f"too many joins at once: try again in {wait} s", "code", "join_rate_limited", wait)
        self.tokens -= 1


class Classroom:
    """One running class. token: the instructor's (the env token where one is set, else minted)."""

    def __init__(
        self,
        step: int,
        token: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_students: int = MAX_STUDENTS,
        limiter: JoinLimiter | None = None,
    ) -> None:
        self.code = "".join(secrets.choice(CODE_LETTERS) for _ in range(CODE_LENGTH))
        self.token = token or secrets.token_urlsafe(24)
        self.step = step
        self.clock = clock
        self.max_students = max_students
        self.limiter = limiter or JoinLimiter(clock)
        self.students: dict[str, Student] = {}
        self.flood = FloodSettings()
        self.poll: Question | None = None
        self.predict: Question | None = None
        self.teacher_sids: set[str] = set()

    def join(self, name: Any) -> Student:
        name = check_name(name)
        self._expire_unattached()
        if len(self.students) >= self.max_students:
            raise ServingError(429, f"the class is full ({self.max_students} students)", "code", "class_full", 30)
        self.limiter.take()
        student = Student("s-" + secrets.token_hex(4), name, secrets.token_urlsafe(16), self.clock())
        self.students[student.id] = student
        return student

    def attach(self, student_id: Any, key: Any, sid: str) -> Student:
        """The student's own page connects: it must present the key it was given at join."""
        student = self.students.get(student_id) if isinstance(student_id, str) else None
        if student is None or not isinstance(key, str) or not secrets.compare_digest(key, student.key):
            raise ServingError(403, "not a student of this class (join again)", "student_id", "forbidden")
        student.sid = sid
        return student

    def student_at(self, sid: str) -> Student | None:
        return next((s for s in self.students.values() if s.sid == sid), None)

    def leave(self, sid: str) -> Student | None:
        """A student's connection closed: they leave the list (the caller cancels their requests)."""
        student = self.student_at(sid)
        if student is not None:
            del self.students[student.id]
        self.teacher_sids.discard(sid)
        return student

    def _expire_unattached(self) -> None:
        now = self.clock()
        for sid in [s.id for s in self.students.values() if s.sid is None and now - s.joined_at > ATTACH_WITHIN_S]:
            del self.students[sid]

    def set_flood(self, action: Any, data: dict[str, Any]) -> FloodSettings:
        act = parse_action(ClassFloodAction, action)
        settings = check_flood(data, self.flood)
        running = {ClassFloodAction.START: True, ClassFloodAction.STOP: False}.get(act, self.flood.running)
        self.flood = FloodSettings(running, settings.rate, settings.prompt_tokens, settings.output_tokens)
        return self.flood

    def state(self, teacher: bool, student_id: str | None = None) -> dict[str, Any]:
        n = len(self.students)
        out: dict[str, Any] = {
            "code": self.code,
            "step": self.step,
            "student_count": n,
            "flood": self.flood.view(n),
            "poll": self.poll.view(teacher, student_id) if self.poll else None,
            "predict": self.predict.view(teacher, student_id) if self.predict else None,
        }
        if teacher:
            out["students"] = [
                {"id": s.id, "name": s.name, "attached": s.sid is not None} for s in self.students.values()
            ]
        return out
