"""The model runner only builds tensors and runs the model: it turns the scheduler's decision
into a flat token batch, runs one forward pass, and samples the sequences that reached their end."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.model.llama import AttentionBatch, Llama, PrefillChunk
from engine.sampler import Sampler
from engine.scheduler import SchedulerOutput
from engine.sequence import Sequence


class ModelRunner:
    def __init__(self, model: Llama, num_blocks: int, block_size: int, dtype: torch.dtype, device: str) -> None:
        cfg = model.cfg
        self.model = model
        self.block_size = block_size
        self.device = device
        # Stored heads outermost (one head's blocks gather into a matmul-ready tensor: 1.5x faster
        # CPU decode); the kernels take [num_blocks, block_size, KVH, D] views of any strides.
        shape = (cfg.num_kv_heads, num_blocks, block_size, cfg.head_dim)

        def cache() -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device).permute(1, 2, 0, 3)

        self.kv_caches = [(cache(), cache()) for _ in range(cfg.num_layers)]
        self.sampler = Sampler()
        # Tensor parallelism: rank 0 sends each step's batch to the other ranks before running it.
        self.on_step: Callable[[torch.Tensor, torch.Tensor, AttentionBatch], None] | None = None

    @torch.inference_mode()
    def execute(self, batch: SchedulerOutput) -> dict[str, int]:
        """Run one step; returns the new token of every sequence whose known tokens are all computed."""
        # Decodes sorted by length, so that attention's gather groups pad little.
        decodes = sorted(
            ((s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if n == 1), key=lambda d: d[0].num_computed_tokens
        )
        prefills = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if n > 1]
        input_ids, positions, attn = self._prepare(decodes, prefills)
        if self.on_step is not None:
            self.on_step(input_ids, positions, attn)
        hidden = self.model(input_ids, positions, attn, self.kv_caches)

        to_sample: list[Sequence] = []
        rows: list[int] = []
        offset = 0
        for seq, n in decodes + prefills:
            offset += n
            if seq.num_computed_tokens + n == seq.num_tokens:
                to_sample.append(seq)
                rows.append(offset - 1)
        if not to_sample:
            return {}
        logits = self.model.compute_logits(hidden[torch.tensor(rows, device=hidden.device)])
        ids = [s.request_id for s in to_sample]
        tokens = self.sampler.sample(logits.cpu(), [s.params for s in to_sample], ids)
        return dict(zip(ids, tokens))

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
        chunks = []
        for seq, n in prefills:
            start = seq.num_computed_tokens
            chunks.append(PrefillChunk(len(token_ids), n, start, torch.tensor(seq.block_table, device=self.device)))
            token_ids.extend(seq.token_ids[start : start + n])
        dev = self.device
        nd = len(decodes)
        seq_lens = torch.from_numpy((starts + counts).astype(np.int32)).to(dev)
        block_tables = torch.from_numpy(tables).to(dev)
        attn = AttentionBatch(
            slot_mapping=torch.from_numpy(slots).to(dev),
            num_decodes=nd,
            decode_block_tables=block_tables[:nd],
            decode_context_lens=seq_lens[:nd],
            prefills=chunks,
            block_tables=block_tables,
            seq_lens=seq_lens,
            query_start_loc=torch.from_numpy(query_start.astype(np.int32)).to(dev),
        )
        return torch.tensor(token_ids, device=dev), torch.from_numpy(positions).to(dev), attn
