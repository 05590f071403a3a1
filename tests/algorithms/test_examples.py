"""Worked examples of every algorithm with exact expected numbers.

Each example replays requests at explicit times (integer microseconds) through the pure
``decide`` / ``refund`` functions and pins the decisions a user would see: allowed,
remaining, retry_after, reset_after, delay, denied_by and the per-limit statistics.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from ratekeeper.algorithms.base import UNBOUNDED_WAIT
from ratekeeper.decision import INFINITE, Decision
from ratekeeper.limit import Limit
from ratekeeper.rule import Rule

S = 1_000_000
MS = 1_000
T0 = 1_700_000_040_000_000
"""A realistic epoch time (µs) that is a whole multiple of a minute (so of 3 s, 10 s and
100 ms too): the fixed and counter windows of the examples begin exactly at T0."""

ALL = (
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "gcra",
    "leaky_bucket",
    "concurrency",
)


class Key:
    """One key's state under one rule, driven at explicit times."""

    def __init__(self, rule: Rule) -> None:
        self.rule = rule
        self.state: Any = None
        self.leases = 0

    def hit(self, now: int, cost: int = 1, max_wait: int | None = None, lease_id: str | None = None) -> Decision:
        if lease_id is None and self.rule.algorithm == "concurrency":
            self.leases += 1
            lease_id = f"lease-{self.leases}"
        self.state, decision = self.rule.algo.decide(self.rule.plan, self.state, now, cost, max_wait, lease_id)
        return decision

    def peek(self, now: int, cost: int = 1, max_wait: int | None = None) -> Decision:
        """The decision at ``now`` without keeping its state."""
        return self.rule.algo.decide(self.rule.plan, self.state, now, cost, max_wait, "peek")[1]

    def refund(self, now: int, cost: int = 1, lease_id: str | None = None) -> None:
        self.state = self.rule.algo.refund(self.rule.plan, self.state, now, cost, lease_id)


def test_aligned_epoch_for_the_examples() -> None:
    """T0 starts a minute, 3 s, 10 s and 100 ms window (the window examples rely on it)."""
    assert (0, 0, 0, 0) == (T0 % (60 * S), T0 % (3 * S), T0 % (10 * S), T0 % (100 * MS))


# --------------------------------------------------------------------------- auth.create_token


def test_auth_create_token_sixth_call_in_three_seconds_is_denied_by_the_short_limit() -> None:
    """20/minute + 5/3s, sliding window log: calls 1-5 pass, call 6 is refused by 5/3s with
    retry_after 3.0 while the minute limit still shows 15 remaining; 3 s later it passes."""
    key = Key(Rule("auth.create_token", ["20/minute", "5/3s"], "sliding_window_log"))
    minute, short = Limit.parse("20/minute"), Limit.parse("5/3s")

    for call in range(1, 6):
        decision = key.hit(T0)
        assert decision.allowed
        assert (20 - call, 5 - call) == decision.remaining_each
        assert 5 - call == decision.remaining
        assert 0.0 == decision.retry_after
        assert decision.denied_by is None

    sixth = key.hit(T0)
    assert not sixth.allowed
    assert short == sixth.denied_by
    assert 3.0 == sixth.retry_after
    assert 3 * S == sixth.retry_us
    assert 0 == sixth.remaining
    assert 3.0 == sixth.reset_after
    assert (minute, short) == tuple(s.limit for s in sixth.limits)
    assert (15, 0) == tuple(s.remaining for s in sixth.limits)
    assert (60.0, 3.0) == tuple(s.reset_after for s in sixth.limits)
    assert (False, True) == tuple(s.denied for s in sixth.limits)

    assert not key.peek(T0 + 3 * S - 1).allowed
    seventh = key.hit(T0 + 3 * S)
    assert seventh.allowed
    assert (14, 4) == seventh.remaining_each
    assert (60.0, 3.0) == tuple(s.reset_after for s in seventh.limits)


