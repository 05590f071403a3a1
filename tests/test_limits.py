"""What a ``Limit`` accepts: only counts every store decides
exactly, for every algorithm, and only ASCII digits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ratekeeper import Limit, Rule
from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.config.envoy import UNIT_SECONDS
from ratekeeper.errors import InvalidLimit
from ratekeeper.limit import ACCEPTED_FORMS, MAX_COUNT


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


# The units, the decimal amounts and the README that states them.

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def readme_limits_paragraph() -> str:
    start = README.index("Limits parse from")
    return README[start : README.index("\n\n", start)]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1/week", 604_800),
        ("3 per 2 weeks", 1_209_600),
        ("1/w", 604_800),
        ("1/month", 2_592_000),
        ("2/3months", 7_776_000),
        ("1/year", 31_536_000),
        ("1/y", 31_536_000),
        ("1/10 years", 315_360_000),
    ],
)
def test_the_native_form_takes_the_envoy_forms_long_units(text: str, seconds: int) -> None:
    """A week, a month (30 days) and a year (365 days), as long as the Envoy form's ``unit``s."""
    assert seconds == Limit.parse(text).period


def test_every_envoy_unit_has_the_same_length_in_a_limit() -> None:
    for unit, seconds in UNIT_SECONDS.items():
        assert Limit(7, seconds) == Limit.parse(f"7/{unit}") == Limit.parse(f"7 per 1 {unit}")


@pytest.mark.parametrize(("text", "seconds"), [("10/2.5min", 150), ("4/1.5s", 1.5), ("3/0.5h", 1_800)])
def test_a_decimal_amount_with_a_unit_is_a_limit_as_documented(text: str, seconds: float) -> None:
    assert Limit.parse(text).period == seconds


def test_a_decimal_amount_that_is_no_whole_microsecond_is_refused() -> None:
    with pytest.raises(InvalidLimit, match=r"whole number of microseconds"):
        Limit.parse("1/0.0000001s")


def test_every_form_and_unit_the_readme_names_parses() -> None:
    """The README's sentence on limits and the parser agree: each example parses, each unit
    it lists is accepted, and the accepted forms quoted in errors are ones that parse."""
    paragraph = readme_limits_paragraph()
    examples = re.findall(r'`"([^"`]+)"`', paragraph)
    assert {"10/2.5min", "1/week"} <= set(examples)
    for example in examples:
        Limit.parse(example)
    units = [u for u in re.findall(r"`([a-zµ]+)`", paragraph) if u != "per"]
    assert {"us", "week", "month", "year"} <= set(units)
    for unit in units:
        assert Limit.parse(f"2/{unit}").count == 2
    for example in re.findall(r'"([^"]+)"', ACCEPTED_FORMS):
        Limit.parse(example)


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [("2/minuet", "minute"), ("2/Minuet", "minute"), ("5/3secnds", "seconds"), ("1/weak", "week")],
)
def test_a_misspelt_unit_gets_a_did_you_mean(text: str, suggestion: str) -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit.parse(text)
    unit = text.split("/")[1].lstrip("0123456789")
    assert str(caught.value).startswith(
        f"unknown time unit {unit!r} in {text!r}; did you mean {suggestion!r}? Accepted forms: "
    )


def test_an_unknown_unit_far_from_any_gets_only_the_accepted_forms() -> None:
    with pytest.raises(InvalidLimit) as caught:
        Limit.parse("1/fortnight")
    assert "did you mean" not in str(caught.value)
    assert f"unknown time unit 'fortnight' in '1/fortnight'; accepted forms: {ACCEPTED_FORMS}" == str(caught.value)
