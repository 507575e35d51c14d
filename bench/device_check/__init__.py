"""The device check for a lent GPU machine (issue 44): `OUT=... python -m bench.device_check`.

One command that installs nothing and needs nothing the machine lacks (no GGUF, no gguf, no
flask, no network): it generates its model weights from a seed, runs each phase in its own
subprocess with its own timeout, and writes every phase's log and figures, and summary.json,
under $OUT. `--dry-run` runs the same phases on the CPU; tests/test_device_check.py runs it in CI.

  __main__.py    the orchestrator            common.py   the phase table, PhaseContext
  phase.py       one phase's process         summary.py  summary.json (pure)
  carried.py     the bytes carried (pure)    weights.py  the seeded HF folders
  compare.py     engine against reference    p00_env.py ... p04_decode.py: the phases
"""
