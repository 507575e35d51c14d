"""Classroom mode's authority and bad input, through a real `python app.py` (no
SERVELAB_INSTRUCTOR_TOKEN: starting a class mints the class's token) over HTTP and real
Socket.IO clients: a second instructor gets 409, an unknown code 404 (page, API and socket), a
bad name 400 naming `name`, a flood of joins 429; open browsers start watching when a class
starts; a student cannot move a lever, start a flood (the lab's or the class's), open or reveal
a poll, ask a prediction, end the class, or answer for another student; a class prediction's
guesses reach the instructor as a distribution and are fixed once its levers move; a student who
disconnects leaves the list and their request still in the engine is cancelled."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import socketio

from tests.support.server_process import ServerProcess, kv_budget_mb
from web.classroom_state import JOIN_BURST, NAME_MAX
from web.lessons import LessonLibrary
from web.predictions import predict_cards

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "8", "--drain-timeout-s", "3", command=("app.py",))
    yield proc
    proc.stop()


class Watcher:
    """One real Socket.IO client on /live, keeping what the server told it."""

    def __init__(self, server: ServerProcess, token: str = "") -> None:
        self.client = socketio.Client(reconnection=False)
        self.hellos: list[dict[str, Any]] = []
        self.states: list[dict[str, Any]] = []
        self.client.on("hello", self.hellos.append, namespace="/live")
        self.client.on("class_state", self.states.append, namespace="/live")
        self.client.connect(
            server.base_url, namespaces=["/live"], auth={"token": token}, transports=["websocket"], wait_timeout=30
        )
        wait_until(lambda: self.hellos)

    @property
    def role(self) -> str:
        return self.hellos[-1]["role"]

    def call(self, event: str, data: Any = None) -> dict[str, Any]:
        return self.client.call(event, data, namespace="/live", timeout=30)

    def close(self) -> None:
        self.client.disconnect()


def wait_until(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out waiting")


def post(server: ServerProcess, path: str, body: Any, headers: dict | None = None) -> tuple[int, dict, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=raw, headers={"Content-Type": "application/json", **(headers or {})})
    response = conn.getresponse()
    payload = json.loads(response.read() or b"{}")
    conn.close()
    return response.status, payload, dict(response.getheaders())


@pytest.fixture
def teacher(server: ServerProcess) -> Iterator[tuple[Watcher, dict[str, Any]]]:
    """A running class and its instructor's socket; the class ends afterwards."""
    status, started, _ = post(server, "/class/new", {"step": 4})
    assert status == 201, started
    watcher = Watcher(server, started["token"])
    assert watcher.role == "instructor"
    assert watcher.call("class_teach", {"code": started["code"]})["ok"]
    yield watcher, started
    assert watcher.call("class_end")["ok"]
    watcher.close()


def student(server: ServerProcess, code: str, name: str) -> tuple[Watcher, dict[str, Any]]:
    status, joined, _ = post(server, f"/join/{code}", {"name": name})
    assert status == 201, joined
    watcher = Watcher(server)
    ack = watcher.call("class_attach", {"code": code, "student_id": joined["student_id"], "key": joined["key"]})
    assert ack["ok"], ack
    return watcher, joined


def test_starting_a_class_makes_open_browsers_watchers_and_a_second_instructor_gets_409(server: ServerProcess) -> None:
    before = Watcher(server)
    assert before.role == "open"  # no env token, no class: anyone may move the levers
    status, started, _ = post(server, "/class/new", {"step": 2})
    assert status == 201 and len(started["code"]) == 5 and started["join_url"] == f"/join/{started['code']}"
    wait_until(lambda: before.role == "viewer")  # told at once: the class's instructor holds the levers now
    refused = before.call("set_levers", {"request_rate": 1.5})
    assert refused["ok"] is False and refused["error"]["code"] == "forbidden"

    status, second, _ = post(server, "/class/new", {"step": 2})
    assert status == 409 and second["error"]["code"] == "class_running", second
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/class/new")
    page = conn.getresponse()
    assert page.status == 409 and b"already running" in page.read()
    conn.close()
    status, again, _ = post(server, "/class/new", {"step": 2, "token": started["token"]})
    assert status == 201 and again["code"] == started["code"]  # the instructor's own browser, again

    instructor = Watcher(server, started["token"])
    assert instructor.role == "instructor"
    assert instructor.call("set_levers", {"request_rate": 1.0})["ok"]
    assert instructor.call("class_end")["ok"]
    wait_until(lambda: before.role == "open")  # the class is over: the lab is everyone's again
    for watcher in (before, instructor):
        watcher.close()