def test_auth_create_token_spread_calls_retry_when_the_first_leaves_the_window() -> None:
    """Five calls 0.5 s apart, the sixth at 2.5 s: retry_after is 0.5 s, when the first call
    (at 0 s) leaves the 3 s window; the refused call is not counted by either limit."""
    key = Key(Rule("auth.create_token", ["20/minute", "5/3s"], "sliding_window_log"))
    for i in range(5):
        assert key.hit(T0 + i * 500 * MS).allowed
    sixth = key.hit(T0 + 2500 * MS)
    assert not sixth.allowed
    assert 0.5 == sixth.retry_after
    assert (15, 0) == sixth.remaining_each
    again = key.hit(T0 + 3 * S)
    assert again.allowed
    assert (14, 0) == again.remaining_each
    assert 0.5 == key.hit(T0 + 3 * S).retry_after


# --------------------------------------------------------------------------- "1/3s" per algorithm


@pytest.mark.parametrize(
    ("algorithm", "retry_us", "reset_us"),
    [
        ("fixed_window", 3 * S, 3 * S),
        ("sliding_window_log", 3 * S, 3 * S),
        ("sliding_window_counter", 3 * S + 1, 3 * S + 1),
        ("token_bucket", 3 * S, 3 * S),
        ("gcra", 3 * S, 3 * S),
        ("leaky_bucket", 3 * S, 3 * S),
        ("concurrency", 3 * S, 3 * S),
    ],
)
def test_one_per_three_seconds_admits_one_then_refuses_until_retry(
    algorithm: str, retry_us: int, reset_us: int
) -> None:
    """ "1/3s": the first request passes (remaining 0), a second at the same instant is refused
    with retry_after 3 s, is still refused 1 µs before it and passes exactly then.

    The sliding window counter says 3 s + 1 µs: the previous window's request counts
    ``floor(1 * (3 s - elapsed) / 3 s)``, which is 0 from 1 µs into the next window.
    """
    key = Key(Rule("one", "1/3s", algorithm))
    first = key.hit(T0)
    assert (True, 0, 0.0, 0.0) == (first.allowed, first.remaining, first.retry_after, first.delay)
    assert (reset_us,) == first.reset_us

    second = key.hit(T0)
    assert not second.allowed
    assert Limit.parse("1/3s") == second.denied_by
    assert retry_us == second.retry_us
    assert retry_us / S == second.retry_after
    assert 0 == second.remaining

    assert not key.peek(T0 + retry_us - 1).allowed
    third = key.hit(T0 + retry_us)
    assert third.allowed
    assert 0 == third.remaining


def test_fixed_window_one_per_three_seconds_retries_at_the_window_boundary() -> None:
    """Fixed window "1/3s": a request 1 s into a window is refused again until the window
    ends (retry_after 2 s), so two requests can pass 2 s apart across the boundary."""
    key = Key(Rule("one", "1/3s", "fixed_window"))
    assert key.hit(T0 + 1 * S).allowed
    refused = key.hit(T0 + 1 * S)
    assert 2.0 == refused.retry_after
    assert 2.0 == refused.reset_after
    assert key.hit(T0 + 3 * S).allowed


def test_fixed_window_admits_up_to_twice_the_limit_around_a_boundary() -> None:
    """Fixed window "5/10s": 5 requests in the last µs of one window and 5 in the first µs
    of the next all pass: 10 in 2 µs, the documented boundary effect."""
    key = Key(Rule("fw", "5/10s", "fixed_window"))
    assert [True] * 5 == [key.hit(T0 + 10 * S - 1).allowed for _ in range(5)]
    assert not key.hit(T0 + 10 * S - 1).allowed
    assert [True] * 5 == [key.hit(T0 + 10 * S).allowed for _ in range(5)]
    assert 10.0 == key.peek(T0 + 10 * S).retry_after


def test_concurrency_one_per_three_seconds_passes_again_when_the_lease_is_released() -> None:
    """Concurrency "1/3s": a second acquire is refused while the first lease is held and
    passes at the same instant once that lease is released."""
    key = Key(Rule("one", "1/3s", "concurrency"))
    first = key.hit(T0)
    assert "lease-1" == first.lease_id
    assert not key.hit(T0 + S).allowed
    key.refund(T0 + S, lease_id="lease-1")
    assert key.hit(T0 + S).allowed


