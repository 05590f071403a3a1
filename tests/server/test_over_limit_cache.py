"""``ratekeeper serve --over-limit-cache`` on Redis: a flooding key is refused by the service
itself until its retry time has passed, counted in /metrics, and never admitted more."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .conftest import REDIS_URL, Served


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


def test_a_flooding_key_is_refused_without_store_round_trips(serve: Callable[..., Served], uid: str) -> None:
    rules = f"""
rules:
  - name: {uid}.partner
    key: "{{header.x-partner}}"
    limits: ["2/minute"]
"""
    served = serve(rules=[rules], store=REDIS_URL, args=["--over-limit-cache"])
    body = {"rule": f"{uid}.partner", "key": "abuser"}
    with httpx.Client(base_url=served.url, timeout=5) as client:
        statuses = [client.post("/v1/check", json=body).status_code for _ in range(40)]
        other = client.post("/v1/check", json={**body, "key": "someone-else"}).status_code
    assert [200, 200] + [429] * 38 == statuses  # never more than the limit
    assert 200 == other  # another key still goes to the store and is admitted
    assert 37 == _metric(served.admin_url, "ratekeeper_over_limit_cache_hits_total")
    assert any(e.get("over_limit_cache") is True for e in served.events() if e.get("event") == "start")
