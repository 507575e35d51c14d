"""What thirty watchers of the live stream cost the server: `python app.py` on half the cores,
four closed-loop 64-token streams decoding, then 1 and 30 python-socketio clients (on the other
half) for 15 s each; the front process's and the replica's CPU (cores used) and the replica's
median decode step (its StepRecords, from the `trace` event). `python -m bench.watchers_cpu`."""

from __future__ import annotations

import os
import statistics
import time

import socketio

from tests.support.server_process import ServerProcess
from tests.support.watchers import PINNED_APP, STREAMS, WATCHER_CORES, Streams

WINDOW_S = 15.0


def cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115 - read at once
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    server = ServerProcess("--kv-budget-mb", "64", "--max-num-seqs", "8", command=PINNED_APP)
    try:
        os.sched_setaffinity(0, WATCHER_CORES)
        streams = Streams(server)
        steps: list[dict] = []
        clients: list[socketio.Client] = []

        def connect(first: bool) -> None:
            client = socketio.Client(reconnection=False)
            if first:
                client.on("trace", lambda msg: steps.extend(msg["steps"]), namespace="/live")
            client.connect(server.base_url, namespaces=["/live"], transports=["websocket"], wait_timeout=30)
            clients.append(client)

        connect(True)
        time.sleep(5)
        replica = server.children()[0]
        for watchers in (1, 30):
            while len(clients) < watchers:
                connect(False)
            time.sleep(3)
            front0, replica0, t0 = cpu_s(server.proc.pid), cpu_s(replica), time.monotonic()
            time.sleep(WINDOW_S)
            wall = time.monotonic() - t0
            decodes = [
                s["end"] - s["start"] for s in steps
                if s["start"] >= t0 and len(s["entries"]) == STREAMS and all(e["phase"] == "decode" for e in s["entries"])
            ]  # fmt: skip
            print(
                f"{watchers:2d} watcher(s): front {(cpu_s(server.proc.pid) - front0) / wall:.3f} cores, "
                f"replica {(cpu_s(replica) - replica0) / wall:.3f} cores, decode step "
                f"{statistics.median(decodes) * 1000:.1f} ms (median of {len(decodes)})"
            )
        for client in clients:
            client.eio.disconnect(abort=True)
        streams.close()
    finally:
        server.stop()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
