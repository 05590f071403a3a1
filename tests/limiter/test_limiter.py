"""The public sync API on the memory store: try_acquire, peek, refund, reset, batches,
leases and the decorator, with bad input refused at the call.

Time only moves through ``FakeClock``: no test sleeps.
"""

from __future__ import annotations

import asyncio
import math
from enum import StrEnum

import pytest

from ratekeeper import (
    ALGORITHMS,
    MAX_KEY_LENGTH,
    AsyncLimiter,
    BatchDecision,
    ConfigurationError,
    InvalidLimit,
    InvalidRequest,
    LeaseError,
    Limit,
    Limiter,
    RateLimitExceeded,
    Rule,
)
from ratekeeper.testing import FakeClock

COUNTING = [name for name in ALGORITHMS if name != "concurrency"]
"""Every algorithm driven by (now, cost) alone; concurrency also hands out leases."""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> Limiter:
    return Limiter(clock=clock)


def issue_rule() -> Rule:
    return Rule("auth.create_token", ["20/minute", "5/3s"], algorithm="sliding_window_log")


# --------------------------------------------------------------------------- the issue's example


def test_issue_example_admits_five_calls_then_the_5_per_3s_limit_refuses_the_sixth(
    limiter: Limiter, clock: FakeClock
) -> None:
    rule = issue_rule()
    first_five = [limiter.try_acquire(rule, "user-42") for _ in range(5)]
    assert [True] * 5 == [d.allowed for d in first_five]
    assert [4, 3, 2, 1, 0] == [d.remaining for d in first_five]
    assert [None] * 5 == [d.denied_by for d in first_five]

    sixth = limiter.try_acquire(rule, "user-42")
    assert False is sixth.allowed
    assert False is bool(sixth)
    assert Limit.parse("5/3s") == sixth.denied_by
    assert 3.0 == sixth.retry_after
    assert 15 == sixth.limits[0].remaining
    assert Limit.parse("20/minute") == sixth.limits[0].limit
    assert [False, True] == [s.denied for s in sixth.limits]
    assert 0 == sixth.limits[1].remaining


def test_issue_example_admits_again_once_the_3s_window_has_slid(limiter: Limiter, clock: FakeClock) -> None:
    rule = issue_rule()
    for _ in range(5):
        limiter.try_acquire(rule, "user-42")
    assert False is limiter.try_acquire(rule, "user-42").allowed

    clock.advance(3)
    after = limiter.try_acquire(rule, "user-42")
    assert True is after.allowed
    assert 14 == after.limits[0].remaining  # the 20/minute limit still counts the first five
    assert 4 == after.limits[1].remaining


def test_issue_example_refusal_is_just_below_3s_and_admission_exactly_at_3s(limiter: Limiter, clock: FakeClock) -> None:
    rule = issue_rule()
    for _ in range(5):
        limiter.try_acquire(rule, "user-42")
    clock.advance(3, us=-1)
    almost = limiter.try_acquire(rule, "user-42")
    assert (False, 1e-6) == (almost.allowed, almost.retry_after)
    clock.advance(us=1)
    assert True is limiter.try_acquire(rule, "user-42").allowed


def test_partner_rule_1_per_3s_admits_one_of_ten_calls_and_refuses_nine_without_raising(limiter: Limiter) -> None:
    rule = Rule("partner", "1/3s")
    decisions = [limiter.try_acquire(rule, "partner-7") for _ in range(10)]
    assert 1 == sum(d.allowed for d in decisions)
    assert True is decisions[0].allowed
    denied = [d for d in decisions if not d]
    assert 9 == len(denied)
    assert all(d.retry_after > 0 for d in denied)
    assert [3.0] * 9 == [d.retry_after for d in denied]
    assert [Limit(1, 3)] * 9 == [d.denied_by for d in denied]


# --------------------------------------------------------------------------- try_acquire / peek / refund / reset


@pytest.mark.parametrize("algorithm", COUNTING)
def test_allowed_decision_is_truthy_with_no_retry_and_no_denying_limit(limiter: Limiter, algorithm: str) -> None:
    decision = limiter.try_acquire(Rule("r", "3/10s", algorithm), "k")
    assert (True, True, 0.0, None, 2) == (
        bool(decision),
        decision.allowed,
        decision.retry_after,
        decision.denied_by,
        decision.remaining,
    )


