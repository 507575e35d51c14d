"""`python -m bench.check_platforms`: does requirements.txt install on every machine ServeLab runs on?

For each target (Linux x86-64 and ARM64 on glibc 2.28+, macOS 14+ on Apple silicon; CPython 3.11)
it evaluates every requirement's environment marker for that target, not for this machine (pip's
`--platform` would judge markers by the interpreter running pip), then asks pip to resolve the
requirements that apply from PyPI, wheels only:

    pip install --dry-run --ignore-installed --no-deps --only-binary=:all: --report FILE
        --platform <the target's tags...> --python-version 3.11 --implementation cp --abi cp311

Wheels only because every pin has one on every target (checked 2026-12-03): none is sdist-only,
so no requirement gets a source-build fallback. `--dry-run` keeps nothing. Where the index
serves PEP 658 metadata files (pypi.org does) pip reads only those, a few KB a wheel. Where it
does not (this machine's pypi.org, measured 2026-12-03), pip downloads each wheel whole and
reads its METADATA: 1.9 GB for the three targets (torch's are 111-526 MB), 22 s at this
machine's ~85 MB/s. pip's `--use-feature=fast-deps` reads the metadata by HTTP range requests
instead, but torch's 3.4 MB zip directory takes ~345 sequential 10 KB requests: 3-48 s per torch
wheel with this index's latency, against 9-10 s for the whole 427 MB, so it is not used.

pip runs isolated from this machine's pip settings (`--isolated` and PIP_CONFIG_FILE=/dev/null:
no constraint file capping torch, no local wheel folder or index), against --index-url only.

The model package (the Makefile's MODEL_PKG, installed with --no-deps) is checked beside them.
Prints one line per target, `ok` or each failing requirement and why; exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org/simple"
PYTHON = "3.11"
# The oldest glibc the Linux targets promise: torch's and triton's wheels are manylinux_2_28.
GLIBC_MINOR = 28


@dataclass(frozen=True)
class Target:
    name: str
    sys_platform: str
    platform_system: str
    platform_machine: str  # as platform.machine() says it there: macOS says arm64, Linux aarch64
    platforms: tuple[str, ...]  # the wheel platform tags a machine of this kind installs

    def environment(self) -> dict[str, str]:
        """Every PEP 508 marker variable as this target's CPython 3.11 has it: none of this
        machine's values may leak in (packaging fills what is missing from the running Python)."""
        return {
            "implementation_name": "cpython",
            "implementation_version": f"{PYTHON}.0",
            "os_name": "posix",
            "platform_machine": self.platform_machine,
            "platform_python_implementation": "CPython",
            "platform_release": "",
            "platform_system": self.platform_system,
            "platform_version": "",
            "python_full_version": f"{PYTHON}.0",
            "python_version": PYTHON,
            "sys_platform": self.sys_platform,
        }


def manylinux_tags(arch: str, glibc_minor: int = GLIBC_MINOR) -> tuple[str, ...]:
    """The manylinux tags a glibc 2.<glibc_minor> machine accepts, newest first: pip's --platform
    does not widen manylinux_2_28 to the older tags (it does widen macosx_14_0 to older macOS)."""
    tags = [f"manylinux_2_{minor}_{arch}" for minor in range(glibc_minor, 16, -1)]
    tags.append(f"manylinux2014_{arch}")  # = manylinux_2_17
    if arch == "x86_64":
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]  # = 2_12 and 2_5; no aarch64 ones
    return tuple(tags)


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("linux-x86_64", "linux", "Linux", "x86_64", manylinux_tags("x86_64")),
        Target("linux-aarch64", "linux", "Linux", "aarch64", manylinux_tags("aarch64")),
        # torch 2.13.0's only macOS wheel is macosx_14_0_arm64; pip widens this to 10.x-14.0 and universal2.
        Target("macos-arm64", "darwin", "Darwin", "arm64", ("macosx_14_0_arm64",)),
    )
}


def read_requirements(path: Path) -> list[Requirement]:
    """The requirements in a requirements file: one per line, `#` comments dropped. Options (-r,
    -c, --index-url) are refused: the check would not see what they change."""
    reqs = []
    for n, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            raise ValueError(f"{path}:{n}: pip options are not checked: {line}")
        try:
            reqs.append(Requirement(line))
        except InvalidRequirement as exc:
            raise ValueError(f"{path}:{n}: {exc}") from exc
    return reqs


def model_package(makefile: Path = ROOT / "Makefile") -> Requirement | None:
    """The Makefile's MODEL_PKG (installed by `make run` beside requirements.txt), if it has one."""
    match = re.search(r"^MODEL_PKG\s*:?=\s*(\S+)\s*$", makefile.read_text(), re.MULTILINE) if makefile.exists() else None
    return Requirement(match.group(1)) if match else None


def applies(req: Requirement, target: Target) -> bool:
    return req.marker is None or req.marker.evaluate(target.environment())


def split_by_marker(reqs: Iterable[Requirement], target: Target) -> tuple[list[Requirement], list[Requirement]]:
    """(the requirements that apply on target, those its markers leave out)."""
    used: list[Requirement] = []
    skipped: list[Requirement] = []
    for req in reqs:
        (used if applies(req, target) else skipped).append(req)
    return used, skipped


