"""The model runner only builds tensors and runs the model: it turns the scheduler's decision
into a flat token batch, runs one forward pass, and samples the sequences that reached their end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import Sequence
from engine.model.llama import AttentionBatch, Llama, PrefillChunk
from engine.platform.huge_pages import zeros_on_huge_pages
from engine.platform.threads import ThreadGovernor
from engine.sample.logits_processors import needs_processing, process_logits
from engine.sample.logprobs import token_logprobs
from engine.sample.sampler import Sampler, greedy_tokens, target_probs
from engine.sample.spec_verify import accept_greedy, accept_sampled
from engine.worker.cuda_graphs import DecodeGraphs
from engine.worker.host_staging import HostStaging

PROMPT_LOGITS_ROWS = 256  # prompt positions per logits matmul when a request wants prompt logprobs


class PipelineStages(Protocol):
    """Rank 0's link to the later pipeline stages (engine/parallel/distributed.py ShardGroup)."""

    def pass_on(self, hidden: torch.Tensor) -> None: ...

    def take_back(self, num_rows: int, width: int) -> torch.Tensor: ...


@dataclass
class LaunchedStep:
    """A step whose layers ran (or, pipelined, are running in the later stages): the sequences in
    the order of its token rows, and the last layer's output once it is here."""

    order: list[tuple[Sequence, int]]
    hidden: torch.Tensor | None
    num_tokens: int = 0
    # Pipelined: the rows to sample, whose logits the last stage sends back (None: it sends every
    # token's residual stream, for a step whose prompt logprobs need them).
    logit_rows: list[int] | None = None
    began: float = 0.0  # perf_counter when its forward started (the model's part of the step begins)


