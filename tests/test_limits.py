"""What a ``Limit`` accepts (issue 9, items 4 and 5): only counts every store decides
exactly, for every algorithm, and only ASCII digits."""

from __future__ import annotations

import pytest

from ratekeeper import Limit, Rule
from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.errors import InvalidLimit
from ratekeeper.limit import MAX_COUNT


def test_the_bound_is_two_to_the_fiftieth() -> None:
    assert MAX_COUNT == 2**50


@pytest.mark.parametrize("count", [MAX_COUNT + 1, 2**53, 2**53 + 1, 2**63, 2**64 + 5])
def test_a_count_above_the_bound_is_refused_at_construction_with_the_bound(count: int) -> None:
    for make in (lambda: Limit(count, 1), lambda: Limit.parse(f"{count}/hour"), lambda: Limit(1, 1, burst=count)):
        with pytest.raises(InvalidLimit, match=r"at most 2\*\*50 \(1125899906842624\)"):
            make()


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_no_algorithm_accepts_a_count_above_the_bound(algorithm: str) -> None:
    with pytest.raises(InvalidLimit, match="1125899906842624"):
        Rule("big", [f"{MAX_COUNT + 1}/day"], algorithm)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_log", "sliding_window_counter", "concurrency"])
def test_the_bound_itself_is_accepted(algorithm: str) -> None:
    assert MAX_COUNT == Rule("big", [f"{MAX_COUNT}/day"], algorithm).limits[0].count


@pytest.mark.parametrize(
    "text",
    [
        "\u0663/s",  # ARABIC-INDIC DIGIT THREE
        "3/\u0663s",
        "\uff13/s",  # FULLWIDTH DIGIT THREE
        "\u0663 per second",
        "1\u0660/minute",
        "5/1.\u0665s",
        "\U0001d7d1/s",  # MATHEMATICAL BOLD DIGIT THREE
    ],
)
def test_a_limit_with_a_non_ascii_digit_is_refused(text: str) -> None:
    with pytest.raises(InvalidLimit, match="cannot parse limit"):
        Limit.parse(text)


def test_ascii_limits_and_the_micro_sign_still_parse() -> None:
    assert Limit(3, 1) == Limit.parse("3/s")
    assert Limit(10, 0.000005) == Limit.parse("10/5µs")
    assert Limit(600, 600) == Limit.parse("600 PER 10 Minutes")
