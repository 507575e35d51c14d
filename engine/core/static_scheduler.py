"""Static batching (EngineConfig.paged = False): the scheduler before continuous batching, kept
so the lab can show what continuous batching fixed."""

from __future__ import annotations

from engine.core.contiguous_allocator import ContiguousAllocator
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.sequence import SequenceStatus


class StaticScheduler(Scheduler):
    """`paged=false`: form a batch, reserve prompt + max_tokens of contiguous KV for each member,
    and run it to completion before the next batch forms; finished members leave idle slots."""

    kv: ContiguousAllocator  # type: ignore[assignment]

    def schedule(self, max_continuing: int | None = None) -> SchedulerOutput:
        out = SchedulerOutput()
        if not self.running:
            now = self.clock.now()
            for seq in sorted(self.waiting, key=lambda s: s.times.arrival):
                if len(self.running) >= self.config.max_num_seqs or not self.kv.allocate(seq, 0):
                    break
                self.waiting.remove(seq)
                self.running.append(seq)
                seq.status = SequenceStatus.RUNNING
                seq.times.scheduled = now
                out.admitted.append(seq)
        for seq in self.running:
            if not seq.in_flight:
                out.add(seq, seq.num_tokens - seq.num_computed_tokens)
        return out
