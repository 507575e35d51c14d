"""A teacher adds a step in markdown alone (issue 41): in a copy of the repository, `python -m
web.lessons new` writes the next step, the check passes, and the running app serves it at its URL,
in the navigation and on the index, with no Python changed; a lesson saved with mistakes shows
them on its page with their lines (never a 500) while every other page serves on."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server_process import ServerProcess, kv_budget_mb

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent


def copy_repository(to: Path) -> Path:
    """The tracked and new (not ignored) files, as a clean clone has them; .cache (the built
    kernels, the model) shared with this checkout."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, to / name)
    (to / ".cache").symlink_to(ROOT / ".cache")
    return to


def lessons_command(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "web.lessons", *args], cwd=root, capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, timeout=300)  # fmt: skip


def test_a_step_written_in_markdown_is_checked_and_served(tmp_path: Path) -> None:
    root = copy_repository(tmp_path / "repo")
    steps = sorted(int(p.name[:2]) for p in (root / "lessons").glob("[0-9][0-9]-*.md"))
    new = lessons_command(root, "new", "Share the load")
    assert new.returncode == 0, new.stdout + new.stderr
    step = steps[-1] + 1
    path = root / "lessons" / f"{step:02d}-share-the-load.md"
    path.write_text(path.read_text().replace("One or two sentences", "A step no Python knows about"))
    check = lessons_command(root, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    # Python untouched: the copy's .py files are this checkout's.
    for source in root.rglob("*.py"):
        relative = source.relative_to(root)
        if relative.parts[0] != ".cache":
            assert source.read_bytes() == (ROOT / relative).read_bytes(), relative

    server = ServerProcess("--kv-budget-mb", kv_budget_mb(64), "--max-num-seqs", "8", command=("app.py",), root=root)
    try:
        status, page = server.request("GET", f"/steps/{step}")
        text = page.decode()
        assert status == 200 and "Share the load" in text and "A step no Python knows about" in text
        assert f"Step {step} of {len(steps) + 1}" in text
        status, index = server.request("GET", "/")
        assert status == 200 and f'href="/steps/{step}"' in index.decode()
        # The finale is the lesson that says so, wherever it stands.
        status, finale = server.request("GET", "/steps/8")
        assert status == 200 and "The finale" in finale.decode()

        # Saved with mistakes: the page lists them at their lines; the rest serves on.
        broken = path.read_text().replace("  prompt_tokens: 200", "  prompt_tokns: 200").replace("    predict:", "    predcit:", 1)
        path.write_text(broken)
        status, page = server.request("GET", f"/steps/{step}")
        text = page.decode()
        assert status == 200 and "mistakes to fix" in text
        assert f"{path.name}:7</code> unknown lever" in text and "did you mean" in text and "predcit" in text
        status, index = server.request("GET", "/")
        assert status == 200 and f"{step}!" in index.decode()  # the navigation marks it
        assert server.request("GET", "/steps/1")[0] == 200
        status, authoring = server.request("GET", "/authoring")
        assert status == 200 and "Writing a lesson" in authoring.decode() and "prefix_aware_routing" in authoring.decode()
    finally:
        server.stop()
