"""summary.json: one entry per phase (status, why, seconds, key figures, failed checks, skips),
the device and versions, and the carried bytes. Pure functions over the phases' records, so the
unit tests build summaries without running anything."""

from __future__ import annotations

from typing import Any

from bench.device_check.common import PhaseSpec

STATUSES = ("passed", "failed", "timed_out", "skipped")


def resolve_status(
    record: dict[str, Any] | None, exit_code: int | None, timed_out: bool, timeout_s: float
) -> tuple[str, str | None]:
    """(status, why) from what the phase wrote and how its process ended. The process is believed
    over the record: a record that says passed from a process that crashed afterwards is a failure."""
    if timed_out:
        return "timed_out", f"still running at its {timeout_s:.0f} s timeout: killed"
    if record is None:
        return "failed", f"wrote no result (exit code {exit_code})"
    status = record.get("status")
    if status == "failed":
        failed = [n for n, c in record.get("checks", {}).items() if c.get("hard") and not c.get("ok")]
        error = record.get("error")
        return "failed", (error.splitlines()[-1] if error else f"failed checks: {', '.join(failed)}")
    if exit_code != 0:
        return "failed", f"exit code {exit_code} (its record says {status!r})"
    if status == "passed":
        return "passed", None
    return "failed", f"ended with its record at {status!r}"


def phase_entry(
    spec: PhaseSpec,
    status: str,
    why: str | None,
    seconds: float,
    record: dict[str, Any] | None = None,
    exit_code: int | None = None,
    incomplete: bool = False,
) -> dict[str, Any]:
    """incomplete: a skip that leaves the check unfinished (the budget was spent), which fails it;
    a phase left out on purpose (--phases) does not."""
    assert status in STATUSES, status
    record = record or {}
    figures = record.get("figures", {})
    checks = record.get("checks", {})
    return {
        "name": spec.name,
        "what": spec.what,
        "status": status,
        "why": why,
        "seconds": round(seconds, 2),
        "exit_code": exit_code,
        "incomplete": incomplete,
        "key_figures": {k: figures[k] for k in record.get("key_figures", []) if k in figures},
        "checks_passed": sum(1 for c in checks.values() if c.get("ok")),
        "checks_failed": [n for n, c in checks.items() if c.get("hard") and not c.get("ok")],
        "skipped": record.get("skipped", {}),
        "warnings": record.get("warnings", []),
    }


def is_failure(entry: dict[str, Any]) -> bool:
    return entry["status"] in ("failed", "timed_out") or (entry["status"] == "skipped" and entry["incomplete"])


def build_summary(entries: list[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """meta: dry_run, seconds, budget_s, device, versions, carried (carried.carried's dict)."""
    carried = meta.get("carried") or {}
    counts = {s: sum(1 for e in entries if e["status"] == s) for s in STATUSES}
    return {
        "ok": not any(is_failure(e) for e in entries) and bool(carried.get("fits", False)),
        "counts": counts,
        **{k: v for k, v in meta.items() if k != "carried"},
        "carried_bytes": carried.get("bytes"),
        "carried_limit_bytes": carried.get("limit_bytes"),
        "carried_fits": carried.get("fits"),
        "carried": carried,
        "phases": entries,
    }


def table(summary: dict[str, Any]) -> str:
    """The summary as lines a person reads in the run's output."""
    lines = [f"device check ({'dry run, ' if summary.get('dry_run') else ''}{summary.get('device')}):"]
    for e in summary["phases"]:
        key = ", ".join(f"{k}={_short(v)}" for k, v in list(e["key_figures"].items())[:4])
        why = f" ({e['why']})" if e["why"] else ""
        lines.append(f"  {e['name']:<11} {e['status']:<9} {e['seconds']:>7.1f} s{why}{'  ' + key if key else ''}")
    carried = summary.get("carried_bytes")
    if carried is not None:
        lines.append(f"  carried {carried / 1048576:.2f} MiB of {summary['carried_limit_bytes'] / 1048576:.0f} MiB")
    lines.append("  OK" if summary["ok"] else "  FAILED")
    return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."
