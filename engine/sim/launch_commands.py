"""The command lines a plan's shape launches with: the simulator's own (`python -m engine.sim run`,
which re-runs the very point), and `vllm serve` and SGLang's `launch_server` with their real flag
names (tests/golden/ holds the flags each server's parser knows; bench/launch_flags.py checks
vLLM's against its parser where vLLM is installed).

A replica is one server (TP x PP GPUs); replicas that fit a node share one server as data-parallel
ranks (`--data-parallel-size` / `--dp-size`), one such server a node, behind a load balancer. A
prefill/decode split is two kinds of server joined by a KV connector and a router."""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

from engine.sim import constants as C
from engine.sim.spec import SimSpec

# The published checkpoints per model and weight dtype. FP8 serves the bf16 checkpoint quantized
# as it loads (both servers' `--quantization fp8`); FP4 needs NVIDIA's ModelOpt NVFP4 checkpoints.
CHECKPOINTS = {
    "llama-3.1-8b": {"bf16": "meta-llama/Llama-3.1-8B-Instruct", "fp4": "nvidia/Llama-3.1-8B-Instruct-FP4"},
    "llama-3.1-70b": {"bf16": "meta-llama/Llama-3.3-70B-Instruct", "fp4": "nvidia/Llama-3.3-70B-Instruct-FP4"},
    "llama-3.1-405b": {
        "bf16": "meta-llama/Llama-3.1-405B-Instruct", "fp8": "meta-llama/Llama-3.1-405B-Instruct-FP8",
        "fp4": "nvidia/Llama-3.1-405B-Instruct-FP4",
    },
    "llama-2-70b": {"bf16": "meta-llama/Llama-2-70b-chat-hf"},
}  # fmt: skip
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}  # vLLM's disaggregated-serving connector


def checkpoint(model: str, dtype: str) -> tuple[str, bool]:
    """(checkpoint, quantize while loading): an FP8 checkpoint where one is published, else the
    bf16 one quantized to FP8 as it loads."""
    known = CHECKPOINTS.get(model, {})
    if dtype in known:
        return known[dtype], False
    if dtype == "fp8" and "bf16" in known:
        return known["bf16"], True
    raise KeyError(f"no published {dtype} checkpoint of {model} is known to the planner")


def sim_command(spec: SimSpec) -> str:
    """The `python -m engine.sim run` that reproduces a point exactly (same workload, same seed)."""
    args = [
        "python", "-m", "engine.sim", "run", "--model", spec.model, "--device", spec.device, "--gpus", str(spec.gpus),
        "--tp", str(spec.tp), "--pp", str(spec.pp), "--dtype", spec.dtype, "--kv-dtype", spec.kv_dtype,
        "--input-tokens", str(spec.input_tokens), "--output-tokens", str(spec.output_tokens),
        "--input-range-ratio", f"{spec.input_range_ratio:g}", "--num-requests", str(spec.num_requests),
        "--rate", f"{spec.rate:g}", "--max-num-seqs", str(spec.max_num_seqs), "--seed", str(spec.seed),
    ]  # fmt: skip
    if spec.concurrency is not None:
        args += ["--concurrency", str(spec.concurrency)]
    if spec.prefill_gpus is not None:
        args += ["--prefill-gpus", str(spec.prefill_gpus), "--decode-gpus", str(spec.decode_gpus)]
    if spec.ttft_slo_ms is not None:
        args += ["--ttft-slo-ms", f"{spec.ttft_slo_ms:g}"]
    if spec.tpot_slo_ms is not None:
        args += ["--tpot-slo-ms", f"{spec.tpot_slo_ms:g}"]
    return shlex.join(args)


def _max_model_len(q: Any) -> int:
    longest = int(q.input_tokens * (1 + q.input_range_ratio)) + int(q.output_tokens * (1 + q.input_range_ratio))
    return 1024 * math.ceil(longest / 1024)


