"""``header_names``: the rate-limit fields sent under other names, or left out one by one;
a mapping that cannot be sent as asked is refused with a message that says what would be
right (``ratekeeper.web.headers.header_names``)."""

from __future__ import annotations

from typing import Any

import pytest

from ratekeeper import Limiter, Rule
from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.testing import FakeClock
from ratekeeper.web.headers import (
    DEFAULT_NAMES,
    MAX_NAME_LENGTH,
    HeaderNames,
    HeaderOptions,
    header_names,
    rate_limit_headers,
    ratelimit_fields,
    x_ratelimit_fields,
)

DASHED = {
    "X-RateLimit-Limit": "X-Rate-Limit-Limit",
    "X-RateLimit-Remaining": "X-Rate-Limit-Remaining",
    "X-RateLimit-Reset": "X-Rate-Limit-Reset",
}
DEFAULT_FIELDS = {"ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}


def enforced(limits: list[str], calls: int) -> list[tuple[Rule, Decision]]:
    """The last of ``calls`` decisions of one rule, as the core hands them to the headers."""
    limiter = Limiter("memory://", clock=FakeClock())
    rule = Rule("items", limits, "sliding_window_log")
    decision = None
    for _ in range(calls):
        decision = limiter.try_acquire(rule, "k")
    assert decision is not None
    return [(rule, decision)]


def sent(pairs: list[tuple[Rule, Decision]], names: Any, *, allowed: bool = True, **options: Any) -> dict[str, str]:
    headers = rate_limit_headers(pairs, allowed=allowed, options=HeaderOptions(names=header_names(names), **options))
    as_dict = dict(headers)
    assert len(as_dict) == len(headers), f"a field sent twice: {headers}"
    return as_dict


# -- what is sent -----------------------------------------------------------------------------


@pytest.mark.parametrize("limits", [["5/minute"], ["20/minute", "5/3s"]], ids=["one limit", "two limits"])
def test_renamed_fields_carry_the_default_fields_values_and_the_defaults_are_not_sent(limits: list[str]) -> None:
    pairs = enforced(limits, 2)
    default = sent(pairs, None)
    renamed = sent(pairs, {**DASHED, "RateLimit": "Acme-RateLimit", "RateLimit-Policy": "Acme-RateLimit-Policy"})
    assert renamed == {
        "Acme-RateLimit-Policy": default["RateLimit-Policy"],
        "Acme-RateLimit": default["RateLimit"],
        "X-Rate-Limit-Limit": default["X-RateLimit-Limit"],
        "X-Rate-Limit-Remaining": default["X-RateLimit-Remaining"],
        "X-Rate-Limit-Reset": default["X-RateLimit-Reset"],
    }


def test_a_refusal_keeps_retry_after_under_its_own_name() -> None:
    pairs = enforced(["2/minute"], 3)
    assert not pairs[0][1].allowed
    headers = sent(pairs, DASHED, allowed=False)
    assert int(headers["Retry-After"]) > 0
    assert headers["X-Rate-Limit-Remaining"] == "0"
    assert not {name.lower() for name in headers} & {"x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}


def test_keys_are_matched_without_case_and_values_are_sent_as_written() -> None:
    names = header_names({"x-ratelimit-remaining": "x-left", "RATELIMIT": "Quota"})
    assert names == DEFAULT_NAMES._replace(remaining="x-left", ratelimit="Quota")
    assert set(sent(enforced(["5/minute"], 1), {"x-ratelimit-remaining": "x-left"})) == {
        "RateLimit-Policy",
        "RateLimit",
        "X-RateLimit-Limit",
        "x-left",
        "X-RateLimit-Reset",
    }


@pytest.mark.parametrize("limits", [["5/minute"], ["20/minute", "5/3s"]], ids=["one limit", "two limits"])
def test_a_field_mapped_to_none_is_left_out_and_the_others_stay(limits: list[str]) -> None:
    pairs = enforced(limits, 1)
    headers = sent(pairs, {"RateLimit-Policy": None, "X-RateLimit-Reset": None})
    assert set(headers) == {"RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining"}
    everything_off = dict.fromkeys(["RateLimit-Policy", "RateLimit", *DASHED], None)
    assert sent(pairs, everything_off) == {}
    assert set(sent(pairs, everything_off, allowed=False)) == {"Retry-After"}


def test_family_switches_still_apply_to_renamed_fields() -> None:
    pairs = enforced(["5/minute"], 1)
    assert set(sent(pairs, DASHED, x_ratelimit=False)) == {"RateLimit-Policy", "RateLimit"}
    assert set(sent(pairs, DASHED, ratelimit=False)) == set(DASHED.values())


def test_epoch_reset_under_a_new_name() -> None:
    pairs = enforced(["5/minute"], 1)
    headers = rate_limit_headers(
        pairs,
        allowed=True,
        options=HeaderOptions(reset="epoch", names=header_names(DASHED)),
        now=lambda: 1_000_000.2,
    )
    assert dict(headers)["X-Rate-Limit-Reset"] == str(1_000_001 + 60)


def test_no_mapping_and_an_empty_one_are_the_defaults() -> None:
    assert header_names(None) is DEFAULT_NAMES
    assert header_names({}) == DEFAULT_NAMES
    assert {name.lower() for name in sent(enforced(["5/minute"], 1), {})} == DEFAULT_FIELDS


# -- what is refused ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "says"),
    [
        ({"X-RateLimit-Remainig": "x"}, "not a field ratekeeper sends (did you mean 'X-RateLimit-Remaining'?)"),
        ({"X-Rate-Limit": "x"}, "the fields that can be renamed are RateLimit-Policy, RateLimit, X-RateLimit-Limit"),
        ({"Retry-After": "X-Retry-In"}, "cannot rename or leave out Retry-After"),
        ({"retry-after": None}, "RFC 9110 §10.2.3"),
        ({"X-RateLimit-Limit": "X RateLimit Limit"}, "is not an HTTP field name"),
        ({"X-RateLimit-Limit": "X-Limit:"}, "is not an HTTP field name"),
        ({"X-RateLimit-Limit": ""}, "is not an HTTP field name"),
        ({"X-RateLimit-Limit": "X-Limit\r\nSet-Cookie: a=b"}, "is not an HTTP field name"),
        ({"X-RateLimit-Limit": "Limité"}, "is not an HTTP field name"),
        ({"X-RateLimit-Limit": "x" * (MAX_NAME_LENGTH + 1)}, f"1 to {MAX_NAME_LENGTH}"),
        ({"X-RateLimit-Limit": b"X-Limit"}, "give a str (the name to send it under) or None"),
        ({"X-RateLimit-Limit": 7}, "give a str"),
        ({1: "X-Limit"}, "a key is a field's default name"),
        ({"X-RateLimit-Limit": "X-Limit", "X-RateLimit-Remaining": "x-limit"}, "both be sent as 'x-limit'"),
        ({"X-RateLimit-Limit": "ratelimit"}, "RateLimit and X-RateLimit-Limit would both be sent as 'ratelimit'"),
        ({"RateLimit": "X-RateLimit-Reset"}, "RateLimit and X-RateLimit-Reset would both be sent"),
        ({"X-RateLimit-Limit": "A", "x-ratelimit-limit": "B"}, "renames X-RateLimit-Limit twice"),
        ({"X-RateLimit-Reset": "Retry-After"}, "HTTP already gives that field a meaning"),
        ({"X-RateLimit-Limit": "content-length"}, "choose a name of your own, e.g. 'X-Rate-Limit-Limit'"),
        ([("X-RateLimit-Limit", "X-Limit")], "header_names must be a mapping"),
        ("X-Rate-Limit-*", "got a str"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None,
)  # fmt: skip
def test_a_mapping_that_cannot_be_sent_is_refused_saying_what_would_be_right(names: Any, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        header_names(names)
    assert says in str(caught.value)


def test_two_fields_may_swap_names() -> None:
    """A clash is judged on the names sent, not on the defaults the mapping names."""
    swapped = {"X-RateLimit-Limit": "X-RateLimit-Remaining", "X-RateLimit-Remaining": "X-RateLimit-Limit"}
    headers = sent(enforced(["5/minute"], 2), swapped)
    assert headers["X-RateLimit-Remaining"] == "5"
    assert headers["X-RateLimit-Limit"] == "3"


def test_names_built_in_code_are_checked_as_well() -> None:
    with pytest.raises(ConfigurationError, match="would both be sent as 'Same'"):
        HeaderOptions(names=HeaderNames(limit="Same", remaining="Same"))
    with pytest.raises(ConfigurationError, match="not an HTTP field name"):
        HeaderOptions(names=DEFAULT_NAMES._replace(reset="bad name"))


def test_the_field_functions_take_the_names_too() -> None:
    """``ratelimit_fields`` and ``x_ratelimit_fields``, as the service's callers use them."""
    decision = enforced(["20/minute", "5/3s"], 1)[0][1]
    names = header_names({"RateLimit-Policy": None, "RateLimit": "Quota", "X-RateLimit-Reset": None})
    assert [name for name, _ in ratelimit_fields([decision], names)] == ["Quota"]
    assert [name for name, _ in x_ratelimit_fields([decision], names=names)] == [
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
    ]
    assert [name for name, _ in ratelimit_fields([decision])] == ["RateLimit-Policy", "RateLimit"]