class ModelRunner:
    def __init__(
        self, model: Llama, num_blocks: int, block_size: int, dtype: torch.dtype, device: str, huge_pages: bool = False,
        scratch_block: bool = False,
    ) -> None:
        """scratch_block: one block past num_blocks that no sequence owns, where CUDA graphs'
        padding rows write (engine/worker/cuda_graphs.py)."""
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        self.device = device
        self.scratch_block = num_blocks if scratch_block else None
        # Stored heads outermost (one head's blocks gather into a matmul-ready tensor: 1.5x faster
        # CPU decode); the kernels take [num_blocks, block_size, KVH, D] views of any strides.
        shape = (cfg.num_kv_heads, num_blocks + scratch_block, block_size, cfg.head_dim)

        def cache() -> torch.Tensor:
            if device == "cpu" and huge_pages:  # blocks scattered over the cache: huge pages spare the TLB
                return zeros_on_huge_pages(shape, dtype).permute(1, 2, 0, 3)
            return torch.zeros(shape, dtype=dtype, device=device).permute(1, 2, 0, 3)

        self.kv_caches = [(cache(), cache()) for _ in range(cfg.num_layers)]
        if dtype != model.embed.dtype:  # the C++ op and the Triton kernels read the cache in the queries'
            model.attention_impl = "torch"  # dtype; the torch path widens an fp8 cache
        self.sampler = Sampler()
        self.eos_token_ids = list(cfg.eos_token_ids)  # masked while a request is under min_tokens
        # Tensor parallelism: rank 0 sends each step's batch to the other ranks before running it.
        self.on_step: Callable[[torch.Tensor, torch.Tensor, AttentionBatch, list[int] | None], None] | None = None
        # Pipeline parallelism: this process runs the first stage; the rest come back through this.
        self.stages: PipelineStages | None = None
        # The latest step's raw logits (a reference, no copy) and whose each row is: how the
        # batch_invariant check compares a prompt's logits alone and inside a full batch.
        self.last_logits: tuple[list[str], torch.Tensor] | None = None
        # Fits the CPU threads to the cores others leave (engine/platform/threads.py); None: fixed.
        self.governor: ThreadGovernor | None = None
        self.last_model_s = 0.0  # the latest collected step's forward + sampling (engine/worker/executor.py Runner)
        self.staging = HostStaging(device)  # the step's inputs: pinned, one copy per dtype on CUDA
        self.graphs: DecodeGraphs | None = None  # CUDA graphs for decode-only steps, once captured

    def _prompt_logprobs(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """echo: the logprob of each prompt token given the ones before it, from this chunk's
        rows (position p's logits predict token p + 1). Only asked-for requests pay for the full
        logits; positions already done (before a preemption's recompute) are skipped."""
        if not seq.prompt_logprobs:
            seq.prompt_logprobs.append(None)  # the first token has nothing before it
        start = seq.num_computed_tokens
        first = len(seq.prompt_logprobs) - 1  # the next position whose logits are still needed
        end = min(start + hidden.shape[0], seq.num_prompt_tokens - 1)
        k = seq.params.prompt_logprobs or 0
        for lo in range(max(first, start), end, PROMPT_LOGITS_ROWS):  # bounded memory: V floats per row
            hi = min(lo + PROMPT_LOGITS_ROWS, end)
            logits = self.model.compute_logits(hidden[lo - start : hi - start]).cpu()
            seq.prompt_logprobs += token_logprobs(logits, seq.prompt_token_ids[lo + 1 : hi + 1], [k] * (hi - lo))

    def execute(self, batch: SchedulerOutput) -> dict[str, int | list[int]]:
        """Run one step; returns the new token of every sequence whose known tokens are all
        computed, and a speculating decode's accepted guesses and the token after them (a list)."""
        return self.collect(self.launch(batch))

    @torch.inference_mode()
    def launch(self, batch: SchedulerOutput) -> LaunchedStep:
        """Build the step's tensors and run this process's layers: the whole model, or the first
        pipeline stage, whose output then goes on to the second (the step is collected later)."""
        # Decodes sorted by length, so that attention's gather groups pad little.
        decodes = sorted(
            ((s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if n == 1), key=lambda d: d[0].num_computed_tokens
        )
        prefills = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if n > 1]
        input_ids, positions, attn = self._prepare(decodes, prefills)
        order = decodes + prefills
        logit_rows = None
        if self.stages is not None and not any(_wants_prompt_logprobs(seq) for seq, _ in order):
            logit_rows = _sample_rows(order)[1]
        if self.governor is not None:
            self.governor.before_step()
        if self.on_step is not None:
            self.on_step(input_ids, positions, attn, logit_rows)
        began = time.perf_counter()  # the inputs are built and sent to the other ranks: the host's part ends
        size = self.graphs.bucket(len(decodes)) if self.graphs is not None and not prefills else None
        if size is not None:
            assert self.graphs is not None
            self.graphs.fill(
                len(decodes), size, input_ids, positions, attn.slot_mapping, attn.decode_block_tables,
                attn.decode_context_lens,
            )
            hidden = self.graphs.run(len(decodes), size)
        else:
            hidden = self.model(input_ids, positions, attn, self.kv_caches)
        if self.stages is None:
            return LaunchedStep(order, hidden, began=began)
        self.stages.pass_on(hidden)
        return LaunchedStep(order, None, len(input_ids), logit_rows, began)

    def collect(self, step: LaunchedStep) -> dict[str, int | list[int]]:
        """The step's new tokens; last_model_s from its forward's start to its tokens, as rank 0
        sees it: its forward waits on the other TP ranks in the all-reduces and on the later
        pipeline stages for the logits (overlapped, the engine's work meanwhile hides behind them)."""
        tokens = self._sample(step)
        self.last_model_s = time.perf_counter() - step.began
        return tokens

    @torch.inference_mode()
    def _sample(self, step: LaunchedStep) -> dict[str, int | list[int]]:
        """The step's new tokens, from the last layer's output, or pipelined from the last stage's
        logits of the rows to sample (its residual stream where prompt logprobs need every row)."""
        hidden = step.hidden
        if hidden is None and step.logit_rows is None:
            assert self.stages is not None
            hidden = self.stages.take_back(step.num_tokens, self.model.cfg.hidden_size)
        if hidden is not None:
            offset = 0
            for seq, n in step.order:
                if _wants_prompt_logprobs(seq):
                    self._prompt_logprobs(seq, hidden[offset : offset + n])
                offset += n
        tokens: dict[str, int | list[int]] = {}
        if hidden is not None and (guessing := _guess_rows(step.order)):
            tokens.update(self._verify(hidden, guessing))
        to_sample, rows = _sample_rows(step.order)
        if not to_sample:
            if hidden is not None and hidden.is_cuda and not tokens:  # nothing copied back: wait, so last_model_s holds the GPU's work
                torch.cuda.synchronize(hidden.device)
            return tokens
        if hidden is not None:
            raw = self.model.raw_logits(hidden[torch.tensor(rows, device=hidden.device)]).cpu()
        else:
            assert self.stages is not None
            raw = self.stages.take_back(len(rows), self.model.cfg.vocab_size).cpu()
        ids = [s.request_id for s in to_sample]
        self.last_logits = (ids, raw)
        if all(s.params.greedy and s.params.logprobs is None and not needs_processing(s) for s in to_sample):
            return tokens | dict(zip(ids, greedy_tokens(raw).tolist()))  # the common case: no fp32 copy
        wanted = [r for r, s in enumerate(to_sample) if s.params.logprobs is not None]
        # The sampler reads bf16 as it is; penalties and logprobs work on an fp32 copy.
        logits = raw.float() if wanted or any(needs_processing(s) for s in to_sample) else raw
        processed = process_logits(logits, to_sample, self.eos_token_ids)
        sampled = self.sampler.sample(processed, [s.params for s in to_sample], ids)
        if wanted:  # from the model's logits, before penalties (see engine/sample/logprobs.py)
            found = token_logprobs(
                logits[wanted], [sampled[r] for r in wanted], [to_sample[r].params.logprobs or 0 for r in wanted]
            )
            for r, lp in zip(wanted, found):
                to_sample[r].output_logprobs.append(lp)
        return tokens | dict(zip(ids, sampled))

    def _verify(self, hidden: torch.Tensor, guessing: list[tuple[Sequence, int, int]]) -> dict[str, int | list[int]]:
        """Speculating decodes (engine/sample/spec_decode.py): the logits of each one's 1 + k rows (its
        last token's, then each guess's), and what they accept."""
        rows = [r for _, first, n in guessing for r in range(first, first + n)]
        raw = self.model.raw_logits(hidden[torch.tensor(rows, device=hidden.device)]).cpu()
        out: dict[str, int | list[int]] = {}
        offset = 0
        for seq, _, n in guessing:
            block, offset = raw[offset : offset + n], offset + n
            params = seq.params
            if params.greedy:
                out[seq.request_id] = accept_greedy(greedy_tokens(block).tolist(), seq.spec_token_ids)
            else:
                draw = self.sampler.uniform_source(params, seq.request_id)
                out[seq.request_id] = accept_sampled(target_probs(block, params), seq.spec_token_ids, draw)
        return out

    def forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)

    def _prepare(
        self, decodes: list[tuple[Sequence, int]], prefills: list[tuple[Sequence, int]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """The step's tensors, built with numpy over the batch rather than per token in Python."""
        bs = self.block_size
        seqs = decodes + prefills
        counts = np.fromiter((n for _, n in seqs), np.int64, len(seqs))
        starts = np.fromiter((s.num_computed_tokens for s, _ in seqs), np.int64, len(seqs))
        query_start = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum(counts, out=query_start[1:])
        tables = np.zeros((len(seqs), max((len(s.block_table) for s, _ in seqs), default=0)), np.int32)
        for row, (seq, _) in zip(tables, seqs):
            row[: len(seq.block_table)] = seq.block_table
        owner = np.repeat(np.arange(len(seqs)), counts)  # each token's sequence
        positions = np.arange(query_start[-1]) - query_start[owner] + starts[owner]
        slots = tables[owner, positions // bs].astype(np.int64) * bs + positions % bs
        token_ids = [seq.token_at(seq.num_computed_tokens) for seq, _ in decodes]
        chunk_rows: list[tuple[int, int, int]] = []  # (first row, tokens, computed) of each prefill
        for seq, n in prefills:
            start = seq.num_computed_tokens
            chunk_rows.append((len(token_ids), n, start))
            if seq.spec_token_ids:  # a decode checking its guesses: its last token, then them
                token_ids += [seq.token_at(start), *seq.spec_token_ids]
            else:
                token_ids.extend(seq.token_ids[start : start + n])
        nd = len(decodes)
        # Every index tensor in one upload (one pinned copy per dtype on CUDA; none on the CPU).
        ids, pos, slot_t, block_tables, seq_lens, qsl, *chunk_tables = self.staging.upload([
            np.asarray(token_ids, np.int64), positions.astype(np.int64, copy=False), slots, tables,
            (starts + counts).astype(np.int32), query_start.astype(np.int32),
            *(np.asarray(seq.block_table, np.int64) for seq, _ in prefills),
        ])  # fmt: skip
        attn = AttentionBatch(
            slot_mapping=slot_t,
            num_decodes=nd,
            decode_block_tables=block_tables[:nd],
            decode_context_lens=seq_lens[:nd],
            prefills=[PrefillChunk(*rows, table) for rows, table in zip(chunk_rows, chunk_tables)],
            block_tables=block_tables,
            seq_lens=seq_lens,
            query_start_loc=qsl,
        )
        return ids, pos, attn


def _wants_prompt_logprobs(seq: Sequence) -> bool:
    return seq.params.prompt_logprobs is not None and seq.num_computed_tokens < seq.num_prompt_tokens - 1


def _guess_rows(order: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int, int]]:
    """Speculating decodes in the step: each with its first row and its 1 + k rows."""
    found, offset = [], 0
    for seq, n in order:
        if seq.spec_token_ids and n == 1 + len(seq.spec_token_ids):
            found.append((seq, offset, n))
        offset += n
    return found


def _sample_rows(order: list[tuple[Sequence, int]]) -> tuple[list[Sequence], list[int]]:
    """The sequences whose known tokens this step completes, and their last rows: those it samples."""
    to_sample: list[Sequence] = []
    rows: list[int] = []
    offset = 0
    for seq, n in order:
        offset += n
        if seq.num_computed_tokens + n == seq.num_tokens:
            to_sample.append(seq)
            rows.append(offset - 1)
    return to_sample, rows
