"""Properties of the reference algorithms, checked by hypothesis on explicit ``now`` traces.

Every algorithm is a pure function ``decide(plan, state, now_us, cost, max_wait, lease_id)``,
so each test replays a generated trace of (time, cost) requests through it: no clock, no
sleeps. Times are integer microseconds; periods are drawn down to 1 µs (so emission
intervals such as 7/3 µs are fractional) and traces start at a random epoch offset, which
exercises window alignment and the exact integer arithmetic of the bucket algorithms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ratekeeper.algorithms.base import UNBOUNDED_WAIT
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule

pytestmark = pytest.mark.slow  # hypothesis properties of every algorithm

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)

EXACT = ("fixed_window", "sliding_window_log", "token_bucket", "gcra", "leaky_bucket")
"""Algorithms whose ``retry_us`` is exact: admitted at ``now + retry_us``, denied 1 µs earlier."""

COUNTING = ("fixed_window", "sliding_window_log", "sliding_window_counter", "token_bucket", "gcra", "leaky_bucket")
"""Every algorithm that is driven by (now, cost) alone (concurrency also needs lease ids)."""

BURSTY = ("token_bucket", "gcra", "leaky_bucket")
"""The algorithms that accept a ``burst``."""


# --------------------------------------------------------------------------- strategies
#
# Every strategy is built once, here: the composites below only draw from them and scale
# the raw numbers to the rule's periods (building strategies per example is slow).

_COUNTS = st.integers(1, 5)
_PERIODS = st.one_of(
    st.integers(1, 60),
    st.integers(1, 5_000),
    st.sampled_from([1_000, 100_000, 1_000_000, 3_000_000]),
)
_BURSTS = st.none() | st.integers(1, 6)
_STARTS = st.one_of(st.integers(0, 10_000_000), st.just(1_700_000_000_123_456))
_RAW = st.integers(0, 2**40)
"""One draw per value: the low bits choose the kind of value, the rest its size, and 0
(where hypothesis shrinks to) is the simplest case (no gap, cost 1, no max_wait)."""


def draw_limits(draw: st.DrawFn, *, burst: bool, max_limits: int) -> tuple[Limit, ...]:
    """One to ``max_limits`` limits; periods from 1 µs (fractional emission intervals) to 3 s."""
    limits = []
    for _ in range(draw(st.integers(1, max_limits))):
        count, period_us = draw(_COUNTS), draw(_PERIODS)
        limits.append(Limit.from_us(count, period_us, draw(_BURSTS) if burst else None))
    return tuple(limits)


def draw_gap(draw: st.DrawFn, limits: tuple[Limit, ...]) -> int:
    """0, a few µs, up to half the shortest period, or up to twice the longest."""
    raw = draw(_RAW)
    kind, size = raw % 4, raw // 4
    if kind == 0:
        return 0
    if kind == 1:
        return size % 4
    if kind == 2:
        return size % (min(limit.period_us for limit in limits) // 2 + 2)
    return size % (2 * max(limit.period_us for limit in limits) + 1)


def draw_cost(draw: st.DrawFn, limits: tuple[Limit, ...]) -> int:
    """Mostly 1, else anything from 0 to one more than the largest capacity."""
    raw = draw(_RAW)
    if raw % 2 == 0:
        return 1
    return (raw // 2) % (max(limit.capacity for limit in limits) + 2)


def draw_max_wait(draw: st.DrawFn, limits: tuple[Limit, ...]) -> int | None:
    """None (try_acquire), 0, up to three longest periods, or unbounded (acquire without timeout)."""
    raw = draw(_RAW)
    kind, size = raw % 4, raw // 4
    if kind == 0:
        return None
    if kind == 1:
        return 0
    if kind == 2:
        return size % (3 * max(limit.period_us for limit in limits) + 1)
    return UNBOUNDED_WAIT


@dataclass(frozen=True)
class Scenario:
    """A rule and an explicit trace of requests: absolute times (non-decreasing) and costs."""

    rule: Rule
    times: tuple[int, ...]
    costs: tuple[int, ...]
    max_waits: tuple[int | None, ...]

    @property
    def requests(self) -> list[tuple[int, int, int | None]]:
        return list(zip(self.times, self.costs, self.max_waits, strict=True))


@st.composite
def scenarios(
    draw: st.DrawFn,
    algorithms: tuple[str, ...],
    *,
    max_limits: int = 2,
    max_wait: bool = False,
    max_size: int = 24,
) -> Scenario:
    """A rule for one of ``algorithms`` and a request trace scaled to its periods.

    ``max_wait`` adds reservation requests (``acquire`` with a timeout).
    """
    algorithm = draw(st.sampled_from(algorithms))
    limits = draw_limits(draw, burst=algorithm in BURSTY, max_limits=max_limits)
    now = draw(_STARTS)
    times, costs, waits = [], [], []
    for _ in range(draw(st.integers(1, max_size))):
        now += draw_gap(draw, limits)
        times.append(now)
        costs.append(draw_cost(draw, limits))
        waits.append(draw_max_wait(draw, limits) if max_wait else None)
    return Scenario(Rule("prop", limits, algorithm), tuple(times), tuple(costs), tuple(waits))


@dataclass(frozen=True)
class Step:
    now: int
    cost: int
    max_wait: int | None
    before: Any
    after: Any
    decision: Decision


def replay(scenario: Scenario) -> list[Step]:
    """Decide every request of the trace in order, threading the state through."""
    rule = scenario.rule
    state = None
    steps = []
    for n, (now, cost, max_wait) in enumerate(scenario.requests):
        new, decision = rule.algo.decide(rule.plan, state, now, cost, max_wait, f"lease-{n}")
        steps.append(Step(now, cost, max_wait, state, new, decision))
        state = new
    return steps


def decide(rule: Rule, state: Any, now: int, cost: int, max_wait: int | None = None) -> Decision:
    return rule.algo.decide(rule.plan, state, now, cost, max_wait, "probe")[1]


def interval(limit: Limit) -> Fraction:
    """Microseconds per unit of cost (the emission interval), exactly."""
    return Fraction(limit.period_us, limit.count)


def admitted(steps: list[Step]) -> list[Step]:
    return [s for s in steps if s.decision.allowed and s.cost > 0]


# --------------------------------------------------------------------------- window limits


@PROPERTY_SETTINGS
@given(scenarios(("sliding_window_log",), max_limits=3))
def test_sliding_window_log_never_exceeds_any_limit_in_any_window(scenario: Scenario) -> None:
    """For every limit L/P, the admitted costs in every window [t, t+P) sum to at most L.

    It suffices to check windows that start at an admitted request (any window can slide
    forward to its first admitted request without losing one).
    """
    trace = [(s.now, s.cost) for s in admitted(replay(scenario))]
    for limit in scenario.rule.limits:
        for start, _ in trace:
            in_window = sum(c for t, c in trace if start <= t < start + limit.period_us)
            assert in_window <= limit.count, (limit, start, trace)


@PROPERTY_SETTINGS
@given(scenarios(("sliding_window_log",), max_limits=3))
def test_sliding_window_log_admits_exactly_when_every_trailing_window_has_room(scenario: Scenario) -> None:
    """The log is exact both ways: a request is admitted iff, for every limit L/P, the costs
    admitted in (now - P, now] plus its own cost are at most L; remaining per limit is L minus
    that window's admitted cost."""
    trace: list[tuple[int, int]] = []
    for step in replay(scenario):
        used = [sum(c for t, c in trace if t > step.now - limit.period_us) for limit in scenario.rule.limits]
        expected_allowed = all(
            u + step.cost <= limit.count for u, limit in zip(used, scenario.rule.limits, strict=True)
        )
        assert expected_allowed == step.decision.allowed
        charged = step.cost if expected_allowed else 0
        expected_remaining = tuple(
            limit.count - u - charged for u, limit in zip(used, scenario.rule.limits, strict=True)
        )
        assert expected_remaining == step.decision.remaining_each
        if step.decision.allowed and step.cost:
            trace.append((step.now, step.cost))