# --------------------------------------------------------------------------- sub-second periods


@pytest.mark.parametrize(
    ("algorithm", "retry_us", "last_reset_us", "delays_us"),
    [
        ("fixed_window", 100 * MS, 100 * MS, [0] * 10),
        ("sliding_window_log", 100 * MS, 100 * MS, [0] * 10),
        ("sliding_window_counter", 100 * MS + 1, 190 * MS + 1, [0] * 10),
        ("token_bucket", 10 * MS, 100 * MS, [0] * 10),
        ("gcra", 10 * MS, 100 * MS, [0] * 10),
        ("leaky_bucket", 10 * MS, 100 * MS, [i * 10 * MS for i in range(10)]),
        ("concurrency", 100 * MS, 100 * MS, [0] * 10),
    ],
)
def test_ten_per_hundred_milliseconds(algorithm: str, retry_us: int, last_reset_us: int, delays_us: list[int]) -> None:
    """ "10/100ms": ten requests at one instant pass (remaining 9..0), the eleventh is refused
    with a sub-second retry_after, never rounded to whole seconds.

    The windows wait for the whole 100 ms; the meters refill one unit per 10 ms; the leaky
    bucket delays the ten 10 ms apart; the counter needs 100 ms + 1 µs (the next window,
    where the ten count ``floor(10 * 99.999 / 100) = 9``) and is whole once they count 0.
    """
    key = Key(Rule("fast", "10/100ms", algorithm))
    decisions = [key.hit(T0) for _ in range(10)]
    assert [True] * 10 == [d.allowed for d in decisions]
    assert list(range(9, -1, -1)) == [d.remaining for d in decisions]
    assert delays_us == [d.delay_us for d in decisions]
    assert last_reset_us / S == decisions[-1].reset_after

    eleventh = key.hit(T0)
    assert not eleventh.allowed
    assert retry_us == eleventh.retry_us
    assert retry_us / S == eleventh.retry_after
    assert not key.peek(T0 + retry_us - 1).allowed
    assert key.peek(T0 + retry_us).allowed


# --------------------------------------------------------------------------- token bucket / GCRA


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
def test_bucket_burst_then_steady_refill(algorithm: str) -> None:
    """ "1/s" with burst 5: five requests pass at once (remaining 4..0, reset_after 1..5 s),
    the sixth waits 1 s; after 2.5 s two and a half tokens have refilled: cost 1 passes
    (remaining 1), cost 3 must wait 1.5 s more."""
    key = Key(Rule("api", "1/s", algorithm, burst=5))
    burst = [key.hit(T0) for _ in range(5)]
    assert [4, 3, 2, 1, 0] == [d.remaining for d in burst]
    assert [1.0, 2.0, 3.0, 4.0, 5.0] == [d.reset_after for d in burst]

    sixth = key.hit(T0)
    assert not sixth.allowed
    assert 1.0 == sixth.retry_after
    assert Limit(1, 1.0, 5) == sixth.denied_by

    one = key.hit(T0 + 2500 * MS)
    assert (True, 1, 3.5) == (one.allowed, one.remaining, one.reset_after)
    three = key.hit(T0 + 2500 * MS, cost=3)
    assert (False, 1, 1.5) == (three.allowed, three.remaining, three.retry_after)
    assert key.hit(T0 + 4 * S, cost=3).allowed


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
def test_bucket_reservation_waits_for_its_tokens(algorithm: str) -> None:
    """An empty "2/s" bucket (burst 2): ``acquire`` with max_wait 1 s reserves the next token
    (delay 0.5 s), the one after it (delay 1 s); a third would wait 1.5 s and is refused
    with retry_after 1.5 s (no reservation made); without max_wait it is simply refused."""
    key = Key(Rule("api", "2/s", algorithm))
    assert [True, True] == [key.hit(T0).allowed for _ in range(2)]
    first = key.hit(T0, max_wait=S)
    assert (True, 500 * MS, 0) == (first.allowed, first.delay_us, first.remaining)
    second = key.hit(T0, max_wait=S)
    assert (True, 1 * S) == (second.allowed, second.delay_us)
    third = key.hit(T0, max_wait=S)
    assert (False, 1.5) == (third.allowed, third.retry_after)
    assert 1.5 == key.peek(T0).retry_after
    assert 2.0 == key.peek(T0).reset_after
    assert key.hit(T0 + 1500 * MS).allowed


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
def test_bucket_refund_gives_the_tokens_back(algorithm: str) -> None:
    """A refund right after a charge restores the remaining; a refund never fills the bucket
    beyond its burst."""
    key = Key(Rule("api", "10/s", algorithm))
    assert 7 == key.hit(T0, cost=3).remaining
    key.refund(T0, cost=3)
    assert 9 == key.hit(T0).remaining
    key.refund(T0, cost=5)
    assert 10 == key.peek(T0, cost=0).remaining


