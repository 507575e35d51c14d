"""What the device tool carries to a lent GPU machine: the repository's tracked files and its
untracked files that git does not ignore (`git ls-files`, `git ls-files --others --exclude-standard`),
at most 64 MiB in all. .venv and .cache are ignored, so neither the model GGUF nor anything built
here travels: the check has to make what it needs on the machine.

Torch-free and pure but for reading the tree: tests/test_device_check_units.py tests it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from bench.device_check.common import CARRY_LIMIT_BYTES

# Where git is missing (the copy on the lent machine may have no .git): walk the tree, leaving
# out what the tool never carries and what running the check itself creates.
WALK_SKIP_DIRS = frozenset({".git", ".venv", ".cache", "__pycache__", "node_modules", ".venv-peers"})


def git_listed(root: Path) -> list[str] | None:
    """Tracked plus untracked-not-ignored paths, or None where git cannot say (no git, no repo)."""
    names: list[str] = []
    for extra in ([], ["--others", "--exclude-standard"]):
        try:
            proc = subprocess.run(
                ["git", "-C", str(root), "ls-files", "-z", *extra], capture_output=True, check=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        names += [n for n in proc.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    return names


def walked(root: Path, skip: set[Path]) -> list[str]:
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d not in WALK_SKIP_DIRS and (here / d).resolve() not in skip]
        names += [str((here / f).relative_to(root)) for f in filenames]
    return names


def sizes(root: Path, names: list[str]) -> dict[str, int]:
    """Each listed path that exists, its size as carried (a link counts as itself, not its target;
    a path git lists but the tree no longer holds, a deleted file, is not carried)."""
    out = {}
    for name in dict.fromkeys(names):  # tracked and untracked never overlap, but be safe
        try:
            out[name] = (root / name).lstat().st_size
        except OSError:
            continue
    return out


def carried(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, Any]:
    """bytes, files, the method, the limit, whether it fits, and the five largest files (what to
    look at first when it does not). skip: folders the walk leaves out (the check's own output)."""
    names = git_listed(root)
    method = "git ls-files (tracked + untracked, not ignored)"
    if names is None:
        names = walked(root, {p.resolve() for p in skip})
        method = "walk of the tree (no git here), leaving out " + ", ".join(sorted(WALK_SKIP_DIRS))
    found = sizes(root, names)
    total = sum(found.values())
    largest = sorted(found.items(), key=lambda kv: -kv[1])[:5]
    return {
        "bytes": total,
        "files": len(found),
        "method": method,
        "limit_bytes": CARRY_LIMIT_BYTES,
        "fits": total <= CARRY_LIMIT_BYTES,
        "largest": [{"path": p, "bytes": b} for p, b in largest],
    }
