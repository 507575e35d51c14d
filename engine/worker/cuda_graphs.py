"""CUDA graphs for decode-only steps. A decode of a small model is ~600 kernel launches of a few
microseconds' work each: the host's launching, not the GPU, sets the step time. Each batch size in
capture_sizes is captured once (its forward over static input buffers) and replayed: one launch.

A batch of n decodes runs the graph of the smallest captured size >= n: its input rows are copied
into the static buffers, and the rows past n are padding that writes its K/V into a scratch block
the block manager never hands out (the runner allocates it past the last) and attends to one token
of it. The decode kernel sizes its split-K from the block table's width (engine/kernels/
triton_attention.py), so the static table is as wide as the longest context and one graph serves
every length. A size is kept only where its replay measured faster than the eager forward at
capture (`report` holds both), so a model big enough to be bound by its weights keeps none."""

from __future__ import annotations

import statistics
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model.llama import AttentionBatch, Llama

KEEP_MARGIN = 0.95  # a replay must beat the eager forward by 5%, or the size runs eager
TIMING_REPEATS = 5


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's ladder: 1, 2, 4, then every multiple of 8, up to and including max_num_seqs."""
    ladder = [1, 2, 4, *range(8, max_num_seqs + 1, 8)]
    return sorted({s for s in ladder if s < max_num_seqs} | {max_num_seqs})


def bucket_of(n: int, sizes: list[int]) -> int | None:
    """The captured size a batch of n runs as (None: larger than any)."""
    i = bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def worth_keeping(eager_ms: float, graph_ms: float) -> bool:
    return graph_ms < KEEP_MARGIN * eager_ms


@dataclass
class CapturedSize:
    graph: torch.cuda.CUDAGraph
    hidden: torch.Tensor  # the graph's output rows (static: valid until the next replay)


class DecodeGraphs:
    def __init__(
        self, model: Llama, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], max_num_seqs: int,
        max_blocks: int, scratch_block: int, block_size: int, device: str,
    ) -> None:
        self.model, self.kv_caches = model, kv_caches
        self.sizes = capture_sizes(max_num_seqs)
        self.pad_slot = scratch_block * block_size
        self.scratch_block = scratch_block
        n = max_num_seqs
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slots = torch.full((n,), self.pad_slot, dtype=torch.long, device=device)
        self.tables = torch.full((n, max_blocks), scratch_block, dtype=torch.int32, device=device)
        self.lens = torch.ones(n, dtype=torch.int32, device=device)
        self.captured: dict[int, CapturedSize] = {}
        self.report: dict[int, tuple[float, float]] = {}  # size -> (eager ms, replay ms) at capture
        self.replays = 0

    def bucket(self, n: int) -> int | None:
        """The kept size a batch of n decodes replays, or None: it runs eager."""
        size = bucket_of(n, self.sizes)
        return size if size in self.captured else None

    def fill(
        self, n: int, size: int, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
        tables: torch.Tensor, lens: torch.Tensor,
    ) -> None:
        """The batch's rows into the static buffers; rows n..size pad (scratch slot, one token)."""
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(slots)
        self.tables[:n, : tables.shape[1]].copy_(tables)
        self.lens[:n].copy_(lens)
        if size > n:
            self.input_ids[n:size].zero_()
            self.positions[n:size].zero_()
            self.slots[n:size].fill_(self.pad_slot)
            self.lens[n:size].fill_(1)

    def run(self, n: int, size: int) -> torch.Tensor:
        captured = self.captured[size]
        captured.graph.replay()
        self.replays += 1
        return captured.hidden[:n]

    def _attention(self, size: int) -> AttentionBatch:
        return AttentionBatch(
            slot_mapping=self.slots[:size], num_decodes=size, decode_block_tables=self.tables[:size],
            decode_context_lens=self.lens[:size], prefills=[],
        )

    def _forward(self, size: int) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.positions[:size], self._attention(size), self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first (later graphs reuse its memory pool); every row pads while capturing, so
        nothing but the scratch block is written."""
        side = torch.cuda.Stream()  # warm up off the capture's stream (cuBLAS, Triton's first calls)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(self.sizes[-1])
        torch.cuda.current_stream().wait_stream(side)
        pool = None
        for size in reversed(self.sizes):
            eager_ms = time_ms(lambda size=size: self._forward(size))  # also compiles the kernels
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self._forward(size)
            pool = graph.pool()
            graph_ms = time_ms(graph.replay)
            self.report[size] = (eager_ms, graph_ms)
            if worth_keeping(eager_ms, graph_ms):
                self.captured[size] = CapturedSize(graph, hidden)
        torch.cuda.synchronize()

    def describe(self) -> str:
        kept = sorted(self.captured)
        if not kept:
            return "CUDA graphs: none kept (no size replayed faster than eager)"
        return f"CUDA graphs for decode batches of {kept[0]}..{kept[-1]} ({len(kept)} of {len(self.sizes)} sizes)"


def time_ms(fn: Callable[[], object], repeats: int = TIMING_REPEATS) -> float:
    """Median milliseconds of fn on the GPU, from CUDA events (the host's launching included)."""
    fn()  # once untimed: first calls compile and allocate
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