@pytest.mark.parametrize("algorithm", COUNTING)
def test_peek_answers_what_try_acquire_would_without_charging(limiter: Limiter, algorithm: str) -> None:
    rule = Rule("r", "3/10s", algorithm)
    limiter.try_acquire(rule, "k")
    for _ in range(5):
        limiter.peek(rule, "k")
    assert limiter.peek(rule, "k") == limiter.try_acquire(rule, "k")
    assert limiter.peek(rule, "k", 2) == limiter.try_acquire(rule, "k", 2)  # 2 + 2 > 3: refused
    assert (False, 1) == (limiter.peek(rule, "k", 2).allowed, limiter.peek(rule, "k", 0).remaining)


@pytest.mark.parametrize("algorithm", COUNTING)
def test_peek_with_cost_zero_reports_what_is_left(limiter: Limiter, algorithm: str) -> None:
    rule = Rule("r", "3/10s", algorithm)
    assert 3 == limiter.peek(rule, "k", 0).remaining
    limiter.try_acquire(rule, "k", 2)
    assert 1 == limiter.peek(rule, "k", 0).remaining


def test_peek_stores_nothing(limiter: Limiter) -> None:
    rule = Rule("r", "3/10s", "fixed_window")
    for i in range(50):
        limiter.peek(rule, f"k{i}")
    assert 0 == limiter.store.key_count()  # type: ignore[attr-defined]


@pytest.mark.parametrize("algorithm", COUNTING)
def test_refund_gives_back_what_was_charged(limiter: Limiter, algorithm: str) -> None:
    rule = Rule("r", "3/10s", algorithm)
    assert [True, True, True, False] == [limiter.try_acquire(rule, "k").allowed for _ in range(4)]
    limiter.refund(rule, "k", 2)
    assert [True, True, False] == [limiter.try_acquire(rule, "k").allowed for _ in range(3)]


@pytest.mark.parametrize("algorithm", COUNTING)
def test_refund_never_gives_back_more_than_the_limit(limiter: Limiter, algorithm: str) -> None:
    rule = Rule("r", "3/10s", algorithm)
    limiter.try_acquire(rule, "k")
    limiter.refund(rule, "k", 10)
    assert [True, True, True, False] == [limiter.try_acquire(rule, "k").allowed for _ in range(4)]


def test_refund_of_a_key_never_charged_is_harmless(limiter: Limiter) -> None:
    rule = Rule("r", "3/10s", "gcra")
    limiter.refund(rule, "never-seen", 1)
    assert 3 == limiter.peek(rule, "never-seen", 0).remaining


def test_refund_on_a_concurrency_rule_needs_the_lease_id(limiter: Limiter) -> None:
    rule = Rule("c", "2/30s", "concurrency")
    limiter.try_acquire(rule, "k")
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.refund(rule, "k", 1)
    assert "release(rule, key, lease_id)" in str(excinfo.value)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reset_forgets_everything_charged_to_the_key(limiter: Limiter, algorithm: str) -> None:
    rule = Rule("r", "3/10s", algorithm)
    fresh = limiter.peek(rule, "k", 0)
    for _ in range(3):
        limiter.try_acquire(rule, "k")
    assert False is limiter.try_acquire(rule, "k").allowed
    limiter.reset(rule, "k")
    assert fresh == limiter.peek(rule, "k", 0)
    assert [True, True, True, False] == [limiter.try_acquire(rule, "k").allowed for _ in range(4)]


def test_reset_of_one_key_leaves_other_keys_alone(limiter: Limiter) -> None:
    rule = Rule("r", "1/10s", "gcra")
    limiter.try_acquire(rule, "a")
    limiter.try_acquire(rule, "b")
    limiter.reset(rule, "a")
    assert (True, False) == (limiter.try_acquire(rule, "a").allowed, limiter.try_acquire(rule, "b").allowed)


def test_keys_and_rules_are_counted_apart(limiter: Limiter) -> None:
    one = Rule("one", "1/10s", "fixed_window")
    two = Rule("two", "1/10s", "fixed_window")
    assert [True, True, True, False] == [
        limiter.try_acquire(one, "a").allowed,
        limiter.try_acquire(one, "b").allowed,
        limiter.try_acquire(two, "a").allowed,
        limiter.try_acquire(one, "a").allowed,
    ]


