"""The targets ``ratekeeper bench serve`` judges (issue 20's): ratios of two cases of the same
server, each printed as met or not met. Built from made-up rounds, so no server is needed."""

from __future__ import annotations

from ratekeeper_bench import serve
from ratekeeper_bench.serve_load import Load


def _case(kind: str, rate: float, cpu: float = 1.0) -> serve.CaseResult:
    load = Load(requests=int(rate), seconds=1.0, p50_us=1000.0, p99_us=2000.0, max_us=3000.0)
    return serve.CaseResult(serve.Case(serve.KINDS[kind], "memory"), (serve.Round(load, cpu, 0.5),))


def _result(rates: dict[str, float], cpu: dict[str, float] | None = None) -> serve.ServeBenchResult:
    result = serve.ServeBenchResult(settings=serve.Settings(), pinned=True, machine="test")
    result.results = [_case(kind, rate, (cpu or {}).get(kind, 1.0)) for kind, rate in rates.items()]
    return result


def test_the_targets_are_the_issues_thresholds() -> None:
    targets = {t.what: (t.threshold, t.at_most) for t in _result({}).targets()}
    assert targets == {
        "/v1/check requests/s over GET /healthz requests/s": (0.6, False),
        "a decision in a batch of 100: its cost over a 1-check request's": (0.1, True),
        "gRPC ShouldRateLimit calls/s over gRPC Health/Check calls/s (h2load)": (0.9, False),
        "/v1/check p99 at half the peak rate": (5.0, True),
        "gRPC ShouldRateLimit p99 at half the peak rate": (5.0, True),
    }


def test_each_ratio_is_judged_on_rates_and_on_cpu_time() -> None:
    rates = {"healthz": 10_000.0, "check": 6_000.0, "batch": 500.0, "grpc_health": 4_000.0, "grpc": 3_000.0}
    # The service had half its CPU during /healthz: per CPU-second, /healthz is 20,000/s.
    result = _result(rates, cpu={"healthz": 0.5})
    by_name = {t.what: t for t in result.targets()}
    share = by_name["/v1/check requests/s over GET /healthz requests/s"]
    assert (share.measured, share.per_cpu) == (0.6, 0.3)
    assert (share.met(share.measured), share.met(share.per_cpu)) == (True, False)
    batch = by_name["a decision in a batch of 100: its cost over a 1-check request's"]
    assert batch.measured == 6_000 / (500 * 100)  # 0.12: a decision in a batch costs 0.12 of a request
    assert batch.met(batch.measured) is False
    assert batch.met(0.1) is True
    grpc = by_name["gRPC ShouldRateLimit calls/s over gRPC Health/Check calls/s (h2load)"]
    assert grpc.measured == 0.75
    assert grpc.met(grpc.measured) is False
    paced = by_name["/v1/check p99 at half the peak rate"]
    assert paced.measured is None and paced.met(paced.measured) is None

    text = result.to_markdown()
    assert "| /v1/check requests/s over GET /healthz requests/s | ≥ 0.60x | 0.60x | met | 0.30x | **not met** |" in text
    assert "| a decision in a batch of 100: its cost over a 1-check request's | ≤ 0.10x | 0.12x | **not met** |" in text
    assert "| /v1/check p99 at half the peak rate | < 5.00 ms | n/a | not measured | - | - |" in text


def test_a_target_without_its_cases_is_not_measured() -> None:
    result = _result({"check": 6_000.0})
    assert all(t.measured is None for t in result.targets())
