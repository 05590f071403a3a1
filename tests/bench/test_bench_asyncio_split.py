"""``bench redis``'s asyncio split: client and server CPU per decision, and the client-only floors."""

from __future__ import annotations

import math
import secrets

import pytest
import redis as redis_py

from ratekeeper_bench import asyncio_split as split
from ratekeeper_bench.redis import cleanup

pytestmark = pytest.mark.slow  # a benchmark run

URL = "redis://127.0.0.1:6379/0"


@pytest.mark.redis
def test_every_cell_splits_a_decision_between_client_and_server_and_leaves_no_key() -> None:
    prefix = f"rk-split-test-{secrets.token_hex(4)}:"
    scenarios = {"hot_key": ["hot"], "many_keys": [f"k{i}" for i in range(300)]}
    try:
        cells = split.measure_split(URL, prefix, ["gcra", "sliding_window_log"], scenarios, 0.1, 20)
    finally:
        cleanup(URL, prefix)
    assert [(c.algorithm, c.scenario) for c in cells] == [
        ("gcra", "hot_key"),
        ("sliding_window_log", "hot_key"),
        ("gcra", "many_keys"),
        ("sliding_window_log", "many_keys"),
    ]
    for cell in cells:
        assert cell.errors == 0
        assert cell.rate > 0
        assert cell.client_us > 0
        assert cell.server_us > 0  # the script commands were counted
        assert cell.per_call > 1  # 20 tasks on one limiter: coalesced calls carry several decisions
    with redis_py.Redis.from_url(URL) as client:
        assert list(client.scan_iter(match=f"{prefix}*")) == []
    text = "\n".join(split.render_split(cells, [], 20, "the test Redis"))
    assert "| gcra | hot_key |" in text


def test_the_client_only_floors_run_without_a_server() -> None:
    floors = split.measure_floors(0.05, 10)
    assert len(floors) == 2
    for floor in floors:
        assert floor.rate > 0 and math.isfinite(floor.client_us) and floor.client_us > 0