def test_a_refused_request_charges_nothing(limiter: Limiter, clock: FakeClock) -> None:
    """Denials are not recorded: a flood of refused calls does not push the next admission back."""
    rule = Rule("r", "2/10s", "sliding_window_log")
    limiter.try_acquire(rule, "k", 2)
    for _ in range(100):
        clock.advance(0.05)
        limiter.try_acquire(rule, "k")
    clock.advance(5)  # 10 s after the admitted request
    assert True is limiter.try_acquire(rule, "k", 2).allowed


# --------------------------------------------------------------------------- cost beyond capacity


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_cost_larger_than_capacity_is_a_denial_with_infinite_retry_not_an_error(
    limiter: Limiter, algorithm: str
) -> None:
    rule = Rule("r", "5/s", algorithm)
    decision = limiter.try_acquire(rule, "k", 6)
    assert (False, math.inf, Limit(5, 1)) == (decision.allowed, decision.retry_after, decision.denied_by)
    assert 5 == limiter.peek(rule, "k", 0).remaining  # nothing charged


def test_cost_beyond_the_smaller_limit_names_that_limit_with_infinite_retry(limiter: Limiter) -> None:
    decision = limiter.try_acquire(issue_rule(), "k", 6)
    assert (False, math.inf, Limit.parse("5/3s")) == (decision.allowed, decision.retry_after, decision.denied_by)


def test_cost_equal_to_capacity_is_admitted(limiter: Limiter) -> None:
    assert True is limiter.try_acquire(Rule("r", "5/s", "token_bucket"), "k", 5).allowed


def test_cost_within_burst_but_beyond_count_is_admitted(limiter: Limiter) -> None:
    rule = Rule("r", "5/s", "gcra", burst=10)
    decision = limiter.try_acquire(rule, "k", 8)
    assert (True, 2) == (decision.allowed, decision.remaining)
    assert math.inf == limiter.try_acquire(rule, "k", 11).retry_after


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("cost", "fragment"),
    [
        (-1, "got -1"),
        (1.5, "got float 1.5"),
        (True, "got bool True"),
        ("1", "got str '1'"),
        (None, "got NoneType None"),
    ],
)
@pytest.mark.parametrize("method", ["try_acquire", "peek", "acquire", "refund"])
def test_bad_cost_is_refused_at_the_call_with_a_message_naming_it(
    limiter: Limiter, method: str, cost: object, fragment: str
) -> None:
    rule = Rule("r", "5/s")
    with pytest.raises(InvalidRequest) as excinfo:
        getattr(limiter, method)(rule, "k", cost)
    message = str(excinfo.value)
    assert "cost must be a non-negative integer" in message
    assert fragment in message
    assert 5 == limiter.peek(rule, "k", 0).remaining  # nothing charged


@pytest.mark.parametrize("method", ["try_acquire", "peek", "acquire", "refund", "reset"])
def test_empty_key_is_refused(limiter: Limiter, method: str) -> None:
    args = () if method == "reset" else (1,)
    with pytest.raises(InvalidRequest) as excinfo:
        getattr(limiter, method)(Rule("r", "5/s"), "", *args)
    assert "key must not be empty" in str(excinfo.value)


def test_key_longer_than_max_key_length_is_refused_and_the_maximum_is_accepted(limiter: Limiter) -> None:
    rule = Rule("r", "5/s")
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.try_acquire(rule, "x" * (MAX_KEY_LENGTH + 1))
    message = str(excinfo.value)
    assert f"key is {MAX_KEY_LENGTH + 1} characters long" in message
    assert f"the maximum is {MAX_KEY_LENGTH}" in message
    assert True is limiter.try_acquire(rule, "x" * MAX_KEY_LENGTH).allowed


@pytest.mark.parametrize(("key", "fragment"), [(42, "got int 42"), (None, "got NoneType None"), (b"k", "got bytes")])
def test_non_str_key_is_refused(limiter: Limiter, key: object, fragment: str) -> None:
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.try_acquire(Rule("r", "5/s"), key)  # type: ignore[arg-type]
    assert "key must be a str" in str(excinfo.value)
    assert fragment in str(excinfo.value)


