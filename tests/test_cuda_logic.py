"""The CUDA logic that needs no GPU (issue 44): which device an engine takes, how a card's memory
is planned from what it reports (a stubbed probe), the CUDA graphs' bookkeeping, and the staged
uploads of a step's inputs. The CUDA calls themselves run in `python -m bench.device_check`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import EngineConfig
from engine.core.memory import MB, weight_footprint
from engine.core.scheduler import SchedulerOutput
from engine.core.sequence import RequestTimes, Sequence
from engine.errors import InvalidParamError
from engine.model.llama import Llama
from engine.model.llama_config import LlamaConfig
from engine.platform import machine
from engine.sampling_params import SamplingParams
from engine.worker.cuda_graphs import DecodeGraphs, bucket_of, capture_sizes, worth_keeping
from engine.worker.gpu_memory import CudaMemoryReading, finish_reading, plan_cuda_kv, profile_widest_step, start_reading
from engine.worker.host_staging import HostStaging
from engine.worker.runner import ModelRunner

pytestmark = pytest.mark.integration

GiB = 1024**3
CFG = LlamaConfig(128, 64, 96, 2, num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e4,
                  max_position=256, tie_word_embeddings=True)  # fmt: skip


def tiny_model(dtype: torch.dtype = torch.float32) -> Llama:
    """Seeded weights of a toy shape: these tests check bookkeeping, not a model's answers."""
    torch.manual_seed(0)
    model = Llama(CFG)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1) if p.dim() > 1 else p.fill_(1.0)
    model.init_rope("cpu")
    return model.to(dtype).eval()


# the device -----------------------------------------------------------------------------------


def test_auto_is_the_cpu_where_torch_sees_no_gpu_and_cuda_where_it_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert machine.resolve_device("auto") == "cpu"
    assert machine.resolve_device("cpu") == "cpu"
    with pytest.raises(InvalidParamError) as err:
        machine.resolve_device("cuda")
    assert err.value.param == "device" and "no CUDA device" in err.value.message
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert machine.resolve_device("auto") == "cuda:0"
    assert machine.resolve_device("cuda") == "cuda:0"
    assert machine.resolve_device("cuda:3") == "cuda:3"  # the index is honoured, not dropped


