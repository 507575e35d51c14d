"""`python -m bench.background_beside_live`: the live engine's tokens/s while ServeLab's own
background work runs beside it (issue 40). Run it alone on the machine.

Each phase starts `python app.py` as `make run` does, drives it with --clients closed-loop
streaming clients (--prompt-tokens in, --output-tokens out, over HTTP), and reads the server's
own `vllm:generation_tokens_total` over --phase-s seconds after --warm-s:

  quiet        no background work
  calibration  a first start: no fit of this machine (a fresh SERVELAB_CALIBRATION_DIR), so
               `bench.calibrate --background --then-figures` runs beside the engine
  figures      this machine's fit present, its figures absent: `bench.figures --background`
  whatif       A/B runs of --preset posted to /whatif/ab back to back (web/whatif_worker.py)

`--unyielding` adds the calibration phase with the yield turned off
(SERVELAB_BACKGROUND_YIELD=off): the first start as it was before issue 40. `--finish` lets the
first start's calibration run to its end once the clients stop, and reports its fit (error,
conditions) and how long it took. The goal: every phase at least 0.9x quiet.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.whatif_beside_live import ab_runs_until
from bench.workload import make_workload
from engine.model.paths import DEFAULT_MODEL_NAME
from engine.sim import calibration
from tests.support.server_process import ServerProcess

TOKENS = re.compile(r"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)


def generated(server: ServerProcess) -> float:
    status, body = server.request("GET", "/metrics")
    assert status == 200, status
    return sum(float(v) for v in TOKENS.findall(body.decode()))


def client(server: ServerProcess, prompt: list[int], output_tokens: int, stop: threading.Event, errors: list[str]) -> None:
    body = json.dumps({"model": DEFAULT_MODEL_NAME, "prompt": prompt, "max_tokens": output_tokens, "stream": True,
                       "temperature": 0, "ignore_eos": True})  # fmt: skip
    while not stop.is_set():
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                errors.append(f"{response.status}: {response.read()[:200]!r}")
                time.sleep(1)
                continue
            for _ in response:  # read the stream to its end, as a client does
                pass
        except OSError as err:
            errors.append(str(err))
        finally:
            conn.close()


def background_pids(server: ServerProcess) -> list[int]:
    """The server's background measurement, if one runs: its children that are not replicas."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == server.proc.pid and ("bench.calibrate" in cmdline or "bench.figures" in cmdline):
            out.append(int(proc.name))
    return out


def run_phase(name: str, args: argparse.Namespace, env: dict[str, str], calibrate: bool) -> dict[str, Any]:
    flags = ["--calibrate-in-background"] if calibrate else []
    started = time.monotonic()
    server = ServerProcess(*flags, command=("app.py",), env=env)
    row: dict[str, Any] = {"phase": name, "ready_s": round(time.monotonic() - started, 1)}
    stop, errors, runs = threading.Event(), [], []
    prompts = [r["prompt_token_ids"][: args.prompt_tokens] for r in make_workload(num_requests=args.clients, seed=5)]
    threads = [threading.Thread(target=client, args=(server, p, args.output_tokens, stop, errors)) for p in prompts]
    if name == "whatif":
        threads.append(threading.Thread(target=ab_runs_until, args=(server, args.preset, stop, runs)))
    try:
        for t in threads:
            t.start()
        time.sleep(args.warm_s)
        pids = background_pids(server)
        before, t0 = generated(server), time.monotonic()
        time.sleep(args.phase_s)
        after, t1 = generated(server), time.monotonic()
        row |= {"tok_s": round((after - before) / (t1 - t0), 1), "errors": len(errors),
                "background_alive": bool(pids) and all(Path(f"/proc/{p}").exists() for p in pids)}  # fmt: skip
        if runs:
            row |= {"ab_runs": len(runs), "ab_run_s": round(sum(runs) / len(runs), 1)}
        stop.set()
        for t in threads:
            t.join(timeout=320)
        if args.finish and calibrate and name == "calibration":
            row |= finish(server, env, args.finish_timeout_s)
    finally:
        stop.set()
        server.stop()
    print(json.dumps(row), flush=True)
    return row


def finish(server: ServerProcess, env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    """The clients gone, the first start's calibration goes on: wait for its fit (or refusal)."""
    directory = Path(env["SERVELAB_CALIBRATION_DIR"])
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        fits = [p for p in directory.glob("*.json") if not p.name.startswith("figures-")]
        refused = list(directory.glob("*.refused"))
        if fits or refused:
            data = json.loads((fits or refused)[0].read_text())
            return {"fit_kept": bool(fits), "fit_after_clients_s": round(time.monotonic() - start), "reason": data.get("reason"),
                    "median_abs_error": data.get("median_abs_error"), "conditions": data.get("conditions")}  # fmt: skip
        time.sleep(2)
    return {"fit_kept": False, "fit_after_clients_s": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=150)
    ap.add_argument("--output-tokens", type=int, default=48)
    ap.add_argument("--warm-s", type=float, default=15.0)
    ap.add_argument("--phase-s", type=float, default=60.0)
    ap.add_argument("--preset", default="colocated_vs_disaggregated")
    ap.add_argument("--phases", nargs="*", default=["quiet", "calibration", "figures", "whatif"],
                    help="in this order; a name may repeat (A B A B)")
    ap.add_argument("--unyielding", action="store_true", help="also the first start with the yield off (before)")
    ap.add_argument("--finish", action="store_true", help="let the first start's calibration finish and report it")
    ap.add_argument("--finish-timeout-s", type=float, default=1800.0)
    args = ap.parse_args()
    fresh = Path(tempfile.mkdtemp(prefix="servelab-calibration-"))
    own = calibration.path_for(calibration.this_machine())
    rows = []
    try:
        for i, name in enumerate(args.phases + (["unyielding"] if args.unyielding else [])):
            directory = fresh / f"{i}-{name}"
            directory.mkdir()
            if name == "figures":  # a fit present, so the first start measures the figures alone: this
                # machine's, a calibration phase's, else the reference's under this machine's name
                fits = [own] if own.exists() else sorted(fresh.glob(f"*/{own.name}")) or [calibration.REFERENCE]
                shutil.copy(fits[0], directory / own.name)
            env = {"SERVELAB_CALIBRATION_DIR": str(directory), **({"SERVELAB_BACKGROUND_YIELD": "off"} if name == "unyielding" else {})}
            calibrate = name in ("calibration", "figures", "unyielding")
            rows.append(run_phase(name, args, env, calibrate))
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    quiet = next((r["tok_s"] for r in rows if r["phase"] == "quiet"), None)
    if quiet:
        for r in rows:
            r["over_quiet"] = round(r["tok_s"] / quiet, 3)
    print(json.dumps({"cpu": os.uname().machine, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
