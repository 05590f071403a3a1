"""What errors, reprs and the command line say: a cost no limit can admit
explains itself, CLI errors come before any table and exit non-zero, an unreachable store
reads as English, the demo's quota warning goes through the ``ratekeeper`` logger with its
exception's type, ``bench <store> --help`` shows usage, an exempt key's decision shows
"unlimited", and a ``Lease`` has a readable repr."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import pytest

from ratekeeper import AsyncLimiter, Limiter, Quota, RateLimitExceeded, Rule
from ratekeeper.cli import main
from ratekeeper.config import ConfigProblems, parse_envoy
from ratekeeper.config.checks import unknown_unit
from ratekeeper.config.envoy import UNIT_SECONDS
from ratekeeper.errors import StoreError
from servers import free_port

NEVER = "cost 21 can never be admitted by 20/minute (capacity 20) of rule 'export'"


def test_a_cost_above_a_capacity_explains_itself_in_every_refusal_that_raises() -> None:
    rule = Rule("export", ["20/minute"])
    jobs = Rule("export", ["20/minute"], algorithm="concurrency")
    with Limiter() as limiter:
        with pytest.raises(RateLimitExceeded) as caught:
            limiter.acquire(rule, "k", 21)
        assert NEVER == str(caught.value)
        limited = limiter.limit(rule, key=lambda: "k", cost=21)(lambda: None)
        with pytest.raises(RateLimitExceeded, match=r"^cost 21 can never be admitted by 20/minute"):
            limited()
        with pytest.raises(RateLimitExceeded, match=r"^cost 21 can never be admitted by 20/minute"):
            limiter.lease(jobs, "k", 21).__enter__()
        # an ordinary refusal still says when to retry
        for _ in range(20):
            limiter.try_acquire(rule, "other")
        limited_other = limiter.limit(rule, key=lambda: "other")(lambda: None)
        with pytest.raises(RateLimitExceeded, match=r"rate limited by limit 20/minute .*retry after"):
            limited_other()

    async def main_() -> None:
        async with AsyncLimiter() as alimiter:
            with pytest.raises(RateLimitExceeded) as caught:
                await alimiter.acquire(rule, "k", 21)
            assert NEVER == str(caught.value)

    asyncio.run(main_())


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["-c", "21"], "cost 21 can never be admitted by 20/minute (capacity 20)"),
        (["--every", "5parsecs"], "unknown time unit 'parsecs' in '5parsecs'; accepted forms: \"3s\", \"100ms\""),
        (["--every", "soon"], "unknown time unit 'soon'"),
        (["-c", "-1"], "cost must be a non-negative integer, got -1"),
        (["-k", ""], "key must not be empty"),
        (["-n", "0"], "--repeat must be at least 1"),
    ],
)
def test_check_says_what_is_wrong_before_any_table_and_exits_non_zero(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert 2 == main(["check", "-l", "20/minute", "-n", "3", *args])
    out, err = capsys.readouterr()
    assert "" == out  # no table, not even its header
    assert says in err
    assert '20/minute", "5/3s"' not in err  # a duration's forms, never a limit's


def test_check_still_prints_its_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert 0 == main(["check", "-l", "20/minute", "-c", "20", "-n", "2"])
    out = capsys.readouterr().out
    assert "1 of 2 admitted" in out


@pytest.mark.redis
def test_an_unreachable_redis_reads_as_english() -> None:
    with (
        Limiter(f"redis://127.0.0.1:{free_port()}/0", on_error="raise", timeout=0.5) as limiter,
        pytest.raises(StoreError) as caught,
    ):
        limiter.try_acquire(Rule("r", ["1/s"]), "k")
    text = str(caught.value)
    assert text.startswith("Redis is unreachable for a decision: ")
    assert "(connecting)" not in text and "((" not in text


def test_the_demo_logs_the_quota_failure_through_the_ratekeeper_logger_with_its_type(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert 0 == main(["demo"])
    out, err = capsys.readouterr()
    assert "   log: WARNING ratekeeper.quota: quota provider failed for key 'nobody': KeyError: 'nobody'" in out
    assert "quota provider failed" not in err  # no stray line on stderr
    assert not logging.getLogger("ratekeeper").handlers  # the demo's handler is gone


def test_a_quota_providers_failure_is_logged_with_the_exceptions_type(caplog: pytest.LogCaptureFixture) -> None:
    def provider(key: str) -> list[str]:
        raise LookupError(key)

    quota = Quota(provider)
    try:
        with Limiter() as limiter, caplog.at_level(logging.WARNING, logger="ratekeeper"):
            limiter.try_acquire(Rule("api", ["5/minute"], quota=quota), "acme")
            assert quota.wait_idle(5.0)
    finally:
        quota.close()
    assert ["quota provider failed for key 'acme': LookupError: acme"] == [
        r.getMessage() for r in caplog.records if r.name == "ratekeeper.quota"
    ]


@pytest.mark.parametrize("store", ["memory", "redis", "postgres", "web", "serve"])
def test_bench_store_help_shows_usage_not_a_docstring(store: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "bench", store, "--help"], capture_output=True, text=True, check=False
    )
    assert 0 == result.returncode, result.stderr
    assert result.stdout.startswith(f"usage: ratekeeper bench {store}")
    assert "``" not in result.stdout  # reStructuredText of a module docstring
    assert "Benchmark " in result.stdout and "--markdown" in result.stdout
    assert len(result.stdout.splitlines()) < 60


def test_an_exempt_keys_decision_shows_unlimited() -> None:
    quota = Quota(lambda key: None)  # every key exempt
    rule = Rule("api", ["5/minute"], quota=quota)
    try:
        with Limiter() as limiter:
            limiter.try_acquire(rule, "admin")
            assert quota.wait_idle(5.0)
            decision = limiter.try_acquire(rule, "admin")
    finally:
        quota.close()
    assert decision.unlimited
    assert "<Decision 'api' allowed: unlimited>" == repr(decision)
    assert "9223372036854775807" not in repr(decision)
    doc = decision.as_dict()
    assert (None, True) == (doc["remaining"], doc["unlimited"])


def test_a_lease_has_a_readable_repr() -> None:
    jobs = Rule("jobs", ["4/5minutes"], algorithm="concurrency")
    with Limiter() as limiter:
        lease = limiter.lease(jobs, "tenant-1", 2)
        assert "<Lease 'jobs' key='tenant-1' cost=2: not acquired>" == repr(lease)
        with lease:
            assert repr(lease) == f"<Lease 'jobs' key='tenant-1' cost=2: held id={lease.id!r}>"
        assert repr(lease) == f"<Lease 'jobs' key='tenant-1' cost=2: released id={lease.id!r}>"


@pytest.mark.parametrize(
    ("unit", "message"),
    [
        (
            "minuet",
            "unknown unit 'minuet'; did you mean 'minute'? Accepted: second, minute, hour, day, week, month, year",
        ),
        ("Secnd", "unknown unit 'Secnd'; did you mean 'second'? Accepted: second, minute"),
        ("fortnight", "unknown unit 'fortnight'; accepted: second, minute, hour, day, week, month, year"),
        (3, "unit must be a text such as 'minute', got the number 3; accepted: second, minute"),
    ],
)
def test_an_unknown_envoy_unit_reads_as_english_with_a_did_you_mean(unit: object, message: str) -> None:
    """Not "unknown unit the text 'minuet'": the unit quoted once, the closest one offered."""
    assert unknown_unit(unit, UNIT_SECONDS).startswith(message)


def test_the_envoy_form_reports_a_misspelt_unit_with_unknown_unit() -> None:
    text = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minuet, requests_per_unit: 1}\n"
    with pytest.raises(ConfigProblems) as caught:
        parse_envoy(text, "rules.yaml")
    assert [f"rules.yaml:4: {unknown_unit('minuet', UNIT_SECONDS)}"] == list(caught.value.problems)
