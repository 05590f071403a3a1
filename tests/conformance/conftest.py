"""The ``harness`` fixture: every store of the suite, one parameter (and marker) each.

Module-scoped: a store is opened once per test module and shared by its examples; each
hypothesis example works under rule names and keys of its own (``StoreHarness.tag``),
and the store's keys or schema are removed at the end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.harness import STORES, StoreHarness, open_harness


@pytest.fixture(scope="module", params=STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    def cluster_url() -> str:
        # Engineer A's private three-master cluster (tests/server_fixtures.py), started
        # only when a cluster parameter runs.
        url: str = request.getfixturevalue("redis_cluster_url")
        return url

    opened = open_harness(request.param, cluster_url)
    try:
        yield opened
    finally:
        opened.close()
