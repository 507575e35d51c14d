"""What one `trace` tick costs the server (web/live.py): RequestTraces.observe of a replica
message with six steps, take_changes, and the JSON encoding Socket.IO does once per tick, for a
full 300-row window with 8, 64 or all 300 requests decoding (a decoding row is sent again at
most once a second, traces.REFRESH_S; each step lists every request it ran).
`python -m bench.trace_tick`."""

from __future__ import annotations

import json
import statistics
import time

from engine.clock import VirtualClock
from engine.core.step_record import StepEntry, StepRecord
from engine.serving.replicas.messages import StepMessage
from engine.serving.telemetry.traces import WINDOW_ROWS, RequestTraces

STEPS_PER_TICK = 6  # a replica decoding at ~36 steps/s, ticked six times a second
REPEATS = 50


def main() -> None:
    clock = VirtualClock()
    traces = RequestTraces(clock, rows_per_s=1e9)  # no sampling: every request gets its row
    ids = [f"cmpl-{i:032x}" for i in range(WINDOW_ROWS)]
    for request_id in ids:
        traces.admitted(request_id, None, 0, 200, 64, clock.now())
        clock.advance(0.01)
    for decoding in (8, 64, WINDOW_ROWS):
        times, size = [], 0
        for _ in range(REPEATS):
            start = time.perf_counter()
            entries = tuple(StepEntry(i, "decode", 1) for i in ids[:decoding])
            steps = [StepRecord(0, clock.now(), clock.now() + 0.02, 2048, 64, entries, ()) for _ in range(STEPS_PER_TICK)]
            traces.observe(StepMessage(0, clock.now(), steps=steps))
            size = len(json.dumps(traces.take_changes()))
            times.append(time.perf_counter() - start)
            clock.advance(1 / 6)
        print(
            f"{decoding:3d} requests decoding, {STEPS_PER_TICK} steps a tick: {statistics.median(times) * 1000:.2f} ms a tick "
            f"(median of {REPEATS}), {size / 1024:.0f} KiB on the wire"
        )


if __name__ == "__main__":
    main()