def test_unknown_codes_and_bad_names_get_clear_errors(server: ServerProcess, teacher: tuple[Watcher, dict]) -> None:
    _, started = teacher
    status, body, _ = post(server, "/join/NOPE9", {"name": "Ada"})
    assert status == 404 and body["error"]["param"] == "code" and body["error"]["code"] == "class_not_found"
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("GET", "/join/NOPE9")
    page = conn.getresponse()
    assert page.status == 404 and b"no class has the join code" in page.read()
    conn.close()
    lost = Watcher(server)
    ack = lost.call("class_attach", {"code": "NOPE9", "student_id": "s-1", "key": "k"})
    assert ack["ok"] is False and ack["error"]["param"] == "code" and ack["error"]["type"] == "not_found_error"
    lost.close()

    code = started["code"]
    for name, words in (("x" * (NAME_MAX + 1), "at most"), ("   ", "empty"), (7, "string"), (None, "string")):
        status, body, _ = post(server, f"/join/{code}", {"name": name})
        assert status == 400 and body["error"]["param"] == "name" and words in body["error"]["message"], body
    status, body, _ = post(server, f"/join/{code}", b"not json")
    assert status == 400 and body["error"]["param"] == "name"
    status, body, _ = post(server, "/class/new", {"step": 99})
    assert status == 400 and body["error"]["param"] == "step"
    status, body, _ = post(server, "/class/new", [1, 2])
    assert status == 400 and "JSON object" in body["error"]["message"]
    status, body, _ = post(server, f"/join/{code.lower()}", {"name": "<img src=x onerror=alert(1)>"})
    assert (
        status == 201 and body["name"] == "<img src=x onerror=alert(1)>"
    )  # kept as text; pages never render it as HTML


def test_a_student_holds_no_authority_and_answers_only_for_itself(
    server: ServerProcess, teacher: tuple[Watcher, dict]
) -> None:
    instructor, started = teacher
    code = started["code"]
    ada, ada_id = student(server, code, "Ada")
    bob, bob_id = student(server, code, "Bob")
    assert ada.role == "viewer"
    refusals = {
        "set_levers": ada.call("set_levers", {"max_num_seqs": 2}),
        "lab flood": ada.call("flood", {"action": "start"}),
        "class flood": ada.call("class_flood", {"action": "start", "rate": 5}),
        "open a poll": ada.call("class_poll", {"action": "open"}),
        "reveal": ada.call("class_poll", {"action": "reveal"}),
        "ask a prediction": ada.call("class_predict", {"action": "ask", "index": 0}),
        "apply it": ada.call("class_predict", {"action": "apply"}),
        "end the class": ada.call("class_end"),
        "be the teacher": ada.call("class_teach", {"code": code}),
    }
    for what, ack in refusals.items():
        assert ack["ok"] is False and ack["error"]["code"] == "forbidden", (what, ack)
    stolen = ada.call("class_attach", {"code": code, "student_id": bob_id["student_id"], "key": ada_id["key"]})
    assert stolen["ok"] is False and stolen["error"]["param"] == "student_id"

    assert instructor.call("class_poll", {"action": "open"})["ok"]
    assert ada.call("class_answer", {"kind": "poll", "index": 1})["ok"]
    cheat = ada.call("class_answer", {"kind": "poll", "index": 0, "student_id": bob_id["student_id"]})
    assert cheat["ok"] is False and cheat["error"]["param"] == "student_id"
    bad = bob.call("class_answer", {"kind": "poll", "index": 99})
    assert bad["ok"] is False and bad["error"]["param"] == "index"
    assert bob.call("class_answer", {"kind": "poll", "index": 1})["ok"]
    counts = wait_until(
        lambda: instructor.states and instructor.states[-1]["poll"] and instructor.states[-1]["poll"]["answered"] == 2
    )
    assert counts and instructor.states[-1]["poll"]["counts"][1] == 2
    assert "counts" not in ada.states[-1]["poll"]  # the distribution is the instructor's until the reveal
    assert instructor.call("class_poll", {"action": "reveal"})["ok"]
    revealed = wait_until(lambda: ada.states[-1]["poll"] if ada.states[-1]["poll"]["phase"] == "revealed" else None)
    assert isinstance(revealed["correct"], int) and len(revealed["whys"]) == len(revealed["options"])
    late = bob.call("class_answer", {"kind": "poll", "index": 0})
    assert late["ok"] is False and late["error"]["code"] == "closed"

    too_fast = instructor.call("class_flood", {"action": "start", "rate": 50})
    assert too_fast["ok"] is False and too_fast["error"]["param"] == "rate"
    started_flood = instructor.call(
        "class_flood", {"action": "start", "rate": 0.2, "prompt_tokens": 16, "output_tokens": 4}
    )
    assert started_flood["ok"] and started_flood["flood"]["running"]
    wait_until(lambda: ada.states[-1]["flood"]["running"] and ada.states[-1]["flood"]["per_student"] == 0.2)
    assert instructor.call("class_flood", {"action": "stop"})["ok"]
    for watcher in (ada, bob):
        watcher.close()


