"""Where a serving run's CPU goes: the front process (router, HTTP, SSE) against the replica, over
the engine bench's workload at rate=inf. `python -m bench.server_cpu_split` (after make bench-peers
has made .cache/)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench.serving_bench import RESULTS, run_engine_workload, start_servelab, stop
from engine.serving.replicas.replica_process import replica_pids

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    proc = start_servelab(8768, RESULTS / "cpu-split-server.log")
    try:
        replica = replica_pids(proc.pid)[0]
        before = cpu_seconds(proc.pid), cpu_seconds(replica)
        started = time.perf_counter()
        tok_s = run_engine_workload(8768)
        wall = time.perf_counter() - started
        front, engine = cpu_seconds(proc.pid) - before[0], cpu_seconds(replica) - before[1]
        print(f"{tok_s:.1f} output tok/s in {wall:.1f} s; CPU: front {front:.1f} s, replica {engine:.1f} s "
              f"of {wall * len(os.sched_getaffinity(0)):.1f} s the cores offer")  # fmt: skip
    finally:
        stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
