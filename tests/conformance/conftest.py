"""The ``harness`` fixture: every store of the suite, one parameter (and marker) each.

Module-scoped: a store is opened once per test module and shared by its examples; each
hypothesis example works under rule names and keys of its own (``StoreHarness.tag``),
and the store's keys or schema are removed at the end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from conformance.harness import STORES, StoreHarness, harness_of


@pytest.fixture(scope="module", params=STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[StoreHarness]:
    yield from harness_of(request)