def test_something_else_than_a_rule_is_refused(limiter: Limiter) -> None:
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.try_acquire("5/s", "k")  # type: ignore[arg-type]
    assert "expected a Rule, got str" in str(excinfo.value)


def test_unknown_algorithm_is_a_configuration_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        Rule("r", "5/s", algorithm="leaky_window")
    message = str(excinfo.value)
    assert "unknown algorithm 'leaky_window'" in message
    assert all(name in message for name in ALGORITHMS)


@pytest.mark.parametrize("limits", [[], ()])
def test_rule_without_limits_is_a_configuration_error(limits: list[str]) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        Rule("empty", limits)
    assert "rule 'empty' has no limits" in str(excinfo.value)


MALFORMED_LIMITS = [
    ("20", "cannot parse limit '20'"),
    ("a/b", "cannot parse limit 'a/b'"),
    ("5/3parsecs", "unknown time unit 'parsecs'"),
    ("0/s", "count of limit '0/s' must be at least 1"),
    ("5/0s", "period in '5/0s' must be a positive"),
]


@pytest.mark.parametrize(("text", "fragment"), MALFORMED_LIMITS)
def test_malformed_limit_string_raises_invalid_limit_naming_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(InvalidLimit) as excinfo:
        Limit.parse(text)
    assert fragment in str(excinfo.value)


@pytest.mark.parametrize(("text", "fragment"), MALFORMED_LIMITS)
def test_rule_with_a_malformed_limit_raises_invalid_limit_naming_the_problem(text: str, fragment: str) -> None:
    with pytest.raises(InvalidLimit) as excinfo:
        Rule("r", ["20/minute", text])
    assert fragment in str(excinfo.value)


def test_configuration_and_request_errors_are_also_value_errors() -> None:
    assert issubclass(InvalidLimit, ConfigurationError)
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(InvalidRequest, ValueError)


# --------------------------------------------------------------------------- try_acquire_many


def test_try_acquire_many_charges_every_item_when_all_admit(limiter: Limiter) -> None:
    per_user = Rule("per_user", "2/10s", "fixed_window")
    per_ip = Rule("per_ip", "3/10s", "gcra")
    batch = limiter.try_acquire_many([(per_user, "u-42"), (per_ip, "10.0.0.7", 2)])
    assert isinstance(batch, BatchDecision)
    assert (True, True, 2, 0.0, ()) == (bool(batch), batch.allowed, len(batch), batch.retry_after, batch.denied)
    assert [1, 1] == [d.remaining for d in batch]
    assert (1, 1) == (limiter.peek(per_user, "u-42", 0).remaining, limiter.peek(per_ip, "10.0.0.7", 0).remaining)


def test_try_acquire_many_charges_nothing_when_one_rule_refuses(limiter: Limiter) -> None:
    per_user = Rule("per_user", "5/10s", "sliding_window_log")
    per_ip = Rule("per_ip", "5/10s", "token_bucket")
    global_ = Rule("global", "1/10s", "gcra")
    limiter.try_acquire(global_, "*")
    before = (limiter.peek(per_user, "u-42", 0), limiter.peek(per_ip, "10.0.0.7", 0), limiter.peek(global_, "*", 0))

    batch = limiter.try_acquire_many([(per_user, "u-42"), (per_ip, "10.0.0.7"), (global_, "*")])

    assert (False, False) == (bool(batch), batch.allowed)
    assert [True, True, False] == [d.allowed for d in batch]
    assert (batch[2],) == batch.denied
    assert 10.0 == batch.retry_after
    after = (limiter.peek(per_user, "u-42", 0), limiter.peek(per_ip, "10.0.0.7", 0), limiter.peek(global_, "*", 0))
    assert before == after
    assert (5, 5) == (after[0].remaining, after[1].remaining)


def test_try_acquire_many_adds_up_items_on_the_same_key(limiter: Limiter) -> None:
    rule = Rule("r", "5/10s", "fixed_window")
    batch = limiter.try_acquire_many([(rule, "k", 3), (rule, "k", 3)])
    assert [True, False] == [d.allowed for d in batch]
    assert 5 == limiter.peek(rule, "k", 0).remaining