def test_gcra_with_fractional_emission_interval_stays_exact() -> None:
    """ "3/10us" (an emission interval of 3⅓ µs), burst 3: after the burst, admissions come
    at +4, +7, +10 µs (the next whole µs at or after 10/3, 20/3, 30/3)."""
    key = Key(Rule("fine", "3/10us", "gcra"))
    assert [True, True, True, False] == [key.hit(T0).allowed for _ in range(4)]
    admitted = []
    for t in range(1, 11):
        if key.hit(T0 + t).allowed:
            admitted.append(t)
    assert [4, 7, 10] == admitted


# --------------------------------------------------------------------------- leaky bucket


def test_leaky_bucket_queues_with_delays_and_refuses_when_full() -> None:
    """ "1/s" with burst 3: four requests at once get delays 0, 1 and 2 s; the fourth finds
    the queue full and is refused with retry_after 1 s; at 1 s it passes with a 2 s delay."""
    key = Key(Rule("out", "1/s", "leaky_bucket", burst=3))
    first, second, third = (key.hit(T0) for _ in range(3))
    assert [0.0, 1.0, 2.0] == [d.delay for d in (first, second, third)]
    assert [2, 1, 0] == [d.remaining for d in (first, second, third)]
    assert [1.0, 2.0, 3.0] == [d.reset_after for d in (first, second, third)]

    fourth = key.hit(T0)
    assert not fourth.allowed
    assert 1.0 == fourth.retry_after
    assert Limit(1, 1.0, 3) == fourth.denied_by

    later = key.hit(T0 + S)
    assert (True, 2.0, 0) == (later.allowed, later.delay, later.remaining)


def test_leaky_bucket_spaces_requests_arriving_together() -> None:
    """ "5/s" (burst 5): five requests arriving together leave 200 ms apart; a request after
    the queue drained passes without delay."""
    key = Key(Rule("out", "5/s", "leaky_bucket"))
    assert [0, 200 * MS, 400 * MS, 600 * MS, 800 * MS] == [key.hit(T0).delay_us for _ in range(5)]
    assert 0 == key.hit(T0 + S).delay_us


def test_leaky_bucket_refuses_a_delay_longer_than_max_wait() -> None:
    """With room in the queue but a delay (2 s) longer than ``max_wait`` (1.5 s), the request
    is refused and nothing is queued; retry_after (0.5 s) is when the queue is short enough
    for that ``max_wait``: then it passes with a 1.5 s delay."""
    key = Key(Rule("out", "1/s", "leaky_bucket", burst=3))
    key.hit(T0)
    key.hit(T0)
    refused = key.hit(T0, max_wait=1500 * MS)
    assert (False, 0.5, 1) == (refused.allowed, refused.retry_after, refused.remaining)
    assert not key.peek(T0 + 500 * MS - 1, max_wait=1500 * MS).allowed
    later = key.hit(T0 + 500 * MS, max_wait=1500 * MS)
    assert (True, 1.5) == (later.allowed, later.delay)


