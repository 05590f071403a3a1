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
    def fixture(name: str) -> str:
        # The private servers of tests/server_fixtures.py (a three-master cluster, a
        # Sentinel set), started only when a parameter that needs them runs.
        url: str = request.getfixturevalue(name)
        return url

    opened = open_harness(request.param, fixture)
    try:
        yield opened
    finally:
        opened.close()