def test_replicas_take_the_cards_from_the_asked_index_in_whole_replicas() -> None:
    assert [machine.place_on_gpus("cuda", 4, i) for i in range(5)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0"]
    assert [machine.place_on_gpus("cuda:1", 4, i, ranks=2) for i in range(2)] == ["cuda:1", "cuda:1"]
    assert [machine.place_on_gpus("cuda", 8, i, ranks=2) for i in range(4)] == ["cuda:0", "cuda:2", "cuda:4", "cuda:6"]
    assert [machine.place_on_gpus("cuda:2", 4, i) for i in range(3)] == ["cuda:2", "cuda:3", "cuda:2"]
    with pytest.raises(InvalidParamError, match="cuda:3..cuda:4; there are 4 GPUs"):
        machine.place_on_gpus("cuda:3", 4, 0, ranks=2)
    with pytest.raises(InvalidParamError, match="no CUDA device"):
        machine.place_on_gpus("cuda", 0)


def test_the_front_reads_the_gpus_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine.os, "listdir", lambda path: ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert machine.visible_gpus() == 3 and machine.device_kind("auto") == "cuda"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert machine.visible_gpus() == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert machine.visible_gpus() == 0 and machine.device_kind("auto") == "cpu"
    assert machine.device_kind("cuda:1") == "cuda" and machine.device_kind("cpu") == "cpu"


def test_the_config_names_a_bad_device_or_utilisation() -> None:
    assert EngineConfig().device == "auto" and EngineConfig().gpu_memory_utilization == 0.9
    for bad in ("gpu", "cuda:", "cuda:x", "mps"):
        with pytest.raises(InvalidParamError) as err:
            EngineConfig(device=bad)
        assert err.value.param == "device"
    for bad in (0, 1.5, -0.1, True):
        with pytest.raises(InvalidParamError) as err:
            EngineConfig(gpu_memory_utilization=bad)
        assert err.value.param == "gpu_memory_utilization"


# memory ---------------------------------------------------------------------------------------


class FakeCard:
    """A card as torch.cuda reports it: free/total, and torch's allocator's counters."""

    def __init__(self, total: int, others: int) -> None:
        self.total, self.used = total, others
        self.allocated = self.peak = self.reserved = self.peak_reserved = 0

    def take(self, allocated: int, slack: int = 0, outside: int = 0) -> None:
        self.allocated += allocated
        self.peak = max(self.peak, self.allocated)
        self.reserved = self.allocated + slack
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        self.used += allocated + outside

    def mem_get_info(self) -> tuple[int, int]:
        return self.total - self.used - (self.reserved - self.allocated), self.total

    def max_memory_allocated(self) -> int:
        return self.peak

    def max_memory_reserved(self) -> int:
        return self.peak_reserved

    def memory_reserved(self) -> int:
        return self.reserved

    def reset_peak(self) -> None:
        self.peak, self.peak_reserved = self.allocated, self.reserved


def test_the_kv_cache_gets_what_the_utilisation_leaves_after_everything_measured() -> None:
    model = tiny_model()
    weights, _ = weight_footprint(model)
    card = FakeCard(80 * GiB, others=int(0.5 * GiB))  # another process and this one's context
    start = start_reading(card)
    card.take(weights)
    after_weights = card.allocated
    card.take(3 * GiB, slack=256 * MB, outside=700 * MB)  # the profiled step; cuBLAS and NCCL beside torch
    card.take(-3 * GiB)  # the step's tensors freed; the peak stays
    reading = finish_reading(card, start, after_weights)
    assert reading.used_at_start == int(0.5 * GiB) and reading.activations == 3 * GiB
    assert reading.allocator_slack == 256 * MB and reading.outside_torch == 700 * MB
    plan = plan_cuda_kv(EngineConfig(gpu_memory_utilization=0.9), model, 4, reading)
    expected = int(0.9 * 80 * GiB) - int(0.5 * GiB) - 256 * MB - 700 * MB - weights - 3 * GiB
    assert plan.kv_budget_bytes == expected
    assert plan.num_blocks == expected // (CFG.kv_bytes_per_token * 4 * 16)
    # the rule is the card's share, not memory_cap_mb (the CPU's), and kv_budget_mb still wins
    assert plan_cuda_kv(EngineConfig(memory_cap_mb=1), model, 4, reading).kv_budget_bytes == expected
    assert plan_cuda_kv(EngineConfig(kv_budget_mb=64), model, 4, reading).kv_budget_bytes == 64 * MB


def test_a_card_others_fill_is_refused_naming_the_utilisation() -> None:
    model = tiny_model()
    reading = CudaMemoryReading(80 * GiB, used_at_start=75 * GiB, weights=0, peak=GiB, allocator_slack=0,
                                outside_torch=0)  # fmt: skip
    with pytest.raises(InvalidParamError) as err:
        plan_cuda_kv(EngineConfig(gpu_memory_utilization=0.9), model, 4, reading)
    assert err.value.param == "gpu_memory_utilization"
    assert "75.00 GiB were in use before this engine started" in err.value.message
    assert plan_cuda_kv(EngineConfig(gpu_memory_utilization=0.99), model, 4, reading).num_blocks > 0


def test_the_profiled_step_is_the_widest_the_scheduler_may_build(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[SchedulerOutput] = []
    real = ModelRunner.execute

    def spy(self: ModelRunner, batch: SchedulerOutput) -> dict:
        seen.append(batch)
        return real(self, batch)

    monkeypatch.setattr(ModelRunner, "execute", spy)
    config = EngineConfig(max_batched_tokens=100, max_num_seqs=8, block_size=16, device="cpu")
    profile_widest_step(tiny_model(), config, torch.float32, "cpu")
    (batch,) = seen
    assert sum(batch.num_new_tokens) == 100 and len(batch.seqs) == 8  # every row sampled: the logits' peak
    blocks = [b for seq in batch.seqs for b in seq.block_table]
    assert len(blocks) == len(set(blocks))  # each its own blocks of the scratch cache


# CUDA graphs' bookkeeping ----------------------------------------------------------------------


def test_graph_sizes_follow_vllms_ladder_and_a_batch_pads_to_its_bucket() -> None:
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(5) == [1, 2, 4, 5] and capture_sizes(1) == [1] and capture_sizes(12) == [1, 2, 4, 8, 12]
    sizes = capture_sizes(64)
    assert [bucket_of(n, sizes) for n in (1, 3, 5, 9, 64, 65)] == [1, 4, 8, 16, 64, None]
    assert worth_keeping(1.0, 0.5) and not worth_keeping(1.0, 0.97) and not worth_keeping(1.0, 1.2)


def test_a_batch_runs_eager_unless_its_own_bucket_was_kept() -> None:
    graphs = DecodeGraphs(tiny_model(), [], max_num_seqs=16, max_blocks=4, scratch_block=9, block_size=16, device="cpu")
    graphs.captured = {8: object(), 16: object()}  # type: ignore[dict-item] - 1, 2 and 4 measured slower
    assert [graphs.bucket(n) for n in (1, 3, 5, 8, 9, 16, 17)] == [None, None, 8, 8, 16, 16, None]


def test_padding_rows_write_only_the_scratch_block_and_attend_one_token() -> None:
    graphs = DecodeGraphs(tiny_model(), [], max_num_seqs=8, max_blocks=4, scratch_block=9, block_size=16, device="cpu")
    graphs.fill(3, 8, torch.tensor([5, 6, 7]), torch.tensor([10, 20, 30]), torch.tensor([17, 40, 63]),
                torch.tensor([[1, 0], [2, 0], [3, 0]], dtype=torch.int32), torch.tensor([11, 21, 31], dtype=torch.int32))  # fmt: skip
    assert graphs.input_ids.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    assert graphs.slots.tolist() == [17, 40, 63] + [9 * 16] * 5
    assert graphs.lens.tolist() == [11, 21, 31, 1, 1, 1, 1, 1]
    assert graphs.tables[:3, :2].tolist() == [[1, 0], [2, 0], [3, 0]]
    # a later, smaller batch: the rows it leaves pad again, whatever they held
    graphs.fill(1, 2, torch.tensor([8]), torch.tensor([11]), torch.tensor([18]), torch.tensor([[1]], dtype=torch.int32),
                torch.tensor([12], dtype=torch.int32))  # fmt: skip
    assert graphs.slots[:2].tolist() == [18, 9 * 16] and graphs.lens[:2].tolist() == [12, 1]


def test_the_runner_keeps_a_scratch_block_no_sequence_owns() -> None:
    runner = ModelRunner(tiny_model(), 10, 16, torch.float32, "cpu", scratch_block=True)
    assert runner.scratch_block == 10 and runner.kv_caches[0][0].shape[0] == 11
    assert ModelRunner(tiny_model(), 10, 16, torch.float32, "cpu").kv_caches[0][0].shape[0] == 10


# the step's inputs ----------------------------------------------------------------------------


def test_staged_uploads_keep_every_value_dtype_and_shape() -> None:
    staging = HostStaging("cpu", pack=True)  # the CUDA path's packing, on the CPU
    for round_ in range(3):  # the buffers are reused and grown
        arrays = [np.arange(5 + round_ * 3000, dtype=np.int64), np.arange(6, dtype=np.int32).reshape(2, 3),
                  np.array([], dtype=np.int64), np.array([7, 8], dtype=np.int32)]  # fmt: skip
        out = staging.upload(arrays)
        for a, t in zip(arrays, out):
            assert t.dtype == torch.from_numpy(a).dtype and tuple(t.shape) == a.shape
            assert np.array_equal(t.numpy(), a)
    assert set(staging._buffers) == {np.dtype(np.int64), np.dtype(np.int32)}  # one buffer, one copy per dtype


def test_a_step_through_staged_inputs_gives_the_same_tokens() -> None:
    model = tiny_model()
    tokens = []
    for pack in (False, True):
        runner = ModelRunner(model, 16, 16, torch.float32, "cpu")
        runner.staging = HostStaging("cpu", pack=pack)
        batch = SchedulerOutput()
        for i, n in enumerate((1, 20, 5)):
            seq = Sequence(f"r{i}", list(range(3, 3 + n)), SamplingParams(temperature=0), RequestTimes(0.0))
            seq.block_table = [2 * i, 2 * i + 1]
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
        tokens.append(runner.execute(batch))
    assert tokens[0] == tokens[1] and len(tokens[0]) == 3


def test_weights_are_made_in_the_compute_dtype_before_they_reach_the_device(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    from engine.model import loader

    made: list[torch.dtype] = []
    real = Llama.to_empty

    def spy(self: Llama, *, device: str, recurse: bool = True) -> Llama:
        made.extend({p.dtype for p in self.parameters()})
        return real(self, device=device, recurse=recurse)

    monkeypatch.setattr(Llama, "to_empty", spy)
    tensors = {name: p.detach().float() for name, p in _named_tensors(tiny_model()).items()}
    monkeypatch.setattr(loader, "read_gguf", lambda path: (CFG, tensors))
    path = tmp_path / "toy.gguf"  # type: ignore[operator]
    path.write_bytes(b"")
    model = loader.load_model(path, torch.bfloat16, "cpu")
    assert set(made) == {torch.bfloat16}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def _named_tensors(model: Llama) -> dict[str, torch.Tensor]:
    out = {"embed": model.embed, "norm": model.norm}
    for i, layer in enumerate(model.layers):
        q, kv = CFG.num_heads * CFG.head_dim, CFG.num_kv_heads * CFG.head_dim
        gate, up = layer.gate_up.chunk(2)
        out |= {f"layers.{i}.input_norm": layer.input_norm, f"layers.{i}.post_norm": layer.post_norm,
                f"layers.{i}.q": layer.qkv[:q], f"layers.{i}.k": layer.qkv[q : q + kv], f"layers.{i}.v": layer.qkv[q + kv :],
                f"layers.{i}.o": layer.o, f"layers.{i}.gate": gate, f"layers.{i}.up": up, f"layers.{i}.down": layer.down}  # fmt: skip
    return out
