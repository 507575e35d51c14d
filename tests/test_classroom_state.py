"""The class itself (web/classroom_state.py), driven on a clock the test moves: names are checked
and kept as text, the class has a cap and a join rate limit, a join whose page never connects
gives its seat back, a student answers only while a question is open, and the class flood's
total stays within the live engine's ceiling however many join."""

from __future__ import annotations

import pytest

from engine.errors import ServingError
from engine.lab.live_limits import FLOOD_MAX_RATE
from web.classroom_state import (
    ATTACH_WITHIN_S,
    JOIN_BURST,
    NAME_MAX,
    ClassPhase,
    Classroom,
    FloodSettings,
    JoinLimiter,
    Question,
    check_name,
)

pytestmark = pytest.mark.unit


class SteppedClock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def refusal(action, status: int, param: str | None) -> ServingError:
    with pytest.raises(ServingError) as info:
        action()
    assert info.value.status == status and info.value.param == param, info.value.body()
    return info.value


def test_names_are_limited_and_kept_as_the_text_they_are() -> None:
    assert check_name("  Ada \n Lovelace ") == "Ada Lovelace"
    assert check_name("<img src=x onerror=alert(1)>") == "<img src=x onerror=alert(1)>"  # text, escaped where shown
    refusal(lambda: check_name("x" * (NAME_MAX + 1)), 400, "name")
    refusal(lambda: check_name("   "), 400, "name")
    refusal(lambda: check_name(42), 400, "name")
    refusal(lambda: check_name("Ada\u200bLovelace"), 400, "name")  # an invisible character


def test_a_class_has_a_cap_and_a_join_rate_limit() -> None:
    clock = SteppedClock()
    full = Classroom(1, clock=clock, max_students=3)
    for name in ("a", "b", "c"):
        full.join(name)
    err = refusal(lambda: full.join("d"), 429, "code")
    assert err.code == "class_full"

    flood = Classroom(1, clock=clock, limiter=JoinLimiter(clock, burst=JOIN_BURST, rate=2.0))
    for i in range(JOIN_BURST):  # a whole class at once gets in
        flood.join(f"student {i}")
    err = refusal(lambda: flood.join("one more"), 429, "code")
    assert err.code == "join_rate_limited" and err.retry_after_s and err.retry_after_s >= 1
    clock.now += 1.0  # the bucket refills at 2 a second
    flood.join("after a second")
    flood.join("and another")
    refusal(lambda: flood.join("too soon"), 429, "code")


def test_a_join_whose_page_never_connects_gives_its_seat_back() -> None:
    clock = SteppedClock()
    cls = Classroom(1, clock=clock, max_students=2)
    kept = cls.join("kept")
    cls.attach(kept.id, kept.key, "sid-kept")
    cls.join("never opened the page")
    refusal(lambda: cls.join("third"), 429, "code")
    clock.now += ATTACH_WITHIN_S + 1
    third = cls.join("third")
    assert set(cls.students) == {kept.id, third.id}


def test_a_page_attaches_only_with_its_own_key_and_leaving_takes_it_off_the_list() -> None:
    cls = Classroom(2)
    ada, bob = cls.join("Ada"), cls.join("Bob")
    refusal(lambda: cls.attach(ada.id, bob.key, "sid-1"), 403, "student_id")
    refusal(lambda: cls.attach("s-nobody", ada.key, "sid-1"), 403, "student_id")
    cls.attach(ada.id, ada.key, "sid-1")
    assert cls.student_at("sid-1") is ada
    assert cls.leave("sid-1") is ada
    assert list(cls.students) == [bob.id]
    assert [s["name"] for s in cls.state(teacher=True)["students"]] == ["Bob"]
    assert "students" not in cls.state(teacher=False)  # a student's screen lists nobody


def test_answers_count_until_the_reveal_and_only_the_teacher_sees_them_before() -> None:
    q = Question("poll", "Which?", ["a", "b", "c"], 1, ["why a", "why b", "why c"])
    q.answer("s-1", 0)
    q.answer("s-2", 1)
    q.answer("s-1", 1)  # changed their mind
    assert q.counts() == [0, 2, 0]
    student = q.view(teacher=False, student_id="s-1")
    assert "counts" not in student and "correct" not in student and student["mine"] == 1
    assert q.view(teacher=True)["counts"] == [0, 2, 0]
    refusal(lambda: q.answer("s-3", 3), 400, "index")
    refusal(lambda: q.answer("s-3", True), 400, "index")
    q.phase = ClassPhase.REVEALED
    refusal(lambda: q.answer("s-3", 0), 409, "index")
    shown = q.view(teacher=False)
    assert shown["correct"] == 1 and shown["whys"] == ["why a", "why b", "why c"]


def test_the_class_flood_total_stays_within_the_live_ceiling() -> None:
    cls = Classroom(8)
    flood = cls.set_flood("start", {"rate": 5.0, "prompt_tokens": 100, "output_tokens": 20})
    assert flood.running and flood.per_student(10) == 5.0
    assert flood.per_student(60) * 60 == pytest.approx(FLOOD_MAX_RATE)  # 60 x 5 = 300 would pass the ceiling
    assert cls.set_flood("stop", {}).running is False
    refusal(lambda: cls.set_flood("start", {"rate": 0}), 400, "rate")
    refusal(lambda: cls.set_flood("start", {"rate": "fast"}), 400, "rate")
    refusal(lambda: cls.set_flood("start", {"prompt_tokens": 5000}), 400, "prompt_tokens")
    refusal(lambda: cls.set_flood("start", {"output_tokens": 0}), 400, "output_tokens")
    refusal(lambda: cls.set_flood("explode", {}), 400, "action")
    assert cls.flood == FloodSettings(False, 5.0, 100, 20)  # refused settings changed nothing
