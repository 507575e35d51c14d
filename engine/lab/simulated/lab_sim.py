"""The simulated lab: the serving stack's own Fleet, Router and Autoscaler over SimReplicas on one
EventLoop, fed open-ended by arrivals drawn from the levers (the lab's traffic generator's
gamma gaps, lengths and prompts: a shared system prompt, conversations, as prompt_mix.py draws
them), and advanced by a wall-clock pacer at `sim_speed` simulated seconds per wall second, so a
browser watches a 64-GPU fleet while the page is open.

Only the pacer reads wall time (the injected wall clock): its tick runs on a WallClockDriver, as
the live fleet's steps do. Everything it advances runs on the loop's VirtualClock. The fleet publishes snapshots
at its own SNAPSHOT_HZ of simulated time; the pacer ticks SNAPSHOT_HZ times a wall second and
hands one snapshot per tick to its subscriber (the newest, or a fresh one when the fleet runs
slower than asked), so the stream keeps its >= 5 a second at any speed and never swamps a
browser at 60x.

With prefill_gpus and decode_gpus both set, the fleet is two pools, each a Fleet of its own
(prefill replicas compute the prompt and the first token, then the KV goes to a decode
replica, as engine/sim/run.py does) with one shared event log; autoscaling is colocated only.
What the levers mean to the simulator, and its refusals, are engine/lab/simulated/lab_check.py's."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any, Protocol

from engine.clock import WALL_CLOCK, Clock
from engine.config import EngineConfig
from engine.core.sequence import FinishReason
from engine.lab.arrivals import Arrivals, Ramp
from engine.lab.envelope import Facts
from engine.lab.facade import Executor, SimState
from engine.lab.lever_routes import Route, by_route
from engine.lab.replica_bounds import replica_bounds
from engine.lab.shape import min_tensor_parallel
from engine.lab.simulated.lab_check import BADGE_LEVERS, badge, check_sim, fits
from engine.lab.simulated.pools import merge_pools
from engine.sampling_params import SamplingParams
from engine.serving.driver import Driver, WallClockDriver
from engine.serving.load.loadgen import draw_length
from engine.serving.load.prompt_mix import Conversations, OpenTurns, PromptMix, compact_system_ids, next_turn
from engine.serving.routing.defences import Defences
from engine.serving.routing.router import AdmissionError, RouterConfig
from engine.serving.scaling.autoscaler import TARGET_LEVERS, Autoscaler, AutoscalerConfig
from engine.serving.scaling.fleet import SNAPSHOT_HZ, Fleet, FleetConfig
from engine.serving.telemetry.events import EventLog
from engine.serving.telemetry.snapshot import FleetSnapshot
from engine.sim import constants as C
from engine.sim.assembly import kv_transfer_s, sim_fleet
from engine.sim.loop import EventLoop
from engine.sim.workload import SimRequest

PACER_HZ = SNAPSHOT_HZ  # wall ticks a second; each runs the loop up to now * sim_speed and sends one snapshot
MAX_LAG_S = 0.5  # a slice the simulation cannot keep up with is dropped, not made up in a burst


class Pacer(Driver, Protocol):
    """What ticks a simulated lab: a Driver that can be stopped and says whether it runs."""

    def stop(self, timeout: float = 5.0) -> None: ...

    @property
    def running(self) -> bool: ...


class SimLab:
    """One simulated fleet for the lab. set_levers applies what it can in place and says when a
    change needs a new SimLab (the lab builds it: a new deployment starts at simulated time 0)."""

    def __init__(
        self,
        levers: dict[str, Any],
        on_snapshot: Callable[[FleetSnapshot], None],
        wall: Clock = WALL_CLOCK,
        pacer: Pacer | None = None,
    ) -> None:
        """wall: the pacer's clock; pacer: what ticks it (a WallClockDriver; a test ticks by hand)."""
        self.spec, self.dep = check_sim(levers, {})
        self.min_tp = min_tensor_parallel({tp: fits(self.dep, tp) for tp in (1, 2, 4, 8)})
        self.levers = dict(levers)
        self._badge_cache: tuple[tuple[Any, ...], str] | None = None
        # The serving layer's guards, one object for both pools; apply() changes it in place.
        self.defences = Defences.from_levers(self.levers)
        self.on_snapshot = on_snapshot
        self.loop = EventLoop()
        self.clock = self.loop.clock
        self.events = EventLog(self.clock)
        self.rng = random.Random(0)
        self.conversations = Conversations()  # the levers' conversations, continued as they are answered
        self.open_turns = OpenTurns(self.conversations)
        # When requests arrive: the live traffic's loop, booked on this lab's EventLoop.
        self.arrivals = Arrivals(lambda: self.levers, self.clock, self.loop, self._arrive)
        self.traffic = SimTraffic(self)
        self.sent = self.refused = self.finished = 0
        self.achieved_speed = 0.0
        self._latest: FleetSnapshot | None = None
        self._lock = threading.RLock()  # the pacer's slice against lever changes from sockets
        self.wall = wall  # the pacer's clock: the only wall time a simulated lab reads
        # The pacer runs at the lowest CPU priority: the live engine's replicas share these cores,
        # and their OpenMP threads wait on each other at every barrier, so a simulation that takes
        # a core from one of them for a moment stalls the whole step (measured: a 64-GPU fleet
        # streaming to one browser made the live decode step 1.71x as long at nice 0). Under live
        # load the simulation runs slower than asked, and achieved_speed shows it.
        self._pacer: Pacer = pacer if pacer is not None else WallClockDriver("sim-pacer", nice=19)
        self._last_tick: float | None = None
        self.decode_fleet: Fleet | None = None
        self._decode_left: dict[str, int] = {}
        self.load_s = self.dep.weight_bytes / self.dep.tp / self.spec.storage_bw
        pools = self.spec.prefill_gpus is not None
        base = self._engine_config()
        if pools:
            assert self.spec.prefill_gpus is not None and self.spec.decode_gpus is not None
            n_prefill, n_decode = self.spec.prefill_gpus // self.spec.tp, self.spec.decode_gpus // self.spec.tp
            self.fleet = self._fleet(base, n_prefill, 0, self._prefilled, None)
            self.decode_fleet = self._fleet(
                base.replace(prefix_caching=True), n_decode, n_prefill, self._count_finished,
                kv_transfer_s(self.dep, self.spec.gpus),
            )
            self.autoscaler: Autoscaler | None = None
        else:
            fewest, most = self.spec.replica_bounds()
            self.fleet = self._fleet(base, fewest, 0, self._count_finished, None)
            targets = {key: self.levers[key] for key in TARGET_LEVERS if key in self.levers}
            config = AutoscalerConfig(min_replicas=fewest, max_replicas=most, **targets)
            self.autoscaler = Autoscaler(self.fleet, config, self.clock)
            self.autoscaler.start(self.loop)
        self.fleet.subscribe(self._keep)

    # building -----------------------------------------------------------------------------------

    def _engine_config(self) -> EngineConfig:
        lv = self.levers
        return EngineConfig(
            paged=bool(lv["paged"]), block_size=int(lv["block_size"]), max_num_seqs=int(lv["max_num_seqs"]),
            max_batched_tokens=int(lv["max_batched_tokens"]), chunked_prefill=bool(lv["chunked_prefill"]),
            prefix_caching=bool(lv["prefix_caching"]), num_speculative_tokens=int(lv["num_speculative_tokens"]), seed=0,
        )

    def _fleet(
        self, config: EngineConfig, replicas: int, first_id: int, on_finished: Callable[[Any], None],
        transfer: Callable[[int], float] | None,
    ) -> Fleet:
        lv = self.levers
        router = RouterConfig(
            queue_cap=int(lv["queue_cap"]), deadline_s=float(lv["deadline_s"]), rate_limit=float(lv["rate_limit"]) or None
        )
        colocated = self.spec.prefill_gpus is None  # a split's pools are fixed: no warm pool
        pool = FleetConfig(
            replicas, warm_pool=self.spec.warm_pool if colocated else 0, provision_delay_s=self.spec.provision_delay_s
        )
        return sim_fleet(
            self.dep, config, router, pool, self.loop, on_finished, load_s=self.load_s, first_id=first_id,
            kv_transfer_s=transfer, events=self.events, defences=self.defences, pp_overlap=self.spec.pp_overlap,
        )

    # traffic ------------------------------------------------------------------------------------

    @property
    def sending(self) -> bool:
        return self.arrivals.running

    @property
    def ramp(self) -> Ramp | None:
        return self.arrivals.ramp

    def current_rate(self) -> float:
        return self.arrivals.current_rate()

    def start_traffic(self, ramp_to: float | None = None, ramp_s: float = 30.0) -> None:
        with self._lock:
            self.arrivals.start(ramp_to, ramp_s)

    def stop_traffic(self) -> None:
        with self._lock:
            self.arrivals.stop()

    def _arrive(self) -> None:
        """One arrival, its prompt drawn as the live lab's traffic draws it (prompt_mix: a shared
        system prompt, a conversation's next turn), its ids compact (ranges, TokenRuns)."""
        lv, cfg = self.levers, self.dep.model.cfg
        out_mean = int(lv["output_tokens"])
        # A conversation's next turn leaves room in the context for the longest answer drawn.
        turn = next_turn(PromptMix.from_levers(lv), self.rng, self.conversations, cfg.max_position - out_mean * 3 // 2)
        n_out = draw_length(self.rng, out_mean, 0.5)
        request = SimRequest(str(self.sent), self.clock.now(), turn.system_len + turn.own_len, n_out, turn.system_len)
        ids = turn.build(request.own_ids(cfg.vocab_size), compact_system_ids, compact=True)
        self.open_turns.sent(request.request_id, turn)
        self.sent += 1
        first = self.decode_fleet is not None
        if first:  # the prefill pool computes the prompt and the first token
            self._decode_left[request.request_id] = n_out - 1
        params = SamplingParams(temperature=0, max_tokens=1 if first else n_out, ignore_eos=True)
        try:
            self.fleet.submit(request.request_id, ids, params, None)  # type: ignore[arg-type]
        except AdmissionError:
            self.refused += 1
            self._decode_left.pop(request.request_id, None)
            self.open_turns.ended(request.request_id, None, 0)  # a refused turn ends its conversation
            return
        self.fleet.router.dispatch_once()  # submit wakes the live dispatcher at once

    def _prefilled(self, seq: Any) -> None:
        left = self._decode_left.pop(seq.request_id, 0)
        if left <= 0 or seq.finish_reason == FinishReason.ABORT or self.decode_fleet is None:
            self._count_finished(seq)
            return
        params = SamplingParams(temperature=0, max_tokens=left, ignore_eos=True)
        try:
            self.decode_fleet.submit(seq.request_id, seq.token_ids, params, None)
        except AdmissionError:
            self.refused += 1
            self.open_turns.ended(seq.request_id, None, 0)
            return
        self.decode_fleet.router.dispatch_once()

    def _count_finished(self, seq: Any) -> None:
        self.finished += 1
        if len(self.open_turns):  # a conversation's turn: its answer goes into the next one
            self.open_turns.answered(seq, int(self.levers.get("conversation_turns", 1)))

    # levers -------------------------------------------------------------------------------------

    def needs_rebuild(self, changed: dict[str, Any]) -> bool:
        routed = by_route(changed, Executor.SIM)
        # a fleet built without an autoscaler gains one only as a new fleet
        return bool(routed[Route.REBUILD]) or (self.autoscaler is None and bool(routed[Route.SCALING]))

    def apply(self, changed: dict[str, Any]) -> None:
        """Levers this fleet takes as it runs (load, queue, batch, autoscaler); the caller has
        checked needs_rebuild first."""
        with self._lock:
            self.levers |= changed
            routed = by_route(changed, Executor.SIM)
            fleets = [f for f in (self.fleet, self.decode_fleet) if f is not None]
            router = dict(routed[Route.ROUTER])
            if "rate_limit" in router:
                router["rate_limit"] = router["rate_limit"] or None
            in_place = routed[Route.ENGINE]
            defences = routed[Route.DEFENCE]
            if defences:
                self.defences.update(**defences)
            for fleet in fleets:
                if router:
                    fleet.router.reconfigure(**router)
                if in_place:
                    fleet.reconfigure(**in_place)
            scaling = routed[Route.SCALING]
            if self.autoscaler is not None and scaling:
                fewest, most = replica_bounds(self.levers, warm_pool_holds_devices=True)
                self.autoscaler.reconfigure(**(scaling | {"min_replicas": fewest, "max_replicas": most}))
            self.arrivals.levers_moved(routed[Route.LOAD])

    # running ------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._pacer.running

    def start(self) -> None:
        """The pacer is this composition's driver: PACER_HZ times a wall second, one tick."""
        self._pacer.every(1.0 / PACER_HZ, self._tick)

    def stop(self) -> None:
        """Stop the pacer (and with it every simulated replica and arrival): nothing runs after."""
        self._pacer.stop()
        with self._lock:
            self.arrivals.stop()
            if self.autoscaler is not None:
                self.autoscaler.stop()
            for fleet in (self.fleet, self.decode_fleet):
                if fleet is not None:
                    fleet.stop()

    def _tick(self) -> bool:
        """Run the loop up to sim_speed x the wall time since the last tick, then hand the newest
        snapshot on."""
        now = self.wall.now()
        if self._last_tick is None:  # the pacer's first tick starts the wall clock
            self._last_tick = now
            return True
        wall, self._last_tick = min(now - self._last_tick, MAX_LAG_S), now
        with self._lock:
            before = self.clock.now()
            target = before + wall * int(self.levers["sim_speed"])
            # A slice gets at most a tick of wall time: a fleet too big for this speed runs
            # slower than asked (achieved_speed says so) and the page stays responsive.
            deadline = now + 1.0 / PACER_HZ
            self.loop.run(until=target, done=lambda: self.wall.now() > deadline)
            if not self.loop.pending_before(target):  # nothing left before the target: time still passes
                self.clock.advance(target - self.clock.now())
            snap, self._latest = self._latest, None
            if snap is None:  # the fleet ran slower than its snapshot period: the stream keeps its rate
                self._keep(self.fleet.snapshot())
                snap, self._latest = self._latest, None
            self.achieved_speed = (self.clock.now() - before) / max(1e-6, wall)
        self.on_snapshot(snap)  # type: ignore[arg-type]
        return True

    def _keep(self, snap: FleetSnapshot) -> None:
        """The fleet's own snapshot (SNAPSHOT_HZ of simulated time); a P/D split adds its decode pool."""
        if self.decode_fleet is not None:
            snap = merge_pools(snap, self.decode_fleet.snapshot())
        self._latest = snap

    # what the page shows ------------------------------------------------------------------------

    def facts(self) -> Facts:
        """What a live replica reports about itself, from the deployment (per GPU of a TP group)."""
        dep = self.dep
        replicas = [r for r in self.fleet.replicas if r.stats is not None]
        blocks = replicas[0].stats.kv_total_blocks if replicas else 0
        per_gpu = dep.weight_bytes // dep.tp
        return Facts(
            param_bytes=per_gpu,
            weight_bytes=per_gpu,
            tp_rank_weight_bytes=[per_gpu] * dep.tp,
            weight_bytes_total=dep.weight_bytes,
            kv_bytes_per_token=dep.kv_bytes_per_token,
            kv_budget_bytes=int(blocks * int(self.levers["block_size"]) * dep.kv_bytes_per_token),
            copy_gbs=dep.device.bandwidth / 1e9,
            device_memory_bytes=dep.device.memory_bytes,
            device_memory_gb=dep.device.memory_gb,
            tensor_parallel=dep.tp,
            allreduces_per_step=C.ALLREDUCES_PER_LAYER * dep.model.cfg.num_layers if dep.tp > 1 else 0,
        )

    def _badge(self) -> str:
        """The badge, made again only when its levers change: state() runs every snapshot. A cpu
        device's words read the calibration files (calibrating, waiting for a quiet machine), so
        they are read each time."""
        key = tuple(self.levers.get(k) for k in BADGE_LEVERS)
        if self.levers["device"] == "cpu" or self._badge_cache is None or self._badge_cache[0] != key:
            self._badge_cache = (key, badge(self.levers))
        return self._badge_cache[1]

    def state(self) -> SimState:
        return SimState(
            badge=self._badge(),
            sim_time_s=round(self.clock.now(), 2),
            speed=int(self.levers["sim_speed"]),
            achieved_speed=round(self.achieved_speed, 1),
            running=self.running,
            finished=self.finished,
            load_s=round(self.load_s, 1),
        )



class SimTraffic:
    """The simulated lab's arrivals as the flood drives them (engine/lab/flood.py's FloodSource)."""

    def __init__(self, lab: SimLab) -> None:
        self._lab = lab

    @property
    def running(self) -> bool:
        return self._lab.sending

    @property
    def sent(self) -> int:
        return self._lab.sent

    @property
    def refused(self) -> int:
        return self._lab.refused

    def current_rate(self) -> float:
        return self._lab.current_rate()

    def start(self, ramp_to: float | None, ramp_s: float) -> None:
        self._lab.start_traffic(ramp_to, ramp_s)

    def stop(self) -> None:
        self._lab.stop_traffic()