def pinned(req: Requirement) -> str:
    """The requirement without its marker, for pip: pip would judge the marker on this machine."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def pip_command(target: Target, reqs: Iterable[Requirement], report: Path, index_url: str) -> list[str]:
    cmd = [
        sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed", "--no-deps",
        "--only-binary=:all:", "--no-cache-dir", "--report", str(report), "--index-url", index_url,
        "--python-version", PYTHON, "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}",
        "--progress-bar", "off", "--disable-pip-version-check", "--no-input", "--timeout", "30",
    ]  # fmt: skip (--no-cache-dir: other platforms' wheels are of no use in this machine's cache)
    for tag in target.platforms:
        cmd += ["--platform", tag]
    if os.environ.get("PIP_CERT"):  # --isolated drops it; a proxy's CA may still be needed
        cmd += ["--cert", os.environ["PIP_CERT"]]
    return cmd + [pinned(r) for r in reqs]


def pip_env(tmp: str) -> dict[str, str]:
    # No pip config file at all: --isolated drops PIP_* variables and the user's file, but still
    # reads the global ones (/etc/xdg/pip/pip.conf, which caps torch here). TMPDIR: the wheels pip
    # downloads go under our temporary folder, removed even when pip is killed at the timeout.
    return os.environ | {"PIP_CONFIG_FILE": os.devnull, "TMPDIR": tmp}


_NOT_FOUND = re.compile(r"Could not find a version that satisfies the requirement (\S+) \(from versions: ([^)]*)\)")


def unresolved(pip_output: str) -> tuple[str, str] | None:
    """(requirement, why) from pip's "no matching distribution" error, if that is what it said."""
    match = _NOT_FOUND.search(pip_output)
    if match is None:
        return None
    spec, versions = match.group(1), match.group(2).strip()
    if versions == "none":
        return spec, "no wheel of any version for this target"
    return spec, f"no wheel of this version for this target (versions with one: {versions})"


@dataclass
class TargetResult:
    target: Target
    checked: list[Requirement]
    skipped: list[Requirement]
    failures: list[tuple[str, str]] = field(default_factory=list)  # (requirement, why)
    wheels: dict[str, str] = field(default_factory=dict)  # canonical project name -> the wheel pip chose
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def line(self) -> str:
        tags = self.target.platforms[0]
        head = f"{self.target.name:14} ({tags}, cp{PYTHON.replace('.', '')}): "
        left_out = f"; left out by markers: {', '.join(r.name for r in self.skipped)}" if self.skipped else ""
        if self.ok:
            return f"{head}ok, {len(self.checked)} requirements resolve to wheels{left_out} ({self.seconds:.1f} s)"
        why = "; ".join(f"{req}: {reason}" for req, reason in self.failures)
        return f"{head}FAILED: {why}{left_out} ({self.seconds:.1f} s)"


def check_target(
    target: Target, reqs: Iterable[Requirement], index_url: str = PYPI, timeout_s: float = 90.0
) -> TargetResult:
    """Resolve the requirements that apply on target with pip. On a failure pip names the first
    requirement it could not find; that one is set aside and the rest resolved again, so every
    failing requirement is named."""
    start = time.monotonic()
    checked, skipped = split_by_marker(reqs, target)
    result = TargetResult(target, checked, skipped)
    todo = list(checked)
    with tempfile.TemporaryDirectory(prefix="servelab-platforms-") as tmp:
        report = Path(tmp) / "report.json"
        while todo:
            left = timeout_s - (time.monotonic() - start)
            try:
                proc = subprocess.run(
                    pip_command(target, todo, report, index_url), check=False, capture_output=True,
                    text=True, env=pip_env(tmp), timeout=max(left, 1.0), cwd=tmp,
                )  # fmt: skip
            except subprocess.TimeoutExpired:
                result.failures.append(("(pip)", f"did not finish within {timeout_s:.0f} s"))
                break
            if proc.returncode == 0:
                for item in json.loads(report.read_text())["install"]:
                    url = item["download_info"]["url"]
                    result.wheels[canonicalize_name(item["metadata"]["name"])] = url.rsplit("/", 1)[-1]
                break
            named = unresolved(proc.stdout + proc.stderr)
            rest = [r for r in todo if named is None or pinned(r).lower() != named[0].lower()]
            if named is None or len(rest) == len(todo):  # not a missing wheel: say what pip said
                errors = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.startswith("ERROR")]
                result.failures.append(("(pip)", " ".join(errors)[:400] or f"exit code {proc.returncode}"))
                break
            result.failures.append(named)
            todo = rest
    result.seconds = time.monotonic() - start
    return result


def check(
    reqs: list[Requirement], targets: Iterable[Target], index_url: str = PYPI, timeout_s: float = 90.0
) -> list[TargetResult]:
    """Every target at once: pip spends its time waiting on the index, not on the CPU."""
    targets = list(targets)
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        return list(pool.map(lambda t: check_target(t, reqs, index_url, timeout_s), targets))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-r", "--requirements", type=Path, default=ROOT / "requirements.txt")
    ap.add_argument("--target", choices=sorted(TARGETS), action="append", help="default: all")
    ap.add_argument("--index-url", default=PYPI)
    ap.add_argument("--no-model", action="store_true", help="leave out the Makefile's MODEL_PKG")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds per target")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the wheel chosen for each requirement")
    args = ap.parse_args(argv)
    reqs = read_requirements(args.requirements)
    model = None if args.no_model else model_package()
    if model is not None:
        reqs.append(model)
    start = time.monotonic()
    results = check(reqs, [TARGETS[name] for name in args.target or TARGETS], args.index_url, args.timeout)
    for result in results:
        print(result.line())
        if args.verbose:
            for wheel in sorted(result.wheels.values()):
                print(f"    {wheel}")
    failed = sum(not r.ok for r in results)
    print(f"{len(results) - failed} of {len(results)} targets ok in {time.monotonic() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
