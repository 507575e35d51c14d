"""One lever dispatch for every lab (engine/lab/lever_routes.py): each lever's route per executor,
the executors' differences named in one table, and a script of lever moves applied alike by the
live lab's traffic and the simulated lab, a rate move during a flood's ramp included."""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import IN_PLACE_FIELDS
from engine.lab.facade import Executor
from engine.lab.lever_routes import ROUTES, Route, by_route, routes_of
from engine.lab.remote.remote_levers import REMOTE_LEVERS
from engine.lab.simulated.lab_sim import SimLab
from engine.lab.traffic import TrafficDriver
from engine.levers import LEVERS, Apply, LeverGroup
from engine.sim.loop import EventLoop

pytestmark = pytest.mark.unit

DEFAULTS = {key: lever.default for key, lever in LEVERS.items()}
# Where the live and simulated labs route a lever differently, and why (the table's docstring).
DIFFERENT = {
    "device": "the simulated GPU: a new simulated fleet; the live engine's device is this machine's",
    "weight_dtype": "the simulator's precision (live: quantization)",
    "kv_dtype": "the simulator's KV precision (live: kv_cache_dtype)",
    "spec_acceptance": "the simulator's stand-in for how often guesses hold",
    "gpu_count": "the simulated deployment's size; live, the device budget the autoscaler scales within",
    "tensor_parallel": "both rebuild; live also rebounds the autoscaler",
    "pipeline_parallel": "both rebuild; live also rebounds the autoscaler",
    "kv_budget_mb": "the live engine's KV budget; the simulator plans the device's memory",
    "quantization": "the live engine's weights (simulated: weight_dtype)",
    "kv_cache_dtype": "the live engine's KV precision (simulated: kv_dtype)",
    "spec_lookup_max": "the live n-gram lookup; simulated guesses are blind",
    "spec_lookup_min": "the live n-gram lookup; simulated guesses are blind",
    "collective_timeout": "a live rank's guard: the simulator has no processes",
    "batch_invariant": "live kernels' reduction order: the simulator has no numbers",
}


def test_every_lever_has_a_route_on_every_executor_and_only_executor_picks_the_mode() -> None:
    for executor in Executor:
        for key in LEVERS:
            routes = routes_of(key, executor)
            assert routes, (executor, key)
            assert (Route.MODE in routes) == (key == "executor"), (executor, key)
            assert Route.MODE not in routes or routes == {Route.MODE}


def test_the_live_and_simulated_labs_differ_only_where_the_table_says() -> None:
    differ = {key for key in LEVERS if ROUTES[Executor.LIVE][key] != ROUTES[Executor.SIM][key]}
    assert differ == set(DIFFERENT)


def test_the_engine_route_is_what_a_running_engine_takes() -> None:
    for executor in (Executor.LIVE, Executor.SIM):
        engine = {key for key in LEVERS if Route.ENGINE in routes_of(key, executor)}
        assert engine <= IN_PLACE_FIELDS, executor
    assert {k for k in LEVERS if Route.REBUILD in routes_of(k, Executor.LIVE)} == {
        k for k, lever in LEVERS.items() if lever.apply == Apply.REBUILD
    }


def test_a_remote_lab_routes_its_own_levers_and_refuses_the_rest() -> None:
    for key in LEVERS:
        routes = routes_of(key, Executor.REMOTE)
        if key == "executor":
            continue
        assert (routes == {Route.REMOTE}) == (key not in REMOTE_LEVERS), key


def test_levers_carry_typed_apply_and_group_that_still_read_as_their_strings() -> None:
    lever = LEVERS["stream_flush"]
    assert lever.apply is Apply.LOAD and lever.group is LeverGroup.DEFENCE
    assert lever.apply == "load" and f"tag-{lever.apply}" == "tag-load"  # the templates' classes
    assert LEVERS["request_rate"].group == ""


def run_to(loop: EventLoop, until: float) -> None:
    """Run the loop's events up to `until`, then its clock to there (time passes between events)."""
    loop.run(until=until)
    loop.clock.advance(until - loop.clock.now())


def test_the_same_script_moves_the_live_and_simulated_traffic_alike() -> None:
    """A flood ramps from 4 to 40 req/s over 10 s; a story-length lever moves mid-ramp (the ramp
    goes on), then the rate lever (the ramp ends, the lever's rate holds), in both labs. Their
    arrivals come from one loop (engine/lab/arrivals.py), seeded alike: every half second of the
    script, both have the same rate and the same number of arrivals."""
    levers = DEFAULTS | {"executor": "sim", "request_rate": 4.0}
    sim = SimLab(levers, lambda snap: None)
    live_levers, loop = dict(levers), EventLoop()
    # No server: each live arrival fails at once on its client thread, but is counted as sent.
    live = TrafficDriver(None, lambda: live_levers, clock=loop.clock, driver=loop)
    sim.start_traffic(ramp_to=40.0, ramp_s=10.0)
    live.start(ramp_to=40.0, ramp_s=10.0)
    script: list[tuple[float, dict[str, Any]]] = [(5.0, {"output_tokens": 300}), (2.0, {"request_rate": 7.0}), (3.0, {})]
    seen, counts = [], []
    for seconds, change in script:
        for _ in range(int(seconds * 2)):
            for each in (sim.loop, loop):
                run_to(each, each.clock.now() + 0.5)
            counts.append((live.sent, sim.sent))
        live_levers |= change
        live.levers_moved(by_route(change, Executor.LIVE)[Route.LOAD])
        sim.apply(change)
        seen.append((round(live.current_rate(), 6), round(sim.current_rate(), 6)))
    sim.stop_traffic()
    live.stop()
    assert seen == [(22.0, 22.0), (7.0, 7.0), (7.0, 7.0)]  # halfway up the ramp, then the lever's rate
    assert live.ramp is None and sim.ramp is None
    assert all(a == b for a, b in counts), counts
    assert counts[-1][0] > 100  # about 4 -> 22 req/s over 5 s, 22 -> 29 over 2 s, then 7 req/s for 3 s
