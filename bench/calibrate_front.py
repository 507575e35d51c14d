"""The second half of `make calibrate`: what the live server's front and its clients cost on
this machine's cores, for the `cpu` device when the server runs here (SimSpec.front_on_device).

Starts `python -m engine serve --replicas 1` in the calibration's execution configuration
(bench/sim_vs_live.py's), then measures, with nothing else running:
- latency_s: the client's TTFT minus the server's own (the `servelab.ttft_s` its last chunk
  carries), median over sequential short requests at idle: client -> HTTP front -> router, and
  first token -> SSE -> client. Neither is in the engine's step times.
- cpu_per_token_s: CPU seconds of the front process and of the clients (this process's load
  generator threads) per streamed token, over a burst through the server. On two cores shared
  with the engine's two threads, each of those CPU seconds stalls a step about as long.
Both are measured, not fitted; merged into this machine's calibration under "front" (`--reference`: the committed one too).
"""

from __future__ import annotations

import datetime
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench.serving_bench import stop
from bench.sim_vs_live import calibrated_execution, free_port, select_attention, start_server

ROOT = Path(__file__).resolve().parent.parent
LATENCY_REQUESTS = 12
BURST = (32, 128, 64)  # requests, prompt tokens, output tokens: a busy stream of tokens


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of one process (not its children: the replica's are the engine's own)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hop_latency(port: int, model: str, prompt: list[int]) -> float:
    """One streamed request: client TTFT - the server's TTFT for it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stream": True}
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read(500)!r}")
    client_ttft = server_ttft = None
    for raw in resp:
        line = raw.decode().strip()
        if not line.startswith("data:") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[5:])
        if client_ttft is None and chunk.get("choices"):
            client_ttft = time.perf_counter() - start
        if "servelab" in chunk:
            server_ttft = chunk["servelab"]["ttft_s"]
    conn.close()
    if client_ttft is None or server_ttft is None:
        raise RuntimeError("the stream carried no token or no servelab figures")
    return client_ttft - server_ttft


def main() -> None:
    from engine.model.paths import DEFAULT_MODEL_NAME
    from engine.serving.load.loadgen import HttpTarget, make_requests, run_load
    from engine.sim import calibration
    from engine.sim.devices import CPU_CALIBRATION

    exe = calibrated_execution()
    select_attention(exe)
    port = free_port()
    log = ROOT / ".cache" / "calibrate-front-server.log"
    proc = start_server(port, exe, log)
    try:
        target = HttpTarget(f"http://127.0.0.1:{port}", DEFAULT_MODEL_NAME)
        warm = make_requests(4, 64, 8, seed=1)
        run_load(target, warm, [0.0] * len(warm), max_duration_s=300)
        prompts = [r.prompt_token_ids for r in make_requests(LATENCY_REQUESTS, 32, 2, range_ratio=0.0, seed=2)]
        hops = [hop_latency(port, DEFAULT_MODEL_NAME, p) for p in prompts]

        burst = make_requests(*BURST, range_ratio=0.0, seed=3)
        front0, client0 = _proc_cpu_s(proc.pid), time.process_time()
        records = run_load(target, burst, [0.0] * len(burst), max_duration_s=600)
        front_s, client_s = _proc_cpu_s(proc.pid) - front0, time.process_time() - client0
    finally:
        stop(proc)
    tokens = sum(r.output_tokens for r in records)
    if tokens != BURST[0] * BURST[2]:
        sys.exit(f"the burst streamed {tokens} of {BURST[0] * BURST[2]} tokens; see {log}")
    front = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "make calibrate  (python -m bench.calibrate_front)",
        "latency_s": statistics.median(hops),
        "latency_samples_s": [round(h, 5) for h in hops],
        "cpu_per_token_s": (front_s + client_s) / tokens,
        "front_cpu_s": front_s,
        "client_cpu_s": client_s,
        "tokens": tokens,
        "load_average": list(os.getloadavg()),
    }
    found = calibration.load()
    if found is None or not found.this_machine:
        sys.exit("no calibration of this machine to add the front to: run `python -m bench.calibrate` first")
    found.data["front"] = front
    found.path.write_text(json.dumps(found.data, indent=2) + "\n")
    if "--reference" in sys.argv:
        CPU_CALIBRATION.write_text(json.dumps(found.data, indent=2) + "\n")
    print(json.dumps(front, indent=2))


if __name__ == "__main__":
    main()
