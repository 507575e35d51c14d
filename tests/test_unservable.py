"""A replica that cannot load, for a reason a restart cannot change (here: an HF model folder
whose weights file is missing), is said once and not retried: /ready stays false, /health and
every page say why, and the autoscaler orders no second replica."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine.model.paths import default_gguf_path
from engine.model.tokenizer import load_tokenizer
from tests.support.hf_folder import write_hf_folder
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def no_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("no-weights")
    write_hf_folder(folder, load_tokenizer(str(default_gguf_path())))
    (folder / "model.safetensors").unlink()  # config and tokenizer load in the front; the weights do not
    return folder


def test_a_replica_that_cannot_load_is_not_retried(no_weights: Path) -> None:
    server = ServerProcess("--model-path", str(no_weights), command=("app.py",), wait_ready=False, timeout=120)
    try:
        deadline = time.monotonic() + 120
        health: dict = {}
        while time.monotonic() < deadline:
            status, body = server.request("GET", "/health")
            health = json.loads(body)
            if status == 503:
                break
            time.sleep(0.5)
        assert health.get("status") == "failed" and ".safetensors" in health["error"], health
        time.sleep(4)  # eight autoscaler ticks: a fleet that retried would have ordered by now
        status, body = server.request("GET", "/ready")
        ready = json.loads(body)
        assert status == 503 and ready["replicas"] == {"failed": 1} and ready["error"] == health["error"], ready
        _, metrics = server.request("GET", "/metrics")
        assert "servelab_replicas_ordered_total 0" in metrics.decode()
        for path in ("/", "/steps/1", "/lab"):
            status, page = server.request("GET", path)
            assert status == 200 and "Cannot serve:" in page.decode() and "no .safetensors files" in page.decode(), path
        log = server.log_text()
        assert log.count("no .safetensors files") == 1, log
        assert "\nready" not in log
    finally:
        server.stop()