def test_try_acquire_many_refuses_bad_items(limiter: Limiter) -> None:
    rule = Rule("r", "5/s")
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.try_acquire_many([])
    assert "at least one (rule, key) item" in str(excinfo.value)
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.try_acquire_many([(rule,)])
    assert "each item must be (rule, key) or (rule, key, cost)" in str(excinfo.value)
    with pytest.raises(InvalidRequest) as excinfo:
        limiter.try_acquire_many([(rule, "k"), (rule, "j", -2)])
    assert "cost must be a non-negative integer" in str(excinfo.value)
    assert 5 == limiter.peek(rule, "k", 0).remaining


def test_batch_decision_is_truthy_only_when_every_decision_is() -> None:
    limiter = Limiter(clock=FakeClock())
    allowed = limiter.try_acquire(Rule("a", "1/s"), "k")
    denied = limiter.try_acquire(Rule("a", "1/s"), "k")
    assert [True, False, False, True] == [
        bool(BatchDecision((allowed, allowed))),
        bool(BatchDecision((allowed, denied))),
        bool(BatchDecision((denied,))),
        bool(BatchDecision(())),
    ]


# --------------------------------------------------------------------------- leases


def concurrency_rule() -> Rule:
    return Rule("jobs", "2/30s", "concurrency")


def in_flight(limiter: Limiter, rule: Rule, key: str = "k") -> int:
    return 2 - limiter.peek(rule, key, 0).remaining


def test_lease_holds_a_slot_for_the_block_and_releases_it_on_exit(limiter: Limiter) -> None:
    rule = concurrency_rule()
    with limiter.lease(rule, "k") as lease:
        assert isinstance(lease.id, str)
        assert 1 == in_flight(limiter, rule)
        with limiter.lease(rule, "k"):
            assert 2 == in_flight(limiter, rule)
        assert 1 == in_flight(limiter, rule)
    assert 0 == in_flight(limiter, rule)


def test_third_concurrent_lease_raises_rate_limit_exceeded(limiter: Limiter) -> None:
    rule = concurrency_rule()
    with limiter.lease(rule, "k"), limiter.lease(rule, "k"):
        with pytest.raises(RateLimitExceeded) as excinfo, limiter.lease(rule, "k"):
            pytest.fail("a third lease must not be granted")
        assert (Limit(2, 30), 30.0) == (excinfo.value.decision.denied_by, excinfo.value.retry_after)
        assert "2/30s" in str(excinfo.value)
        assert 2 == in_flight(limiter, rule)
    with limiter.lease(rule, "k"):
        assert 1 == in_flight(limiter, rule)


def test_lease_is_released_when_the_block_raises(limiter: Limiter) -> None:
    rule = concurrency_rule()
    with pytest.raises(RuntimeError), limiter.lease(rule, "k"):
        raise RuntimeError("boom")
    assert 0 == in_flight(limiter, rule)


def test_leases_of_a_crashed_holder_expire_after_the_period(limiter: Limiter, clock: FakeClock) -> None:
    rule = concurrency_rule()
    limiter.lease(rule, "k").__enter__()  # held by a process that dies: never released
    limiter.lease(rule, "k").__enter__()
    assert False is limiter.try_acquire(rule, "k").allowed
    clock.advance(30, us=-1)
    assert 2 == in_flight(limiter, rule)
    clock.advance(us=1)
    assert 0 == in_flight(limiter, rule)
    with limiter.lease(rule, "k"), limiter.lease(rule, "k"):
        assert 2 == in_flight(limiter, rule)


def test_release_of_an_expired_lease_is_harmless_and_frees_nobody_else(limiter: Limiter, clock: FakeClock) -> None:
    rule = concurrency_rule()
    stale = limiter.lease(rule, "k")
    stale.__enter__()
    clock.advance(31)
    with limiter.lease(rule, "k"):
        stale.__exit__(None, None, None)
        assert 1 == in_flight(limiter, rule)
        stale.release()
    assert 0 == in_flight(limiter, rule)


def test_releasing_a_lease_twice_or_an_unknown_lease_id_is_harmless(limiter: Limiter) -> None:
    rule = concurrency_rule()
    held = limiter.try_acquire(rule, "k")
    other = limiter.try_acquire(rule, "k")
    assert held.lease_id is not None
    limiter.release(rule, "k", held.lease_id)
    limiter.release(rule, "k", held.lease_id)
    limiter.release(rule, "k", "no-such-lease")
    assert 1 == in_flight(limiter, rule)
    assert other.lease_id is not None
    limiter.release(rule, "k", other.lease_id)
    assert 0 == in_flight(limiter, rule)


