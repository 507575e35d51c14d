"""Builds the C++ CPU attention op (engine/kernels/csrc/) into .cache/kernels/, named by a checksum
of its source and the torch version, so the engine finds exactly the library its source makes.

`python -m engine.kernels.cpu_build` is the project's install step for it (`make kernels`, which
`make test` and `make run` depend on); the engine itself never compiles. Without a C++ compiler
it says so in one line and exits 0: the engine then runs the torch path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = [
    CSRC / "ops_cpu.cpp",
    CSRC / "cpu_isa.cpp",
    CSRC / "paged_attention_cpu.cpp",
    CSRC / "attention_avx2.cpp",
    CSRC / "attention_avx512.cpp",
    CSRC / "prefill_amx.cpp",
    CSRC / "token_pick.cpp",
    CSRC / "linear_int8.cpp",
]
HEADERS = [
    CSRC / "cpu_isa.h",
    CSRC / "attention_kernels.h",
    CSRC / "paged_attention_loops.h",
    CSRC / "prefill_amx.h",
    CSRC / "token_pick.h",
    CSRC / "linear_int8.h",
    CSRC / "simd_exp.h",
]
ROOT = Path(__file__).resolve().parents[2] / ".cache" / "kernels"
# The AVX2, AVX-512 and AMX routines carry their own target attribute and are picked at run time
# by the process's tier (csrc/cpu_isa.h); the rest is plain x86-64 (or ARM64), so the library runs,
# on its scalar path at least, on any CPU of its architecture.
# -fopenmp: at::parallel_for is a header template whose `#pragma omp parallel` compiles away
# without it, and the op then runs on one thread whatever torch.get_num_threads() says.
# Apple clang has no -fopenmp (torch's macOS wheel brings libomp, but no header to build against):
# there the op's loops run on the calling thread. Not run on a Mac here (README: Every machine).
OPENMP = [] if sys.platform == "darwin" else ["-fopenmp"]
CFLAGS = ["-O3", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wno-unused-function", *OPENMP]


def source_key() -> str:
    digest = hashlib.sha256(torch.__version__.encode())
    digest.update(" ".join(CFLAGS).encode())
    for src in SOURCES + HEADERS:
        digest.update(src.read_bytes())
    return digest.hexdigest()[:16]


def library_name() -> str:
    return f"servelab_cpu_{source_key()}"


def library_path(root: Path = ROOT) -> Path:
    return root / library_name() / f"{library_name()}.so"


def compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "c++"))


def build(root: Path = ROOT, verbose: bool = False) -> Path:
    """Compiles the op (if its library is not there yet) and returns the library's path."""
    from torch.utils import cpp_extension

    path = library_path(root)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name=library_name(),
        sources=[str(s) for s in SOURCES],
        extra_cflags=CFLAGS,
        build_directory=str(path.parent),
        is_python_module=False,
        verbose=verbose,
    )
    return path


def missing_tool() -> str | None:
    """What the build lacks on this machine, if anything (torch's builder drives ninja)."""
    if compiler() is None:
        return f"no C++ compiler ({os.environ.get('CXX', 'c++')})"
    if shutil.which("ninja") is None:
        return "no ninja"
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", type=Path, default=ROOT, help="where the library goes")
    parser.add_argument("--stamp", type=Path, help="touched once the library exists (make's marker)")
    args = parser.parse_args(argv)
    if (missing := missing_tool()) is not None:
        print(f"kernels: {missing} found; attention runs the torch path")
        return 0
    path = build(args.root)
    for old in args.root.glob("servelab_cpu_*"):  # libraries of earlier sources
        if old != path.parent:
            shutil.rmtree(old, ignore_errors=True)
    print(f"kernels: built {path}")
    if args.stamp is not None:
        for old in args.stamp.parent.glob(".built-*"):
            old.unlink()
        args.stamp.touch()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
