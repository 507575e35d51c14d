"""Start a real server process on a free port: `python -m engine serve` (the API tests) or
`python app.py` (the teaching app's tests)."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.serving.replicas.replica_process import replica_pids

ROOT = Path(__file__).resolve().parents[2]


def kv_budget_mb(bf16_mb: int) -> str:
    """A --kv-budget-mb that holds the same number of KV tokens on every CPU: dtype auto keeps the
    cache in bf16 where the CPU has native bf16, in fp32 (twice the bytes a token) where it has not
    (an AVX2 CPU: 64 MB there holds 1,456 tokens, not 2,912)."""
    from engine.platform import machine

    return str(bf16_mb if machine.cpu().native_bf16 else 2 * bf16_mb)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        *flags: str,
        api_keys: str = "",
        timeout: float = 240.0,
        command: tuple[str, ...] = ("-m", "engine", "serve"),
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
        root: Path = ROOT,
    ) -> None:
        """wait_ready=False: return once the server answers at all (a fleet that cannot serve).
        root: the repository it runs from (a copy of this one, in a test that edits files)."""
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(root), "SERVELAB_API_KEYS": api_keys, **(env or {})}
        self.log = open(ROOT / "tests" / f".server-{self.port}.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, *command, "--port", str(self.port), *flags],
            cwd=root,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_text()}")
            try:
                status, _ = self.request("GET", "/ready")
                if status == 200 or not wait_ready:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout} s: {self.log_text()}")

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self, method: str, path: str, body: object = None, headers: dict | None = None, raw: bytes | None = None
    ):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        return response.status, payload

    def children(self) -> list[int]:
        return replica_pids(self.proc.pid)

    def log_text(self) -> str:
        self.log.flush()
        return (ROOT / "tests" / f".server-{self.port}.log").read_text()[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        (ROOT / "tests" / f".server-{self.port}.log").unlink(missing_ok=True)