@PROPERTY_SETTINGS
@given(scenarios(("fixed_window",), max_limits=3))
def test_fixed_window_never_exceeds_the_limit_in_an_aligned_window_and_admits_while_room(scenario: Scenario) -> None:
    """For every limit L/P, the admitted costs in each aligned window [kP, (k+1)P) sum to at
    most L, and a request is refused only when some limit's window has no room for it."""
    counts: dict[tuple[int, int], int] = {}
    for step in replay(scenario):
        keys = [(i, step.now // limit.period_us) for i, limit in enumerate(scenario.rule.limits)]
        room = all(
            counts.get(key, 0) + step.cost <= limit.count for key, limit in zip(keys, scenario.rule.limits, strict=True)
        )
        assert room == step.decision.allowed
        if step.decision.allowed:
            for key in keys:
                counts[key] = counts.get(key, 0) + step.cost
    for (i, _window), total in counts.items():
        assert total <= scenario.rule.limits[i].count


# --------------------------------------------------------------------------- buckets


def _assert_span_bound(starts: list[tuple[int, int]], limit: Limit, rounding_us: int = 0) -> None:
    """Admitted cost in any closed span [t0, t1] is at most burst + count * (t1 - t0) / period.

    ``rounding_us = 1`` allows for start times that were rounded up to the next whole µs
    (a reservation's delay): the exact starts lie in (t - 1, t], so a span may be 1 µs longer.
    """
    starts = sorted(starts)
    rate = Fraction(limit.count, limit.period_us)
    for i, (t0, _) in enumerate(starts):
        total = 0
        for t1, cost in starts[i:]:
            total += cost
            assert total <= limit.capacity + rate * (t1 - t0 + rounding_us), (limit, t0, t1, total, starts)


@PROPERTY_SETTINGS
@given(scenarios(("token_bucket",), max_limits=3))
def test_token_bucket_never_admits_more_than_burst_plus_rate_times_span(scenario: Scenario) -> None:
    """For every limit and every span [t0, t1] of the trace, the admitted costs sum to at most
    ``burst + count * (t1 - t0) / period`` (exact rationals)."""
    trace = [(s.now, s.cost) for s in admitted(replay(scenario))]
    for limit in scenario.rule.limits:
        _assert_span_bound(trace, limit)


@PROPERTY_SETTINGS
@given(scenarios(("token_bucket",), max_limits=3, max_wait=True))
def test_token_bucket_reservations_start_within_burst_plus_rate_times_span(scenario: Scenario) -> None:
    """With reservations (``max_wait``), the bound holds on the times the callers may start
    (``now + delay_us``): a reservation never lets a caller run before its tokens exist.
    Delays are whole µs rounded up, so two reservations can share a µs that holds up to
    1 µs of refill more than the exact bound (``2/1us``: starts 1, 2, 2 for costs 1, 2, 1)."""
    steps = admitted(replay(scenario))
    for step in steps:
        assert step.decision.delay_us <= (step.max_wait or 0)
    trace = [(s.now + s.decision.delay_us, s.cost) for s in steps]
    for limit in scenario.rule.limits:
        _assert_span_bound(trace, limit, rounding_us=1)


@st.composite
def meter_traces(draw: st.DrawFn) -> tuple[tuple[Limit, ...], int, list[tuple[str, int, int, int | None]]]:
    """Limits, a start time and a trace of decide / refund operations with reservations."""
    limits = draw_limits(draw, burst=True, max_limits=3)
    ops = []
    for _ in range(draw(st.integers(1, 24))):
        kind = "refund" if draw(_RAW) % 4 == 3 else "decide"
        ops.append((kind, draw_gap(draw, limits), draw_cost(draw, limits), draw_max_wait(draw, limits)))
    return limits, draw(_STARTS), ops


@PROPERTY_SETTINGS
@given(meter_traces())
def test_gcra_and_token_bucket_decide_identically(
    case: tuple[tuple[Limit, ...], int, list[tuple[str, int, int, int | None]]],
) -> None:
    """GCRA and the token bucket are the same meter: on every trace (with reservations and
    refunds) they give equal decisions: allowed, denied limit, remaining, retry_us,
    delay_us and reset_us for every limit."""
    limits, now, ops = case
    gcra = Rule("meter", limits, "gcra")
    bucket = Rule("meter", limits, "token_bucket")
    g_state = b_state = None
    for kind, gap, cost, max_wait in ops:
        now += gap
        if kind == "refund":
            g_state = gcra.algo.refund(gcra.plan, g_state, now, cost)
            b_state = bucket.algo.refund(bucket.plan, b_state, now, cost)
            continue
        g_state, expected = gcra.algo.decide(gcra.plan, g_state, now, cost, max_wait)
        b_state, actual = bucket.algo.decide(bucket.plan, b_state, now, cost, max_wait)
        assert tuple(expected) == tuple(actual)


def _dominant(limits: tuple[Limit, ...]) -> list[Limit]:
    """The limits with the longest emission interval: they decide every delay."""
    slowest = max(interval(limit) for limit in limits)
    return [limit for limit in limits if interval(limit) == slowest]


@PROPERTY_SETTINGS
@given(scenarios(("leaky_bucket",), max_limits=3))
def test_leaky_bucket_output_is_smooth(scenario: Scenario) -> None:
    """Admitted requests start (``now + delay_us``) evenly spaced: between two admitted
    requests i < j, the starts are at least ``floor(sum of costs of i..j-1 * period/count)``
    µs apart for the slowest limit (the floor is the whole-µs rounding of fractional
    intervals; with whole intervals it is exactly cost * period / count)."""
    trace = [(s.now + s.decision.delay_us, s.cost) for s in admitted(replay(scenario))]
    slowest = interval(_dominant(scenario.rule.limits)[0])
    for i, (start_i, _) in enumerate(trace):
        ahead = 0
        for start_j, cost in trace[i:]:
            assert start_j - start_i >= math.floor(ahead * slowest), (start_i, start_j, ahead, trace)
            ahead += cost


@PROPERTY_SETTINGS
@given(scenarios(("leaky_bucket",), max_limits=3))
def test_leaky_bucket_queue_never_holds_more_than_burst(scenario: Scenario) -> None:
    """When a request is admitted at ``now``, the costs of the requests still waiting for their
    turn (start > now) plus its own cost are at most the burst (the queue size), and its delay
    is at most the time to drain ``burst - cost``. With several limits the slowest one sets
    every start, so its burst is the bound (see the report: a faster limit's smaller burst
    does not bound the real queue)."""
    slowest = _dominant(scenario.rule.limits)
    burst = min(limit.capacity for limit in slowest)
    starts: list[tuple[int, int]] = []
    for step in replay(scenario):
        if step.decision.allowed and step.cost:
            waiting = sum(c for t, c in starts if t > step.now)
            assert waiting + step.cost <= burst, (step.now, starts)
            assert step.decision.delay_us <= math.ceil((burst - step.cost) * interval(slowest[0]))
            starts.append((step.now + step.decision.delay_us, step.cost))


# --------------------------------------------------------------------------- concurrency


@st.composite
def lease_traces(draw: st.DrawFn) -> tuple[Rule, int, list[tuple[str, int, int]]]:
    """A concurrency rule and a trace of acquire (cost) / release (which held lease) operations."""
    limits = draw_limits(draw, burst=False, max_limits=2)
    ops = []
    for _ in range(draw(st.integers(1, 24))):
        kind = "release" if draw(_RAW) % 4 == 3 else "acquire"
        ops.append((kind, draw_gap(draw, limits), draw(_RAW) % 64))
    return Rule("leases", limits, "concurrency"), draw(_STARTS), ops


@PROPERTY_SETTINGS
@given(lease_traces())
def test_concurrency_never_has_more_than_count_leases_in_flight(
    case: tuple[Rule, int, list[tuple[str, int, int]]],
) -> None:
    """For every limit L/P, the leases in flight (acquired within the last P µs and not
    released) never cost more than L, and an acquire is refused only when they leave no room."""
    rule, now, ops = case
    state = None
    held: dict[str, tuple[int, int]] = {}
    for n, (kind, gap, arg) in enumerate(ops):
        now += gap
        if kind == "release":
            if held:
                lease = sorted(held)[arg % len(held)]
                state = rule.algo.refund(rule.plan, state, now, 0, lease_id=lease)
                del held[lease]
            continue
        cost = arg % (max(limit.count for limit in rule.limits) + 2)
        lease = f"lease-{n}"
        in_flight = [sum(c for t, c in held.values() if t > now - limit.period_us) for limit in rule.limits]
        state, decision = rule.algo.decide(rule.plan, state, now, cost, None, lease)
        room = all(f + cost <= limit.count for f, limit in zip(in_flight, rule.limits, strict=True))
        assert room == decision.allowed
        if decision.allowed and cost:
            assert lease == decision.lease_id
            held[lease] = (now, cost)
            for limit in rule.limits:
                live = sum(c for t, c in held.values() if t > now - limit.period_us)
                assert live <= limit.count


# --------------------------------------------------------------------------- retry_us


def _finite_denials(steps: list[Step]) -> list[Step]:
    return [s for s in steps if not s.decision.allowed and s.decision.retry_us != INFINITE]


@PROPERTY_SETTINGS
@given(scenarios(EXACT, max_limits=3))
def test_exact_algorithms_retry_us_is_the_earliest_admitting_time(scenario: Scenario) -> None:
    """A request denied with finite ``retry_us``, repeated with nothing in between, is admitted
    at ``now + retry_us`` and still denied at ``now + retry_us - 1`` (retry_us is tight)."""
    rule = scenario.rule
    for step in _finite_denials(replay(scenario)):
        retry = step.decision.retry_us
        assert retry > 0
        assert decide(rule, step.before, step.now + retry, step.cost).allowed
        assert not decide(rule, step.before, step.now + retry - 1, step.cost).allowed


@PROPERTY_SETTINGS
@given(scenarios(("sliding_window_counter",), max_limits=3))
def test_sliding_window_counter_retry_us_is_the_earliest_admitting_time(scenario: Scenario) -> None:
    """The approximate counter's ``retry_us`` is still exact for its own estimate: the
    repeated request is admitted at ``now + retry_us`` and still refused 1 µs earlier."""
    rule = scenario.rule
    for step in _finite_denials(replay(scenario)):
        retry = step.decision.retry_us
        assert retry > 0
        assert decide(rule, step.before, step.now + retry, step.cost).allowed
        assert not decide(rule, step.before, step.now + retry - 1, step.cost).allowed


@PROPERTY_SETTINGS
@given(lease_traces())
def test_concurrency_retry_us_is_when_enough_leases_expire(case: tuple[Rule, int, list[tuple[str, int, int]]]) -> None:
    """With no release in between, a refused acquire is admitted at ``now + retry_us`` (the
    oldest leases expired) and still refused 1 µs earlier."""
    rule, now, ops = case
    state = None
    top = max(limit.count for limit in rule.limits) + 2
    for n, (_, gap, arg) in enumerate(ops):
        now += gap
        cost = arg % top
        new, decision = rule.algo.decide(rule.plan, state, now, cost, None, f"lease-{n}")
        if not decision.allowed and decision.retry_us != INFINITE:
            retry = decision.retry_us
            assert rule.algo.decide(rule.plan, state, now + retry, cost, None, "probe")[1].allowed
            assert not rule.algo.decide(rule.plan, state, now + retry - 1, cost, None, "probe")[1].allowed
        state = new


@PROPERTY_SETTINGS
@given(scenarios(("token_bucket", "gcra"), max_limits=3, max_wait=True))
def test_reserving_meters_admit_the_same_reservation_at_now_plus_retry_us(scenario: Scenario) -> None:
    """Token bucket and GCRA: a reservation refused because the wait exceeds ``max_wait`` is
    admitted (with the same ``max_wait``) at ``now + retry_us``. (Not tight: today retry_us
    is when no wait is needed at all, see the report.)"""
    rule = scenario.rule
    for step in _finite_denials(replay(scenario)):
        assert decide(rule, step.before, step.now + step.decision.retry_us, step.cost, step.max_wait).allowed


@PROPERTY_SETTINGS
@given(scenarios(("leaky_bucket",), max_limits=3, max_wait=True))
@example(Scenario(Rule("prop", "2/2us", "leaky_bucket"), times=(0, 0, 0), costs=(1, 1, 1), max_waits=(None, None, 0)))
def test_leaky_bucket_retry_us_with_max_wait_is_the_earliest_admitting_time(scenario: Scenario) -> None:
    """Leaky bucket with ``max_wait``: a refused request, repeated with the same ``max_wait``
    and nothing in between, is admitted at ``now + retry_us`` and still refused 1 µs earlier,
    whether it was refused because the queue was full, because its delay exceeded
    ``max_wait``, or both (the explicit example: full queue and ``max_wait`` 0)."""
    rule = scenario.rule
    for step in _finite_denials(replay(scenario)):
        retry = step.decision.retry_us
        assert decide(rule, step.before, step.now + retry, step.cost, step.max_wait).allowed
        assert not decide(rule, step.before, step.now + retry - 1, step.cost, step.max_wait).allowed


# --------------------------------------------------------------------------- charging


@PROPERTY_SETTINGS
@given(scenarios(COUNTING, max_limits=3, max_wait=True))
def test_a_denied_request_charges_nothing(scenario: Scenario) -> None:
    """A refused request returns a state that decides exactly as the state it was given: the
    same request again gets the same decision, and the rest of the trace is decided the same
    whether or not the refused requests had happened."""
    rule = scenario.rule
    steps = replay(scenario)
    for step in steps:
        if not step.decision.allowed:
            assert step.decision == decide(rule, step.after, step.now, step.cost, step.max_wait)
    kept = [i for i, s in enumerate(steps) if s.decision.allowed]
    without = Scenario(
        rule,
        tuple(scenario.times[i] for i in kept),
        tuple(scenario.costs[i] for i in kept),
        tuple(scenario.max_waits[i] for i in kept),
    )
    expected = [steps[i].decision for i in kept]
    actual = [s.decision for s in replay(without)]
    assert expected == actual


@PROPERTY_SETTINGS
@given(
    scenarios(COUNTING, max_limits=3, max_wait=True),
    st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 7)), min_size=1, max_size=5),
)
def test_refund_right_after_a_charge_restores_the_previous_state(
    scenario: Scenario, probes: list[tuple[int, int]]
) -> None:
    """Refunding an admitted cost at the same instant restores the remaining of every limit,
    and the refunded state decides any later request exactly as the state before the charge."""
    rule = scenario.rule
    for step in admitted(replay(scenario)):
        refunded = rule.algo.refund(rule.plan, step.after, step.now, step.cost)
        expected = decide(rule, step.before, step.now, 0)
        actual = decide(rule, refunded, step.now, 0)
        assert expected.remaining_each == actual.remaining_each
        for gap, cost in probes:
            assert decide(rule, step.before, step.now + gap, cost) == decide(rule, refunded, step.now + gap, cost)


