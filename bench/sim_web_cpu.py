"""`python -m bench.sim_web_cpu`: what a simulated 64-GPU fleet streaming to one browser costs
the web process, and how many snapshots a second the browser receives.

Starts `python app.py` (the live engine idle beside it, as in a classroom), opens one real
browser (Debian chromium, Playwright) on a link that switches the lab to the simulated fleet,
lets it settle, then counts the `metrics` snapshots the page receives and the web process's CPU
time (utime + stime of its /proc/<pid>/stat, every thread of it; the live replicas are other
processes) over --seconds of wall time. Prints one JSON object.

The fleet: Llama-3.1-70B in fp8 on 64 H100s as 8 replicas of TP8 (bench/sim_speed.py's), at
--rate req/s of 1000-token prompts and 250-token answers, at 1x speed."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import Page, sync_playwright

from tests.support.server_process import ServerProcess

CHROMIUM = "/usr/bin/chromium"
FLEET_64 = {
    "executor": "sim",
    "model": "llama-3.1-70b",
    "device": "h100",
    "gpu_count": 64,
    "tensor_parallel": 8,
    "weight_dtype": "fp8",
    "kv_dtype": "fp8",
    "min_replicas": 8,
    "max_replicas": 8,
    "warm_pool": 0,
    "max_num_seqs": 1024,
    "max_batched_tokens": 8192,
    "queue_cap": 100000,
    "prompt_tokens": 1000,
    "output_tokens": 250,
    "sim_speed": 1,
    "prefix_caching": False,  # random prompts share no prefix (SimSpec's default): hashing them only costs
}


def link(levers: dict[str, object]) -> str:
    return "/lab?" + "&".join(f"{k}={v}" for k, v in levers.items())


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, all its threads, in seconds (fields 14 and 15 of stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def app_server() -> Iterator[ServerProcess]:
    server = ServerProcess("--kv-budget-mb", "64", "--max-num-seqs", "16", command=("app.py",))
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def browser_page() -> Iterator[Page]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-background-networking"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def open_sim(page: Page, server: ServerProcess, levers: dict[str, object]) -> None:
    page.goto(server.base_url + link(levers))
    page.wait_for_function(
        "window.servelab && window.servelab.lab && window.servelab.lab.executor === 'sim'", timeout=60_000
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds before measuring")
    ap.add_argument("--rate", type=float, default=100.0, help="simulated requests/s")
    args = ap.parse_args()
    levers = FLEET_64 | {"request_rate": args.rate}
    with app_server() as server, browser_page() as page:
        open_sim(page, server, levers)
        time.sleep(args.settle)
        snaps0, cpu0, wall0 = page.evaluate("window.servelab.snapshots"), cpu_seconds(server.proc.pid), time.monotonic()
        sim0 = page.evaluate("window.servelab.lab.sim")
        time.sleep(args.seconds)
        snaps1, cpu1, wall1 = page.evaluate("window.servelab.snapshots"), cpu_seconds(server.proc.pid), time.monotonic()
        lab = page.evaluate("window.servelab.lab")
    wall = wall1 - wall0
    print(
        json.dumps(
            {
                "badge": lab["badge"],
                "rate_req_s": args.rate,
                "seconds": round(wall, 1),
                "snapshots_per_s": round((snaps1 - snaps0) / wall, 2),
                "web_process_cores": round((cpu1 - cpu0) / wall, 3),
                "simulated_s_per_wall_s": round((lab["sim"]["sim_time_s"] - sim0["sim_time_s"]) / wall, 3),
                "requests_finished": lab["sim"]["finished"] - sim0["finished"],
                "gpus": lab["levers"]["gpu_count"],
                "traffic": lab["traffic"],
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
