"""The model runner only builds tensors and runs the model: it turns the scheduler's decision
into a flat token batch, runs one forward pass, and samples the sequences that reached their end."""

from __future__ import annotations

from collections.abc import Callable

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

    def forget(self, request_id: str) -> None:
        self.sampler.forget(request_id)

    def _prepare(
        self, decodes: list[tuple[Sequence, int]], prefills: list[tuple[Sequence, int]]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        bs = self.block_size
        token_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        for seq, _ in decodes:
            pos = seq.num_computed_tokens
            token_ids.append(seq.token_at(pos))
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
        max_blocks = max((len(s.block_table) for s, _ in decodes), default=0)
        tables = [s.block_table + [0] * (max_blocks - len(s.block_table)) for s, _ in decodes]
        chunks = []
        for seq, n in prefills:
            start = seq.num_computed_tokens
            chunks.append(PrefillChunk(len(token_ids), n, start, torch.tensor(seq.block_table, device=self.device)))
            token_ids.extend(seq.token_ids[start : start + n])
            for pos in range(start, start + n):
                slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            positions.extend(range(start, start + n))
        dev = self.device
        attn = AttentionBatch(
            slot_mapping=torch.tensor(slots, device=dev),
            num_decodes=len(decodes),
            decode_block_tables=torch.tensor(tables, dtype=torch.int32, device=dev).view(len(decodes), max_blocks),
            decode_context_lens=torch.tensor(
                [s.num_computed_tokens + 1 for s, _ in decodes], dtype=torch.int32, device=dev
            ),
            prefills=chunks,
        )
        return torch.tensor(token_ids, device=dev), torch.tensor(positions, device=dev), attn
