"""``bench postgres``'s server time per function: each decision's path, function by function."""

from __future__ import annotations

import psycopg
import pytest

from ratekeeper_bench import pg_functions

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # slow: a benchmark run

URL = "postgresql://postgres@127.0.0.1:5432/test"


def test_each_algorithm_reports_the_functions_its_decisions_ran_and_drops_its_schema() -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        before = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rkfn_%'")}
    cells = pg_functions.measure_functions(URL, ["fixed_window", "token_bucket"], 0.1)
    assert [c.algorithm for c in cells] == ["fixed_window", "token_bucket"]
    for cell in cells:
        assert cell.errors == 0 and cell.rate > 0
        names = {f.name for f in cell.functions}
        assert f"rk_{cell.algorithm}" in names  # the algorithm's own function ran once per decision
        algorithm_fn = next(f for f in cell.functions if f.name == f"rk_{cell.algorithm}")
        assert 0.9 <= algorithm_fn.calls_per_decision <= 1.1
        assert algorithm_fn.total_us >= algorithm_fn.self_us > 0
        assert all(f.calls_per_decision >= pg_functions.MIN_SHARE for f in cell.functions)  # no one-off calls
    with psycopg.connect(URL, autocommit=True) as conn:
        after = {r[0] for r in conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'rkfn_%'")}
    assert after <= before  # every schema of the run was dropped
    text = "\n".join(pg_functions.render_functions(cells))
    assert "| fixed_window |" in text and "`rk_fixed_window`" in text
