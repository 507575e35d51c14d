"""The web process imports no torch unless it serves the live engine (issue 27).

`import app`, the web floor, the what-if panels and the remote lab load neither torch nor the lab
they do not run: app.py imports the live lab (its fleet of replica processes) and the remote lab
where it builds them, the simulator plans with torch-free pieces (engine/model/llama_config.py,
engine/core/memory.py's plan, engine/parallel/ranks.py), and the remote lab's poller reads its rate from the
snapshot. Each check runs in a fresh interpreter, since this one has loaded torch long ago; an
import hook there names the chain of modules that first pulled torch in, should one do so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent

# Run in the child: a hook that notes which chain of modules first imports torch, then the code under
# test, then what is loaded.
PROBE = """
import builtins, json, sys
_import, chain = builtins.__import__, []

def _hook(name, globals=None, locals=None, fromlist=(), level=0):
    if name.partition(".")[0] == "torch" and "torch" not in sys.modules and not chain:
        frame = sys._getframe(1)  # the importer: a module's body, or a function in it
        if frame.f_code.co_name != "<module>":
            chain.append(frame.f_globals.get("__name__", "?") + "." + frame.f_code.co_name + "()")
        while frame:
            if frame.f_code.co_name == "<module>":
                chain.append(frame.f_globals.get("__name__", "?"))
            frame = frame.f_back
    return _import(name, globals, locals, fromlist, level)

builtins.__import__ = _hook
{code}
print(json.dumps({{"torch": "torch" in sys.modules, "chain": " <- ".join(chain), "loaded": sorted(sys.modules)}}))
"""


def probe(code: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(code=code)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "modules",
    [
        "app",  # the composition root, before it picks a backend
        "web",
        "web.whatif",  # the what-if panels: the simulator runs the engine's own LLMEngine
        "web.remote_api",  # --backend remote
        "engine.lab.remote.remote_lab",
        "engine.lab.live.lab",  # the live lab's module; its replicas load torch in their own processes
        "engine.sim.compare, engine.sim.run, engine.lab.simulated.lab_sim",
    ],
)
def test_importing_loads_no_torch(modules: str) -> None:
    found = probe(f"import {modules}")
    assert not found["torch"], f"import {modules} loads torch: {found['chain']}"


def test_app_imports_neither_lab_until_it_builds_one() -> None:
    """The live lab and the remote lab are imported where app.py builds them (main picks one)."""
    loaded = set(probe("import app")["loaded"])
    assert "engine.lab.live.lab" not in loaded
    assert "engine.lab.remote.remote_lab" not in loaded


def test_a_what_if_run_loads_no_torch() -> None:
    """Predict-then-run with the default levers (the live model's shape read from its GGUF
    metadata, the KV plan, the simulated engine's steps) runs in the web process without torch."""
    code = (
        "from engine.levers import LEVERS\n"
        "from engine.lab.simulated.predict import predict\n"
        "result = predict({key: lever.default for key, lever in LEVERS.items()})\n"
        "assert result['requests'], result\n"
    )
    found = probe(code)
    assert not found["torch"], f"a what-if run loads torch: {found['chain']}"


def test_the_probe_sees_torch_when_it_is_imported() -> None:
    """The check can fail: a module that loads torch is caught, and its chain named."""
    found = probe("import engine.core.llm_engine, engine.core.memory\nengine.core.memory.copy_bandwidth_gbs(num_bytes=4096, repeats=1)")
    assert found["torch"]
    assert found["chain"].startswith("engine.core.memory.copy_bandwidth_gbs() <- __main__"), found["chain"]
