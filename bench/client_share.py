"""How the cores split between a server and guidellm on this machine: runs README's guidellm
command (constant rate, synthetic text) against a server already listening, samples both process
trees' CPU time, and prints the cores each used and guidellm's completed / incomplete / errored
counts.

    python -m engine serve --port 8000 &   # or any OpenAI-compatible server on that port
    python -m bench.client_share [--rate 2] [--prompt 150] [--output 48] [--seconds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent


def tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def listening_server(port: int) -> psutil.Process:
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return psutil.Process(conn.pid)
    raise SystemExit(f"no process listens on port {port}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--prompt", type=int, default=150)
    ap.add_argument("--output", type=int, default=48)
    ap.add_argument("--seconds", type=int, default=15)
    args = ap.parse_args()
    server = listening_server(args.port)
    report = Path(tempfile.mkdtemp()) / "guidellm.json"
    cmd = [str(Path(sys.executable).parent / "guidellm"), "run", "--disable-progress",
           "--backend", f"kind=openai_http,target=http://127.0.0.1:{args.port}",
           "--profile", f"kind=constant,rate={args.rate}",
           "--constraint", f"kind=max_duration,seconds={args.seconds}",
           "--tokenizer", f"kind=hf_auto,model={ROOT / '.cache' / 'smollm2-tokenizer'}",
           "--data", f"kind=synthetic_text,prompt_tokens={args.prompt},output_tokens={args.output}",
           "--output", f"kind=json,path={report}"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    server_start, start = tree_cpu(server), time.time()
    client = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    client_proc, client_cpu = psutil.Process(client.pid), 0.0
    while client.poll() is None:
        try:
            client_cpu = max(client_cpu, tree_cpu(client_proc))
        except psutil.NoSuchProcess:
            pass
        time.sleep(0.5)
    wall = time.time() - start
    server_cores = (tree_cpu(server) - server_start) / wall
    totals = json.loads(report.read_text())["benchmarks"][0]["metrics"]["request_totals"]
    print(f"{wall:.1f} s: server {server_cores:.2f} cores, guidellm {client_cpu / wall:.2f} cores "
          f"(start-up included); requests completed {totals['successful']}, incomplete "
          f"{totals['incomplete']}, errored {totals['errored']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