def test_each_lease_gets_its_own_id(limiter: Limiter) -> None:
    rule = concurrency_rule()
    with limiter.lease(rule, "k") as one, limiter.lease(rule, "k") as two:
        assert one.id != two.id


def test_lease_id_before_entering_is_a_lease_error(limiter: Limiter) -> None:
    with pytest.raises(LeaseError) as excinfo:
        _ = limiter.lease(concurrency_rule(), "k").id
    assert "has not been acquired" in str(excinfo.value)


def test_lease_on_a_rule_that_is_not_concurrency_is_a_configuration_error(limiter: Limiter) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        limiter.lease(Rule("r", "2/30s", "gcra"), "k")
    assert "leases need algorithm='concurrency'" in str(excinfo.value)


def test_peek_on_a_concurrency_rule_hands_out_no_lease_id(limiter: Limiter) -> None:
    """A peek holds nothing, so it must not return a lease id the caller could believe it holds."""
    decision = limiter.peek(concurrency_rule(), "k")
    assert (True, None) == (decision.allowed, decision.lease_id)
    assert 0 == in_flight(limiter, concurrency_rule())


def test_a_batch_grants_a_lease_that_can_be_released(limiter: Limiter) -> None:
    rule = concurrency_rule()
    batch = limiter.try_acquire_many([(rule, "k"), (Rule("g", "5/hour"), "*")])
    lease_id = batch[0].lease_id
    assert (True, 1) == (batch.allowed, in_flight(limiter, rule))
    assert lease_id is not None
    limiter.release(rule, "k", lease_id)
    assert 0 == in_flight(limiter, rule)


def test_a_refused_batch_hands_out_no_lease_id(limiter: Limiter) -> None:
    """Nothing of a refused batch is charged, so no entry may carry a lease id that was never granted."""
    rule = concurrency_rule()
    global_ = Rule("g", "1/hour")
    limiter.try_acquire(global_, "*")
    batch = limiter.try_acquire_many([(rule, "k"), (global_, "*")])
    assert (False, 0) == (batch.allowed, in_flight(limiter, rule))
    assert [None, None] == [d.lease_id for d in batch]


# --------------------------------------------------------------------------- the decorator


def test_decorator_charges_each_call_to_the_key_from_the_arguments(limiter: Limiter) -> None:
    calls: list[str] = []

    @limiter.limit(Rule("greet", "2/10s", "fixed_window"), key=lambda user, **_: user)
    def greet(user: str, *, loud: bool = False) -> str:
        calls.append(user)
        return user.upper() if loud else user

    assert ["ann", "ANN", "bob"] == [greet("ann"), greet("ann", loud=True), greet("bob")]
    with pytest.raises(RateLimitExceeded) as excinfo:
        greet("ann")
    assert (Limit(2, 10), 10.0) == (excinfo.value.decision.denied_by, excinfo.value.retry_after)
    assert "'greet'" in str(excinfo.value)
    assert ["ann", "ann", "bob"] == calls  # the refused call never ran
    assert "greet" == greet.__name__


def test_decorator_takes_the_cost_from_the_arguments(limiter: Limiter) -> None:
    @limiter.limit(Rule("bytes", "10/10s", "token_bucket"), key="*", cost=lambda n: n)
    def send(n: int) -> int:
        return n

    assert 7 == send(7)
    with pytest.raises(RateLimitExceeded):
        send(4)
    assert 3 == send(3)


def test_decorator_on_an_async_function_with_a_key_callable(limiter: Limiter) -> None:
    @limiter.limit(Rule("fetch", "1/10s", "gcra"), key=lambda url: url)
    async def fetch(url: str) -> str:
        await asyncio.sleep(0)
        return f"got {url}"

    async def main() -> list[str]:
        results = [await fetch("a"), await fetch("b")]
        with pytest.raises(RateLimitExceeded):
            await fetch("a")
        return results

    assert ["got a", "got b"] == asyncio.run(main())