@PROPERTY_SETTINGS
@given(lease_traces())
def test_releasing_a_lease_restores_the_previous_remaining(case: tuple[Rule, int, list[tuple[str, int, int]]]) -> None:
    """Releasing a lease just acquired gives every limit back its previous remaining."""
    rule, now, ops = case
    state = None
    top = max(limit.count for limit in rule.limits) + 1
    for n, (_, gap, arg) in enumerate(ops):
        now += gap
        cost = arg % top
        new, decision = rule.algo.decide(rule.plan, state, now, cost, None, f"lease-{n}")
        if decision.allowed and cost:
            released = rule.algo.refund(rule.plan, new, now, cost, lease_id=f"lease-{n}")
            before = rule.algo.decide(rule.plan, state, now, 0, None, "probe")[1]
            after = rule.algo.decide(rule.plan, released, now, 0, None, "probe")[1]
            assert before.remaining_each == after.remaining_each
        state = new


@PROPERTY_SETTINGS
@given(scenarios((*COUNTING, "concurrency"), max_limits=3, max_wait=True))
def test_reset_us_is_when_each_limit_is_whole_again(scenario: Scenario) -> None:
    """After every decision, each limit's ``reset_us`` is exactly when it is whole again: a
    peek at ``now + reset_us`` shows its full capacity remaining, 1 µs earlier it does not
    (and ``reset_us == 0`` means it is whole now)."""
    rule = scenario.rule
    for step in replay(scenario):
        for i, (limit, reset) in enumerate(zip(rule.limits, step.decision.reset_us, strict=True)):
            assert reset >= 0
            assert limit.capacity == decide(rule, step.after, step.now + reset, 0).remaining_each[i]
            if reset > 0:
                assert limit.capacity > decide(rule, step.after, step.now + reset - 1, 0).remaining_each[i]