def test_leaky_bucket_full_queue_and_long_delay_retry_after_covers_both() -> None:
    """Queue full (three 1 s slots queued at T0) and ``max_wait`` 0: the request needs both a
    free slot (after 1 s) and an empty queue (after 3 s), so retry_after is 3 s, and the
    retry at that time passes without delay.

    (This failed on an earlier src, where retry_after was 1.0, room in the queue only.)
    """
    key = Key(Rule("out", "1/s", "leaky_bucket", burst=3))
    for _ in range(3):
        key.hit(T0)
    refused = key.hit(T0, max_wait=0)
    assert not refused.allowed
    assert 3.0 == refused.retry_after
    assert not key.peek(T0 + refused.retry_us - 1, max_wait=0).allowed
    retried = key.peek(T0 + refused.retry_us, max_wait=0)
    assert (True, 0) == (retried.allowed, retried.delay_us)


# --------------------------------------------------------------------------- concurrency


def test_concurrency_leases_release_and_expiry() -> None:
    """ "2/10s": two leases fill the limit; a third acquire is refused with retry_after 8 s
    (when the oldest lease expires); releasing a lease admits it at once; a lease of a
    crashed holder frees itself 10 s after it was acquired."""
    key = Key(Rule("jobs", "2/10s", "concurrency"))
    a = key.hit(T0, lease_id="a")
    b = key.hit(T0 + 1 * S, lease_id="b")
    assert ("a", 1) == (a.lease_id, a.remaining)
    assert ("b", 0) == (b.lease_id, b.remaining)

    refused = key.hit(T0 + 2 * S, lease_id="c")
    assert (False, 8.0, None) == (refused.allowed, refused.retry_after, refused.lease_id)

    key.refund(T0 + 2 * S, lease_id="a")
    c = key.hit(T0 + 2 * S, lease_id="c")
    assert ("c", 0) == (c.lease_id, c.remaining)

    assert 0 == key.peek(T0 + 11 * S - 1, cost=0).remaining
    assert 1 == key.peek(T0 + 11 * S, cost=0).remaining  # b expired
    assert 2 == key.peek(T0 + 12 * S, cost=0).remaining  # c expired too


def test_concurrency_releasing_an_unknown_or_expired_lease_changes_nothing() -> None:
    """Releasing a lease that is not held leaves the other leases counted."""
    key = Key(Rule("jobs", "2/10s", "concurrency"))
    key.hit(T0, lease_id="a")
    key.refund(T0 + S, lease_id="nope")
    assert 1 == key.peek(T0 + S, cost=0).remaining


def test_concurrency_weighted_lease() -> None:
    """A lease of cost 2 under "3/10s" leaves 1; a second cost-2 lease waits for it."""
    key = Key(Rule("jobs", "3/10s", "concurrency"))
    assert 1 == key.hit(T0, cost=2, lease_id="big").remaining
    refused = key.hit(T0 + S, cost=2, lease_id="big2")
    assert (False, 9.0) == (refused.allowed, refused.retry_after)


# --------------------------------------------------------------------------- sliding window counter


def test_sliding_window_counter_weights_the_previous_window() -> None:
    """ "10/10s": 6 requests in one window; 2.5 s into the next they count
    ``floor(6 * 0.75) = floor(4.5) = 4``. Cost 5 passes (9, remaining 1), one more passes
    (10, remaining 0), the next is refused and passes once the previous window counts at
    most 3: ``6 * (10 s - e) < 4 * 10 s`` from e = 3 333 334 µs into the window
    (retry_after 0.833334 s)."""
    key = Key(Rule("api", "10/10s", "sliding_window_counter"))
    for _ in range(6):
        assert key.hit(T0 + 5 * S).allowed
    now = T0 + 12_500 * MS
    five = key.hit(now, cost=5)
    assert (True, 1) == (five.allowed, five.remaining)
    assert 15.500001 == five.reset_after  # the 5 count 0 from 8 s + 1 µs into the next window
    assert (True, 0) == (key.hit(now).allowed, key.peek(now, cost=0).remaining)

    one = key.hit(now)
    assert (False, 0, 833_334) == (one.allowed, one.remaining, one.retry_us)
    assert not key.peek(now + 833_333).allowed
    assert key.peek(now + 833_334).allowed


