"""One core kept busy on demand, to run the tests as a loaded machine runs them (a CI runner with a
neighbour, a laptop compiling beside them): `make test-fast-busy` runs the unit tier three times
beside it.

    python -m tests.support.busy_core start   # a spinning process, pinned to one core where the
                                              # OS allows; its pid in .cache/busy_core.pid
    python -m tests.support.busy_core stop    # ends it (only a process this script started)

A pure-Python spin loop: one core's worth of load with nothing installed, at the normal priority
(a niced spinner would yield to the tests and prove nothing)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PID_FILE = ROOT / ".cache" / "busy_core.pid"
MARK = "tests.support.busy_core"  # in the spinner's command line: stop ends nothing else


def default_core() -> int | None:
    """The last core this process may run on (None where the OS has no affinity: macOS)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return max(os.sched_getaffinity(0))


def spinner_pid() -> int | None:
    """The running spinner's pid from PID_FILE, or None (no file, the process gone, or the pid
    reused by a process that is not ours)."""
    try:
        pid = int(PID_FILE.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None
    try:
        os.kill(pid, 0)
    except OSError:
        return None
    cmdline = Path(f"/proc/{pid}/cmdline")
    if cmdline.exists() and MARK not in cmdline.read_bytes().decode(errors="replace"):
        return None
    return pid


def spin(core: int | None) -> None:
    if core is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    n = 0
    while True:  # the load itself
        n = (n + 1) % 1_000_003


def start(core: int | None) -> int:
    running = spinner_pid()
    if running is not None:
        print(f"busy_core: already spinning (pid {running})")
        return 0
    command = [sys.executable, "-m", MARK, "spin"] + ([] if core is None else ["--core", str(core)])
    # Its own session: a Ctrl-C in the terminal reaches make's trap, which stops it, not it alone.
    proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    PID_FILE.parent.mkdir(parents=True, exist_ok=True)
    PID_FILE.write_text(f"{proc.pid}\n")
    where = "unpinned (no CPU affinity here)" if core is None else f"pinned to core {core}"
    print(f"busy_core: spinning, pid {proc.pid}, {where}")
    return 0


def stop() -> int:
    pid = spinner_pid()
    PID_FILE.unlink(missing_ok=True)
    if pid is None:
        print("busy_core: nothing spinning")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child (start and stop in one process)
                break
        except ChildProcessError:  # another process started it: watch for it to go
            try:
                os.kill(pid, 0)
            except OSError:
                break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
    print(f"busy_core: stopped pid {pid}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.busy_core", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("start", "stop", "spin"))
    parser.add_argument("--core", type=int, default=None, help="the core to pin to (default: the last one)")
    args = parser.parse_args(argv)
    core = args.core if args.core is not None else default_core()
    if args.action == "spin":
        spin(core)
    return start(core) if args.action == "start" else stop()


if __name__ == "__main__":
    raise SystemExit(main())
