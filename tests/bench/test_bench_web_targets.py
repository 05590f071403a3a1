"""The targets ``ratekeeper bench web`` judges (issue 20's): each stack's ratios from one run,
each printed as met or not met. Built from made-up rounds, so no server or wrk is needed."""

from __future__ import annotations

from ratekeeper_bench import web
from ratekeeper_bench.web_apps.wrk import WrkResult


def _case(case: web.Case, rate: float, cpu: float = 1.0) -> web.CaseResult:
    wrk = WrkResult(int(rate), 1.0, 0, 0, p50_us=1000.0, p90_us=1500.0, p99_us=2000.0, mean_us=1100.0, max_us=3000.0)
    return web.CaseResult(case, (200, 200, 200), (web.Round(wrk, cpu, 0.5),))


def _result(rates: dict[web.Case, float]) -> web.WebBenchResult:
    result = web.WebBenchResult(settings=web.Settings(), pinned=True, machine="test")
    result.results = [_case(case, rate) for case, rate in rates.items()]
    return result


def test_the_targets_are_the_issues_thresholds() -> None:
    targets = {t.what: t.threshold for t in _result({}).targets()}
    assert targets == {
        "starlette: ratekeeper memory / bare": 0.65,
        "starlette: ratekeeper redis / bare": 0.6,
        "starlette: ratekeeper memory / slowapi": 1.3,
        "starlette: ratekeeper memory / slowapi, both denied": 1.3,
        "flask: ratekeeper memory / flask-limiter": 1.4,
        "flask: ratekeeper memory / flask-limiter, both denied": 1.4,
        "django: ratekeeper memory / django-ratelimit": 1.2,
        "django: ratekeeper memory / django-ratelimit, both denied": 1.2,
    }


def test_a_ratio_at_the_threshold_is_met_and_one_below_is_not() -> None:
    rates = {
        web.Case("starlette", "bare"): 1000.0,
        web.Case("starlette", "ratekeeper", "memory"): 650.0,
        web.Case("starlette", "ratekeeper", "redis"): 590.0,
        web.Case("starlette", "slowapi"): 500.0,
    }
    result = _result(rates)
    by_name = {t.what: t for t in result.targets()}
    memory = by_name["starlette: ratekeeper memory / bare"]
    assert memory.ratio == 0.65
    assert memory.met(memory.ratio) is True
    redis = by_name["starlette: ratekeeper redis / bare"]
    assert redis.met(redis.ratio) is False
    peer = by_name["starlette: ratekeeper memory / slowapi"]
    assert peer.ratio == 1.3
    assert peer.met(peer.ratio) is True
    denied = by_name["starlette: ratekeeper memory / slowapi, both denied"]
    assert denied.ratio is None
    assert denied.met(denied.ratio) is None

    text = result.to_markdown()
    assert "| starlette: ratekeeper memory / bare | ≥ 0.65 | 0.65 | met | 0.65 | met |" in text
    assert "| starlette: ratekeeper redis / bare | ≥ 0.60 | 0.59 | **not met** | 0.59 | **not met** |" in text
    assert "| starlette: ratekeeper memory / slowapi, both denied | ≥ 1.30 | n/a | not measured |" in text