def test_a_class_prediction_collects_guesses_then_applies_the_cards_levers(
    server: ServerProcess, teacher: tuple[Watcher, dict]
) -> None:
    instructor, started = teacher
    card = predict_cards(LessonLibrary().step(4).meta)[0]  # the class's step: 4
    ada, _ = student(server, started["code"], "Ada")
    bob, _ = student(server, started["code"], "Bob")
    applied: list[dict[str, Any]] = []
    ada.client.on("class_applied", applied.append, namespace="/live")
    early = instructor.call("class_predict", {"action": "apply"})
    assert early["ok"] is False and early["error"]["code"] == "no_prediction"
    bad = instructor.call("class_predict", {"action": "ask", "index": 99})
    assert bad["ok"] is False and bad["error"]["param"] == "index"
    assert instructor.call("class_predict", {"action": "ask", "index": 0})["ok"]
    asked = wait_until(lambda: ada.states and ada.states[-1]["predict"])
    assert asked["question"] == card.question and "correct" not in asked and "counts" not in asked
    assert ada.call("class_answer", {"kind": "predict", "index": card.answer})["ok"]
    assert bob.call("class_answer", {"kind": "predict", "index": (card.answer + 1) % len(card.options)})["ok"]
    wait_until(lambda: instructor.states[-1]["predict"]["answered"] == 2)
    counts = instructor.states[-1]["predict"]["counts"]
    assert counts[card.answer] == 1 and sum(counts) == 2  # the instructor sees the distribution of guesses
    ack = instructor.call("class_predict", {"action": "apply"})
    levers = LessonLibrary().step(4).meta[card.kind][card.index]["levers"]  # the card's, resolved
    assert ack["ok"] and ack["levers"]["max_num_seqs"] == levers["max_num_seqs"]
    assert ack["levers"]["request_rate"] == pytest.approx(levers["request_rate"])
    wait_until(lambda: applied)
    assert applied[0]["correct"] == card.answer and applied[0]["card"]["metric"] == card.metric
    late = bob.call("class_answer", {"kind": "predict", "index": 0})
    assert late["ok"] is False and late["error"]["code"] == "closed"  # guesses are fixed once the levers move
    assert instructor.call("set_levers", {"max_num_seqs": 8})["ok"]
    for watcher in (ada, bob):
        watcher.close()


def test_a_flood_of_joins_gets_429(server: ServerProcess, teacher: tuple[Watcher, dict]) -> None:
    _, started = teacher
    statuses = []
    for i in range(JOIN_BURST + 5):
        status, body, headers = post(server, f"/join/{started['code']}", {"name": f"bot {i}"})
        statuses.append(status)
        if status == 429:
            assert body["error"]["code"] in ("join_rate_limited", "class_full") and int(headers["Retry-After"]) >= 1
            break
    assert statuses[-1] == 429 and statuses.count(201) >= JOIN_BURST - 1, statuses


def test_a_student_who_disconnects_leaves_and_their_request_is_cancelled(
    server: ServerProcess, teacher: tuple[Watcher, dict]
) -> None:
    instructor, started = teacher
    ada, joined = student(server, started["code"], "Ada")
    wait_until(lambda: any(s["name"] == "Ada" for s in (instructor.states[-1:] or [{}])[0].get("students", [])))
    tokens: list[str] = []
    reasons: list[str] = []
    ended = threading.Event()

    def stream() -> None:  # a long answer, with Ada's id as the OpenAI `user`
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        body = {
            "prompt": "Count slowly:",
            "max_tokens": 1500,
            "stream": True,
            "user": joined["student_id"],
            "ignore_eos": True,
        }
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        for line in conn.getresponse():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[6:])
                tokens.extend(c.get("text", "") for c in chunk.get("choices", []))
                reasons.extend(c["finish_reason"] for c in chunk.get("choices", []) if c.get("finish_reason"))
        ended.set()

    threading.Thread(target=stream, daemon=True).start()
    wait_until(lambda: len(tokens) > 3, 60)
    left_at = time.monotonic()
    ada.close()  # the page goes away; its HTTP stream stays open
    wait_until(lambda: not any(s["name"] == "Ada" for s in instructor.states[-1].get("students", [])))
    # The HTTP stream itself stayed open: the server cancelled the request (finish_reason abort).
    assert ended.wait(30), "the request went on after its student left"
    assert reasons == ["abort"] and len(tokens) < 1500, (reasons, len(tokens))
    took = time.monotonic() - left_at
    assert took < 20, f"the request ended {took:.1f} s after its student left: within 20 s"
