"""What `make run` and `python -m engine serve` serve unless told otherwise: the engine's fastest
measured configuration (BENCHMARKS.md, "The engine as served"), where EngineConfig's own defaults
stay eager for LLM() in scripts and tests.

- The forward compiled (engine/model/compile.py), before the replica says it is ready: a start
  or a lesson's rebuild waits for it (BENCHMARKS.md measures how long), as vLLM's start does.
  A compile in a thread beside an engine already serving was tried and not taken: at nice 19
  beside steady traffic it had not finished in 10 minutes, and at full priority the tracer
  (Python, holding the GIL) would take a core and the GIL from the step loop.
- The CPU KV cache on 2 MiB pages (engine/platform/huge_pages.py).
- tcmalloc preloaded into the replica processes where the library is installed (vLLM's CPU guide
  asks the same; `make run` installs it where it can).

SERVELAB_SERVE_EAGER=1 serves EngineConfig's defaults instead: the test suite's servers, dozens of
replica starts that would each pay the compile.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

EAGER_ENV = "SERVELAB_SERVE_EAGER"
SERVED_LEVERS = {"compile": True, "huge_pages": True}


def tcmalloc_path() -> Path:
    """Debian's tcmalloc for this architecture (where `make run` and `make bench` install it)."""
    return Path(f"/usr/lib/{platform.machine()}-linux-gnu/libtcmalloc_minimal.so.4")


def served_levers() -> dict[str, bool]:
    """The EngineConfig fields a server sets over EngineConfig's defaults ({} when eager is asked)."""
    return {} if os.environ.get(EAGER_ENV) == "1" else dict(SERVED_LEVERS)


def preload_allocator() -> str | None:
    """Puts tcmalloc in LD_PRELOAD for the processes this one starts from now on (replicas, ranks,
    the background measurement); this process keeps the allocator it started with. Returns the
    library preloaded, or None (eager asked, not Linux, not installed, or already preloaded)."""
    if os.environ.get(EAGER_ENV) == "1" or platform.system() != "Linux":
        return None
    library = tcmalloc_path()
    preloaded = os.environ.get("LD_PRELOAD", "")
    if not library.exists() or "tcmalloc" in preloaded:
        return None
    os.environ["LD_PRELOAD"] = ":".join(filter(None, [str(library), preloaded]))
    return str(library)