def test_sliding_window_counter_full_previous_window_readmits_one_per_tenth() -> None:
    """ "10/10s" with 10 requests in the previous window: at the start of the next one they
    count 10 and a request is refused; 1 µs later they count ``floor(9.999999) = 9`` and
    it passes; the previous window then frees one unit per second."""
    key = Key(Rule("api", "10/10s", "sliding_window_counter"))
    for _ in range(10):
        key.hit(T0)
    refused = key.hit(T0 + 10 * S)
    assert (False, 1) == (refused.allowed, refused.retry_us)
    assert key.hit(T0 + 11 * S).allowed
    assert not key.hit(T0 + 11 * S).allowed
    assert 0 == key.peek(T0 + 11 * S, cost=0).remaining
    assert 1 == key.peek(T0 + 12 * S, cost=0).remaining


def test_sliding_window_counter_reproduces_the_chapters_worked_example() -> None:
    """The system-design chapter's example (issue 9, item 7): limit 7 per minute, 5 requests
    in the previous minute, 3 in the current one; a request 30 % into the minute counts
    ``3 + 5 * 0.7 = 6.5``, rounded down to 6, and is admitted; the next is refused."""
    key = Key(Rule("chapter", "7/minute", "sliding_window_counter"))
    minute = 60 * S
    start = T0 - T0 % minute + minute  # a minute's first µs
    for _ in range(5):
        assert key.hit(start - minute).allowed
    for _ in range(3):  # 10 s in: the 5 count floor(5 * 50 / 60) = 4, so 4 + 3 <= 7
        assert key.hit(start + 10 * S).allowed
    at = start + 18 * S  # 30 % into the minute
    admitted = key.hit(at)
    assert (True, 0) == (admitted.allowed, admitted.remaining)
    assert not key.hit(at).allowed


def test_sliding_window_counter_forgets_windows_older_than_the_previous() -> None:
    """Two windows later the old counts no longer weigh: the full limit is available."""
    key = Key(Rule("api", "10/10s", "sliding_window_counter"))
    for _ in range(10):
        key.hit(T0)
    assert 10 == key.peek(T0 + 20 * S, cost=0).remaining


# --------------------------------------------------------------------------- capacities


@pytest.mark.parametrize("algorithm", ALL)
def test_cost_above_capacity_is_denied_with_infinite_retry(algorithm: str) -> None:
    """Cost 6 under "20/minute" + "5/3s" can never pass: retry_after is inf and denied_by is
    5/3s, the limit whose capacity it exceeds; nothing is charged."""
    key = Key(Rule("big", ["20/minute", "5/3s"], algorithm))
    decision = key.hit(T0, cost=6, max_wait=UNBOUNDED_WAIT)
    assert not decision.allowed
    assert math.inf == decision.retry_after
    assert INFINITE == decision.retry_us
    assert Limit.parse("5/3s") == decision.denied_by
    assert (False, True) == tuple(s.denied for s in decision.limits)
    assert key.hit(T0, cost=5).allowed


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "leaky_bucket"])
def test_burst_is_the_capacity_of_the_buckets(algorithm: str) -> None:
    """With burst 5 on "1/s", cost 5 passes at once and cost 6 is refused forever."""
    key = Key(Rule("b", "1/s", algorithm, burst=5))
    assert math.inf == key.peek(T0, cost=6).retry_after
    assert key.hit(T0, cost=5).allowed


@pytest.mark.parametrize("algorithm", ALL)
def test_cost_zero_is_admitted_and_charges_nothing(algorithm: str) -> None:
    """Cost 0 is admitted on a fresh key and leaves the full limit (a peek)."""
    key = Key(Rule("zero", "5/3s", algorithm))
    decision = key.hit(T0, cost=0)
    assert (True, 5, None) == (decision.allowed, decision.remaining, decision.lease_id)
    assert 5 == key.peek(T0, cost=0).remaining
