"""The layers import downward only, and no module imports itself back through another.

An AST walk over every module of the project (imports inside functions included: a cycle
hidden behind a function-level import is still a cycle). Each module belongs to one floor
(FLOORS, DESIGN.md "Layers"); an import may reach its own floor or one below, never above.
The composition roots (app.py, `python -m engine serve`) join the floors and may import any."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "web")
# The composition roots join the floors and may import any: app.py, `python -m engine serve`, and
# engine/launch/ (the servers those two start).
ROOTS = {"app", "engine.__main__", "engine.launch", "engine.launch.api_server", "engine.launch.remote_server"}

# Floors from the bottom, one folder each: a module's floor is that of its longest matching prefix.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    ("engine", ("engine",)),  # one replica: model, kernels, scheduler, runner, sampler, LLM; the lever table
    ("serving", ("engine.serving",)),  # replicas, routing, scaling, telemetry, load: the stack, no teaching
    ("whatif", ("engine.sim",)),  # the simulator, on top of serving
    ("lab", ("engine.lab",)),  # what a teaching session drives: live, simulated and remote labs behind one facade
    ("web", ("web",)),
]
ORDER = [name for name, _ in FLOORS]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    found = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    found["app"] = ROOT / "app.py"
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports anywhere in its file (a `from x import y` names x.y when
    that is a module, else x)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import engine.serving.scaling.fleet as x` names its module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def floor(name: str) -> str | None:
    best, length = None, -1
    for floor_name, prefixes in FLOORS:
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > length:
                best, length = floor_name, len(prefix)
    return best


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Imports from a floor to one above it, said as `a (floor) -> b (floor)`."""
    bad = []
    for a, targets in sorted(edges.items()):
        if a in ROOTS or floor(a) is None:
            continue
        for b in sorted(targets):
            if b in ROOTS or (floor(b) is not None and ORDER.index(floor(b)) > ORDER.index(floor(a))):
                bad.append(f"{a} ({floor(a)}) -> {b} ({floor(b) or 'root'})")
    return bad


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted. A package
    importing its own submodules (engine/__init__.py's re-exports) is not a cycle of its own."""
    def outgoing(a: str) -> set[str]:
        return {b for b in edges.get(a, ()) if not b.startswith(a + ".")}

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in outgoing(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def test_no_module_imports_itself_back() -> None:
    assert cycles(graph()) == []


def test_no_floor_imports_one_above_it() -> None:
    assert upward(graph()) == []


def test_the_lever_table_does_not_import_torch() -> None:
    """engine/levers.py is read by every floor, the web process's included: it names the
    simulator's models and devices from engine/catalog.py, not from the simulator (which loads
    torch through the model's config)."""
    import subprocess
    import sys

    code = "import sys, engine.levers; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_web_floor_reads_the_serving_contracts_without_torch() -> None:
    """The API blueprint, the live stream, the pages and the figures need the contracts (finish
    reasons, logprobs, the lab's facade), not the engine: torch is the composition root's to load.
    tests/test_web_imports.py holds the same for app.py, the what-if panels and the remote lab."""
    import subprocess
    import sys

    modules = ("web", "web.openai_api", "web.live", "web.pages", "web.figures", "web.classroom")
    code = f"import sys; import {', '.join(modules)}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_checks_fail_on_a_cycle_and_an_upward_import() -> None:
    """The two checks above can fail: a cycle and an upward import added to the real graph are found."""
    edges = graph()
    edges["engine.core.scheduler"] = edges["engine.core.scheduler"] | {"engine.core.llm_engine"}
    edges["engine.core.llm_engine"] = edges["engine.core.llm_engine"] | {"engine.core.scheduler"}
    edges["engine.serving.routing.router"] = edges["engine.serving.routing.router"] | {"web.live"}
    assert any({"engine.core.llm_engine", "engine.core.scheduler"} <= set(c) for c in cycles(edges))
    assert "engine.serving.routing.router (serving) -> web.live (web)" in upward(edges)


# The engine floor's rooms (DESIGN.md's map): its root holds the tables every floor reads and the
# entry points; everything else lives in a room (core, worker, sample, parallel, platform, model,
# kernels), so a new module has to say where it belongs.
ENGINE_TABLES = {"config", "levers", "catalog", "errors", "clock", "sampling_params"}
ENGINE_ENTRY_POINTS = {"__init__", "__main__", "llm"}
ENGINE_ROOMS = {"core", "worker", "sample", "parallel", "platform", "model", "kernels"}


def test_the_engine_root_holds_its_tables_and_entry_points_and_the_rest_is_in_rooms() -> None:
    engine = ROOT / "engine"
    assert {p.stem for p in engine.glob("*.py")} == ENGINE_TABLES | ENGINE_ENTRY_POINTS
    rooms = {p.name for p in engine.iterdir() if (p / "__init__.py").exists()}
    assert rooms == ENGINE_ROOMS | {"serving", "sim", "lab", "launch"}  # the floors above and the servers


def test_the_tables_import_only_each_other_and_the_platform_room_only_the_tables() -> None:
    """The tables are read by every floor, the web process's included; the platform room (the CPU, the
    devices, threads) is the bottom of the engine floor: both import nothing of the engine above them."""
    edges = graph()
    tables = {f"engine.{name}" for name in ENGINE_TABLES}
    for name in sorted(tables):
        assert edges.get(name, set()) <= tables, name
    platform = {m for m in edges if m.startswith("engine.platform")}
    for name in sorted(platform):
        assert edges[name] <= tables | platform, f"{name} imports {sorted(edges[name] - tables - platform)}"
