"""Which keys every store accepts, and that no two (rule, key) pairs ever share state.

Through the public API (``Limiter`` / ``AsyncLimiter`` over each store of the suite):
every valid Unicode string is a key, stored faithfully (NUL, braces, ``%`` and the
escapes themselves included: ``stores.wire.escape``); a string UTF-8 cannot encode (a
lone surrogate) is refused at the call with ``InvalidRequest`` by every method, the same
on every store. Issue 9, items 1 and 2.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from conformance.harness import StoreHarness
from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.errors import ConfigurationError, InvalidRequest

# Keys that an unescaped storage key, or PostgreSQL's text (which cannot hold NUL), would
# make share state, and keys that would leave a Redis Cluster hash tag empty.
TRICKY_KEYS = [
    "bob",
    "bob\x00 1",
    "bob\x00 2",
    "bob\x00",
    "\x00",
    "a}b",
    "a%7Db",
    "a%257Db",
    "a%b",
    "a%00b",
    "a\x00b",
    "}",
    "}x",
    "{",
    "{x}",
    "x}:y",
    "é",
    "日本",
    "🙂",
    "\U0010ffff",
    "\ufffd",
]


class Calls:
    """A limiter's methods, called the same way on a blocking or an asyncio store."""

    def __init__(self, harness: StoreHarness) -> None:
        self.harness = harness
        self.limiter: Any = (AsyncLimiter if harness.runner is not None else Limiter)(harness.store, on_error="raise")

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.limiter, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if inspect.iscoroutine(result):
                assert self.harness.runner is not None
                return self.harness.runner.run(result)
            return result

        return call


@pytest.mark.parametrize("algorithm", ["fixed_window", "gcra", "sliding_window_counter", "concurrency"])
def test_every_tricky_key_has_state_of_its_own(harness: StoreHarness, algorithm: str) -> None:
    tag = harness.tag()
    calls = Calls(harness)
    rule = Rule(f"{tag}.keys.{algorithm}", ["1/hour"], algorithm)
    for key in TRICKY_KEYS:
        assert calls.try_acquire(rule, key).allowed, f"{key!r} found state it does not own"
    for key in TRICKY_KEYS:
        assert not calls.peek(rule, key).allowed, f"{key!r} lost its state"


def test_rules_whose_names_and_keys_differ_never_share_state(harness: StoreHarness) -> None:
    tag = harness.tag()
    calls = Calls(harness)
    # (rule name, key) pairs whose parts, joined without escaping, would read alike
    pairs = [
        (f"{tag}.r", "k}:x"),
        (f"x}}:{tag}.r", "k"),
        (f"{tag}.r\x00", "k"),
        (f"{tag}.r\x00a", "k"),
        (f"{tag}.r\x00b", "k"),
        (f"{tag}.r:x", "k"),
        (f"{tag}.r}}", "k"),
        (f"{tag}.r%7D", "k"),
        (f"{tag}.r", "k"),
    ]
    for algorithm in ("fixed_window", "token_bucket"):  # a second algorithm under the same names
        rules = [(Rule(f"{name}", ["1/hour"], algorithm), key) for name, key in pairs]
        for rule, key in rules:
            assert calls.try_acquire(rule, key).allowed, f"{rule.name!r} / {key!r} found state it does not own"
        for rule, key in rules:
            assert not calls.peek(rule, key).allowed


def test_a_batch_of_keys_with_nul_is_decided_and_raises_nothing(harness: StoreHarness) -> None:
    tag = harness.tag()
    calls = Calls(harness)
    fixed = Rule(f"{tag}.batch.fixed", ["1/hour"], "fixed_window")
    gcra = Rule(f"{tag}.batch.gcra", ["1/hour"], "gcra")
    batch = [(fixed, "bob\x00 1"), (gcra, "bob\x00 1"), (fixed, "bob\x00 2"), (gcra, "bob\x00 2")]
    assert calls.try_acquire_many(batch).allowed
    assert not calls.try_acquire_many([(fixed, "bob\x00 3"), (gcra, "bob\x00 1")]).allowed
    assert calls.try_acquire(fixed, "bob\x00 3").allowed  # the refused batch charged nothing


LONE_SURROGATES = ["\ud800", "a\udfffb", "\udcff" * 3]


def test_a_key_utf8_cannot_encode_is_refused_at_the_call_by_every_method(harness: StoreHarness) -> None:
    tag = harness.tag()
    calls = Calls(harness)
    rule = Rule(f"{tag}.surrogate", ["5/hour"], "fixed_window")
    leases = Rule(f"{tag}.surrogate.leases", ["5/hour"], "concurrency")
    good = f"{tag}.good"
    for key in LONE_SURROGATES:
        attempts: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
            ("try_acquire", (rule, key), {}),
            ("peek", (rule, key), {}),
            ("acquire", (rule, key), {"timeout": 0}),
            ("refund", (rule, key), {}),
            ("reset", (rule, key), {}),
            ("try_acquire_many", ([(rule, good), (rule, key)],), {}),
            ("release", (leases, key, "some-lease"), {}),
        ]
        for method, args, kwargs in attempts:
            with pytest.raises(InvalidRequest, match="lone surrogate"):
                getattr(calls, method)(*args, **kwargs)
    assert 5 == calls.peek(rule, good, 0).remaining  # the refused batch reached no store
    with pytest.raises(ConfigurationError, match="lone surrogate"):
        Rule("\ud800", ["1/s"])
