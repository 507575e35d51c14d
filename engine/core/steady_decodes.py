"""Steady decodes: running sequences that take one token every step, kept as counts, not touched.

A what-if replica runs thousands of sequences through tens of thousands of steps, and a step that
visits each of them (schedule, price, land its token) is bound by memory, not by bytecodes: each
visit reads the sequence, its output list, its times and its block table. But a decode whose
token is known in advance (the simulator's constant token, nobody streaming) does the same thing
every step: one more computed token, one more output token, one more token time. So it joins
here: its fields stay as they were when it joined (its `mark`), the step count moves on, and its
fields are written out (the missing tokens, and their times from this log of step ends) when it
leaves: it finishes (its step is known when it joins: max_output), is preempted, aborted, or
read (sync). Its next KV block comes from a bucket by step, so a step touches only the
sixteenth of members whose block fills. The step's shape needs only their count and
their context, kept as a sum. The scheduler falls back to visiting every sequence, members
released, whenever a step might not run them all (budget, blocks): the batches are the same as
without (tests/test_steady_decodes.py runs whole simulations both ways and compares every figure).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from itertools import repeat

from engine.core.sequence import Sequence


@dataclass(slots=True)
class Member:
    mark: int  # the step its fields were last written at: they hold what it had before that step
    finish: int  # the step whose token is its last (max_output)
    need: int  # the step whose token needs its next KV block


class SteadyDecodes:
    def __init__(self, token: int, block_size: int) -> None:
        self.token = token  # what every member samples (engine/sim/runner.py SIM_TOKEN)
        self.block_size = block_size
        self.step = 0  # steps the members have taken since this began
        # Each step's end: the members' token times. Doubles, not float objects: a leaving member's
        # times are made fresh (and side by side) from a slice, where a list's slice touched
        # hundreds of floats made steps apart, a cache miss each.
        self.ends = array("d")
        self.members: dict[Sequence, Member] = {}
        self.needs: dict[int, list[Sequence]] = {}  # by step: the members whose last block is full
        self.finishing: dict[int, list[Sequence]] = {}
        self.context_offset = 0  # sum of (computed - mark): the members' context is this + count * step
        self.joins = self.releases = 0  # how often a decode joined, and the members were all let go

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self.members

    @property
    def context(self) -> int:
        """The members' computed tokens before this step (each decode's attention context - 1)."""
        return self.context_offset + len(self.members) * self.step

    def can_join(self, seq: Sequence) -> bool:
        """A decode whose every step is alike: its next token is to be computed, its first is out
        (a prompt's last token left alone looks like a decode, and its step makes the first token),
        it ends by length (the constant token stops nothing) and no stop strings are looked for."""
        outputs = len(seq.output_token_ids)
        return (
            seq.num_computed_tokens + 1 == len(seq.prompt_token_ids) + outputs
            and 0 < outputs < seq.max_output
            and not seq.has_stop_strings
            and self.token not in seq.stop_ids
        )

    def join(self, seq: Sequence) -> None:
        step, computed = self.step, seq.num_computed_tokens
        self.joins += 1
        finish = step + seq.max_output - len(seq.output_token_ids) - 1
        member = Member(step, finish, step + len(seq.block_table) * self.block_size - computed)
        self.members[seq] = member
        self.needs.setdefault(member.need, []).append(seq)
        self.finishing.setdefault(member.finish, []).append(seq)
        self.context_offset += computed - step

    def write(self, seq: Sequence, member: Member) -> None:
        """Bring seq's fields up to now: the tokens and token times of the steps since its mark."""
        k = self.step - member.mark
        if k:
            seq.num_computed_tokens += k
            seq.output_token_ids.extend(repeat(self.token, k))
            seq.times.tokens += self.ends[member.mark : self.step].tolist()
            member.mark = self.step  # computed - mark is unchanged: the context sum holds

    def leave(self, seq: Sequence) -> None:
        member = self.members.pop(seq)
        self.write(seq, member)
        _unlist(self.needs, member.need, seq)
        _unlist(self.finishing, member.finish, seq)
        self.context_offset -= seq.num_computed_tokens - self.step

    def release(self) -> None:
        """Every member leaves (a step the scheduler takes sequence by sequence)."""
        self.releases += 1
        for seq in list(self.members):
            self.leave(seq)

    def sync(self) -> None:
        """Every member's fields written up to now, for a reader of them (stats); all stay."""
        for seq, member in self.members.items():
            self.write(seq, member)

    def growing(self) -> list[Sequence]:
        """The members whose token this step needs a new block (grew() once it is theirs)."""
        return self.needs.get(self.step, [])

    def grew(self) -> None:
        """This step's growing members have their block: the next is needed a block's tokens on."""
        grown = self.needs.pop(self.step, [])
        later = self.step + self.block_size
        for seq in grown:
            self.members[seq].need = later
        if grown:
            self.needs.setdefault(later, []).extend(grown)

    def land(self, now: float) -> list[Sequence]:
        """The members' tokens of this step landed at now; those whose last it was, written out
        and gone, in no particular order."""
        self.ends.append(now)
        ending = self.finishing.pop(self.step, [])
        self.step += 1
        for seq in ending:
            member = self.members.pop(seq)
            self.write(seq, member)
            _unlist(self.needs, member.need, seq)
            self.context_offset -= seq.num_computed_tokens - self.step
        return ending


def _unlist(buckets: dict[int, list[Sequence]], key: int, seq: Sequence) -> None:
    bucket = buckets[key]
    bucket.remove(seq)
    if not bucket:
        del buckets[key]