def test_async_limiter_decorator_on_an_async_function_with_a_key_callable(clock: FakeClock) -> None:
    limiter = AsyncLimiter(clock=clock)

    @limiter.limit(Rule("fetch", "1/10s", "gcra"), key=lambda url: url)
    async def fetch(url: str) -> str:
        return f"got {url}"

    async def main() -> list[str]:
        results = [await fetch("a"), await fetch("b")]
        with pytest.raises(RateLimitExceeded) as excinfo:
            await fetch("a")
        assert 10.0 == excinfo.value.retry_after
        return results

    assert ["got a", "got b"] == asyncio.run(main())


def test_async_limiter_refuses_to_decorate_a_plain_function(clock: FakeClock) -> None:
    limiter = AsyncLimiter(clock=clock)
    with pytest.raises(ConfigurationError) as excinfo:

        @limiter.limit(Rule("r", "1/s"))
        def plain() -> None: ...

    assert "decorates async functions" in str(excinfo.value)


def test_decorator_with_wait_sleeps_on_the_clock_until_admitted(limiter: Limiter, clock: FakeClock) -> None:
    @limiter.limit(Rule("slow", "1/2s", "gcra"), key=lambda x: "k", wait=5)
    def work(x: int) -> int:
        return x * 10

    start = clock.now_us()
    assert [10, 20, 30] == [work(1), work(2), work(3)]
    assert [2.0, 2.0] == clock.slept
    assert 4_000_000 == clock.now_us() - start


def test_decorator_with_wait_shorter_than_needed_raises_without_sleeping(limiter: Limiter, clock: FakeClock) -> None:
    @limiter.limit(Rule("slow", "1/2s", "fixed_window"), wait=0.5)
    def work() -> str:
        return "done"

    assert "done" == work()
    with pytest.raises(RateLimitExceeded) as excinfo:
        work()
    assert "not admitted within the timeout of 0.5s" in str(excinfo.value)
    assert [] == clock.slept


def test_async_decorator_with_wait_sleeps_on_the_clock_until_admitted(clock: FakeClock) -> None:
    limiter = AsyncLimiter(clock=clock)

    @limiter.limit(Rule("slow", "1/2s", "token_bucket"), wait=5)
    async def work(x: int) -> int:
        return x

    async def main() -> list[int]:
        return [await work(1), await work(2)]

    assert [1, 2] == asyncio.run(main())
    assert [2.0] == clock.slept


def test_decorator_needs_a_rule(limiter: Limiter) -> None:
    with pytest.raises(ConfigurationError) as excinfo:
        limiter.limit("5/s")  # type: ignore[arg-type]
    assert "limit() needs a Rule" in str(excinfo.value)


class Tier(StrEnum):
    GOLD = "gold"


def test_str_subclass_key_error_does_not_blame_the_cost() -> None:
    """A key of a str subclass (a StrEnum member) is refused for what it is, the key's type,
    never with a message about the cost."""
    limiter = Limiter(clock=FakeClock())
    rule = Rule("r", ["10/s"])
    try:
        limiter.try_acquire(rule, Tier.GOLD)
    except InvalidRequest as exc:
        assert "cost" not in str(exc), str(exc)


@pytest.mark.parametrize("wait", [2.0, 0.0])
def test_limiter_refuses_to_decorate_a_coroutine_function_with_wait(wait: float) -> None:
    """Limiter.limit(wait=...) on an async function would time.sleep on the event loop:
    refused at decoration, pointing to AsyncLimiter (whose on_error and breaker are the
    user's own, unlike a second limiter built behind the user's back)."""
    limiter = Limiter()
    with pytest.raises(ConfigurationError) as excinfo:

        @limiter.limit(Rule("export", ["1/300ms"]), wait=wait)
        async def export() -> int:
            return 1

    assert "waits with a blocking sleep" in str(excinfo.value)
    assert "AsyncLimiter" in str(excinfo.value)


@pytest.mark.redis
def test_limiter_refuses_to_decorate_a_coroutine_function_on_a_server_store() -> None:
    """A Redis Limiter blocks on I/O: on a coroutine function it is refused, not run on the loop."""
    limiter = Limiter("redis://127.0.0.1:6379/0")
    try:
        with pytest.raises(ConfigurationError) as excinfo:

            @limiter.limit(Rule("export", ["1/s"]))
            async def export() -> int:
                return 1

        assert "blocks on its store's I/O" in str(excinfo.value)
    finally:
        limiter.close()