def _servers(replicas: int, group: int) -> tuple[int, int]:
    """(data-parallel replicas a server, servers): replicas share a node's server where they fit."""
    per_node = max(1, C.GPUS_PER_NODE // group) if group <= C.GPUS_PER_NODE else 1
    per_server = min(per_node, replicas)
    return per_server, math.ceil(replicas / per_server)


def _vllm(shape: Any, q: Any, replicas: int, role: str | None) -> dict[str, Any]:
    model, quantize = checkpoint(q.model, shape.dtype)
    group = shape.tp * shape.pp
    dp, servers = _servers(replicas, group)
    argv = [
        "vllm", "serve", model, "--tensor-parallel-size", str(shape.tp), "--pipeline-parallel-size", str(shape.pp),
        "--data-parallel-size", str(dp), "--max-num-seqs", str(shape.max_num_seqs),
        "--max-num-batched-tokens", str(SimSpec.max_batched_tokens), "--max-model-len", str(_max_model_len(q)),
    ]  # fmt: skip
    if quantize:
        argv += ["--quantization", "fp8"]
    if shape.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8"]
    if group > C.GPUS_PER_NODE:  # a replica across nodes: vLLM's multi-node executor
        argv += ["--distributed-executor-backend", "ray"]
    if role is not None:
        argv += ["--kv-transfer-config", json.dumps(NIXL, separators=(",", ":"))]
    return _entry(role or "serve", servers, dp * group, argv)


def _sglang(shape: Any, q: Any, replicas: int, role: str | None) -> dict[str, Any]:
    model, quantize = checkpoint(q.model, shape.dtype)
    group = shape.tp * shape.pp
    dp, servers = _servers(replicas, group)
    argv = [
        "python", "-m", "sglang.launch_server", "--model-path", model, "--tp-size", str(shape.tp),
        "--pp-size", str(shape.pp), "--dp-size", str(dp), "--max-running-requests", str(shape.max_num_seqs),
        "--chunked-prefill-size", str(SimSpec.max_batched_tokens), "--context-length", str(_max_model_len(q)),
    ]  # fmt: skip
    if quantize:
        argv += ["--quantization", "fp8"]
    elif shape.dtype == "fp4":
        argv += ["--quantization", "modelopt_fp4"]
    if shape.kv_dtype == "fp8":
        argv += ["--kv-cache-dtype", "fp8_e4m3"]
    if group > C.GPUS_PER_NODE:  # one server across nodes: each node runs it with its rank
        nodes = math.ceil(group / C.GPUS_PER_NODE)
        argv += ["--nnodes", str(nodes), "--node-rank", f"<0..{nodes - 1}>", "--dist-init-addr", "<head-node>:5000"]
    if role is not None:
        argv += ["--disaggregation-mode", role]
    return _entry(role or "serve", servers, dp * group, argv)


def _entry(role: str, servers: int, gpus_each: int, argv: list[str]) -> dict[str, Any]:
    return {"role": role, "servers": servers, "gpus_each": gpus_each, "argv": argv, "command": shlex.join(argv)}


def _servelab(shape: Any, q: Any) -> dict[str, Any]:
    """ServeLab's own server, where the plan's device is this machine's CPU (`cpu`): one process
    with every replica (DESIGN.md's entry points; each lever is a flag)."""
    argv = [
        "python", "-m", "engine", "serve", "--replicas", str(shape.replicas), "--tensor-parallel", str(shape.tp),
        "--pipeline-parallel", str(shape.pp), "--max-num-seqs", str(shape.max_num_seqs),
    ]  # fmt: skip
    return _entry("serve", 1, shape.replicas * shape.tp * shape.pp, argv)


def launch_commands(shape: Any, q: Any) -> dict[str, Any]:
    """Both servers' command lines for a plan's Shape under its PlanQuery (ServeLab's own for the
    `cpu` device, the live engine's machine)."""
    if shape.device == "cpu":
        if shape.prefill_replicas:
            return {"error": "ServeLab's own server colocates prefill and decode: no split to launch on this machine"}
        return {"servelab": [_servelab(shape, q)]}
    try:
        checkpoint(q.model, shape.dtype)
    except KeyError as err:
        return {"error": err.args[0]}
    if not shape.prefill_replicas:
        return {"vllm": [_vllm(shape, q, shape.replicas, None)], "sglang": [_sglang(shape, q, shape.replicas, None)]}
    decode = shape.replicas - shape.prefill_replicas
    router = ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill", "http://<prefill-host>:30000",
              "--decode", "http://<decode-host>:30000"]  # fmt: skip
    return {
        "vllm": [_vllm(shape, q, shape.prefill_replicas, "prefill"), _vllm(shape, q, decode, "decode")],
        "sglang": [_sglang(shape, q, shape.prefill_replicas, "prefill"), _sglang(shape, q, decode, "decode"),
                   _entry("router", 1, 0, router)],
        "note": "vLLM: a proxy in front sends each request to a prefill server, then its decode server "
                "(vLLM's disaggregated-serving proxy example); both kinds carry the NIXL connector",
    }  # fmt: skip
