"""A valid lesson file for the lesson tests to break one way at a time (tests/test_lessons.py,
test_lesson_rules.py, test_lesson_authoring.py, test_lesson_at_scale.py, test_predictions.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD = textwrap.dedent(
    """\
    ---
    step: 2
    title: Put a queue in front
    summary: Bursts wait in line instead of crushing the workers.
    levers:
      request_rate: 4.0
      queue_cap: 8
    charts: [queue_depth, rejected]
    scenarios:
      - title: A burst
        levers: {burstiness: 0.3}
        watch: The queue_depth chart fills, then drains.
        predict: {question: "How deep does the queue get?", metric: queue_depth, tolerance: 0.5}
    decision:
      question: Traffic is spiky and GPUs are fixed. What absorbs it?
      options:
        - text: Drop what does not fit
          correct: false
          why: Capacity frees up moments later.
        - text: A bounded queue with admission control
          correct: true
          why: It buffers bursts and sheds load only when deep.
    failure_modes:
      - title: Unbounded queue
        levers: {queue_cap: 10000, queue_bound: false, deadline_recheck: false, retry_jitter: false, central_queue: false}
        expect: Everyone waits; TTFT explodes.
        predict: {question: "What does TTFT do?", options: [explodes, stays flat], answer: 0, metric: ttft_p99}
    ---
    # The queue

    Body text with **bold**.

    ## Sources

    - The serving guide's step 2.
    """
)


def write(tmp_path: Path, text: str, name: str = "02-queue.md") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path