@PROPERTY_SETTINGS
@given(scenarios(COUNTING, max_limits=3))
def test_multi_limit_rules_are_all_or_nothing(scenario: Scenario) -> None:
    """When one limit refuses, no limit is charged: every limit's remaining and reset equal
    those of a cost-0 peek. When all admit, every limit is charged the cost (the exact
    algorithms' remaining drops by exactly the cost)."""
    rule = scenario.rule
    for step in replay(scenario):
        peek = decide(rule, step.before, step.now, 0)
        if not step.decision.allowed:
            assert peek.remaining_each == step.decision.remaining_each
            assert peek.reset_us == step.decision.reset_us
        elif rule.algorithm != "sliding_window_counter":
            assert tuple(r - step.cost for r in peek.remaining_each) == step.decision.remaining_each


@PROPERTY_SETTINGS
@given(
    scenarios((*COUNTING, "concurrency"), max_limits=3, max_size=12),
    st.integers(1, 5),
)
def test_cost_above_a_capacity_is_denied_forever_by_that_limit(scenario: Scenario, excess: int) -> None:
    """A cost larger than some limit's capacity is refused with ``retry_after == inf``
    (``retry_us == INFINITE``), ``denied_by`` the first such limit, from any state."""
    rule = scenario.rule
    smallest = min(limit.capacity for limit in rule.limits)
    cost = smallest + excess
    expected_limit = next(limit for limit in rule.limits if limit.capacity < cost)
    for step in replay(scenario):
        decision = decide(rule, step.after, step.now, cost, UNBOUNDED_WAIT)
        assert not decision.allowed
        assert math.inf == decision.retry_after
        assert INFINITE == decision.retry_us
        assert expected_limit == decision.denied_by
        assert decision.limits[rule.limits.index(expected_limit)].denied
