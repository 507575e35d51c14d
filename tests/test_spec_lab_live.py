"""Speculative decoding in the live lab: the lever reaches the running replica in place, the lab's
quoting prompts (prompt_style: quote) give the guesses their text, and the snapshot shows it; off
again, the checks stop and every request still completes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.errors import InvalidParamError
from engine.lab.live.lab import LiveLab
from tests.support.live_lab import finished, running_lab
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

LEVERS = {
    "gpu_count": 1, "min_replicas": 1, "max_replicas": 1, "kv_budget_mb": 64, "provision_delay_s": 0.0,
    "request_rate": 0.5, "prompt_tokens": 150, "output_tokens": 40, "prompt_style": "quote",
}  # fmt: skip


@pytest.fixture(scope="module")
def lab() -> Iterator[LiveLab]:
    with running_lab(LEVERS) as lab:
        yield lab


def spec_checks(lab: LiveLab) -> int:
    return sum(r.stats.spec_checks for r in lab.fleet.replicas if r.stats is not None)


def test_the_lever_speculates_in_place_on_quoting_traffic_and_stops_when_moved_back(lab: LiveLab) -> None:
    change = lab.set_levers({"num_speculative_tokens": 4})
    assert not change.rebuild and change.changed == {"num_speculative_tokens": 4}
    lab.flood("start")
    try:
        assert wait_for(lambda: spec_checks(lab) >= 20, 180), spec_checks(lab)
        snap = lab.fleet.snapshot()
        # The answers copy their prompts: most guesses hold, a step makes several tokens.
        assert snap.spec_acceptance is not None and snap.spec_acceptance > 0.5, snap.spec_acceptance
        assert snap.spec_tokens_per_step is not None and snap.spec_tokens_per_step > 2.0, snap.spec_tokens_per_step
        lab.set_levers({"num_speculative_tokens": 0})
        done = finished(lab)
        # The replica takes the change before its next step: once two more requests have ended,
        # the step that was under way when it was sent has reported (its checks counted).
        assert wait_for(lambda: finished(lab) >= done + 2, 120)
        stopped = spec_checks(lab)
        assert wait_for(lambda: finished(lab) >= done + 4, 120)  # requests still complete, plainly
        assert spec_checks(lab) == stopped  # and no step checks guesses any more
    finally:
        lab.flood("stop")
    assert lab.traffic.counts.refused == 0 and not lab.fleet.router.rejected


def test_speculation_with_pipeline_stages_is_refused_before_anything_changes(lab: LiveLab) -> None:
    with pytest.raises(InvalidParamError) as err:
        lab.set_levers({"num_speculative_tokens": 4, "pipeline_parallel": 2, "gpu_count": 2, "max_replicas": 1})
    assert err.value.param == "num_speculative_tokens"
    assert lab.levers["num_speculative_tokens"] == 0 and lab.levers["pipeline_parallel"] == 1
