"""`python -m engine serve` serves the fastest configuration by default (engine/launch/served.py):
the forward compiled before /ready, the KV cache on huge pages, tcmalloc in the replica process
where it is installed; SERVELAB_SERVE_EAGER=1 (the rest of the suite) serves the eager defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.launch import served
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.integration


def test_serve_defaults_to_the_compiled_engine_with_tcmalloc() -> None:
    server = ServerProcess("--replicas", "1", env={served.EAGER_ENV: "0"}, timeout=600.0)
    try:
        status, body = server.request("GET", "/health")
        assert status == 200
        plan = json.loads(body)["engine"]
        assert plan["compile"], plan
        status, body = server.request("POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4})
        assert status == 200 and json.loads(body)["choices"][0]["text"]
        if served.tcmalloc_path().exists():
            (replica,) = server.children()
            assert "tcmalloc" in Path(f"/proc/{replica}/maps").read_text()
    finally:
        server.stop()


def test_eager_is_asked_for_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(served.EAGER_ENV, "1")
    assert served.served_levers() == {}
    monkeypatch.delenv(served.EAGER_ENV)
    assert served.served_levers() == {"compile": True, "huge_pages": True}
