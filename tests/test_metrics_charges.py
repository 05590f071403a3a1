"""Charges without a check (``Limiter.charge``) and refunds in the Prometheus metrics: the
cost charged per rule, the charges that left a key in debt, the cost given back; labels
bounded like the decisions'; fallback charges counted as applied."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from ratekeeper import AsyncLimiter, Limiter, Rule
from ratekeeper.metrics import OTHER_RULE, Metrics
from ratekeeper.testing import FakeClock
from servers import free_port

TOKENS = Rule("tokens", "100/min", algorithm="token_bucket")
CHARGED = "ratekeeper_charged_cost_total"
DEBTS = "ratekeeper_debt_charges_total"
REFUNDED = "ratekeeper_refunded_cost_total"


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the text exposition (what a scraper reads), by name and labels."""
    body, _ = metrics.exposition()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def test_charges_their_cost_and_debts_are_counted_per_rule_in_the_exposition() -> None:
    metrics = Metrics()
    metrics.configured_rules([TOKENS])
    with Limiter("memory://", clock=FakeClock(), observer=metrics) as limiter:
        assert limiter.try_acquire(TOKENS, "user-1", 10).allowed
        assert 60 == limiter.charge(TOKENS, "user-1", 30).remaining  # within what was left
        assert -70 == limiter.charge(TOKENS, "user-1", 130).remaining  # past it: in debt
        assert -100 == limiter.charge(TOKENS, "user-1", 50).remaining  # deeper (one limit deep at most)
        assert not limiter.try_acquire(TOKENS, "user-1").allowed
    exposed = samples(metrics)
    rule = (("rule", "tokens"),)
    assert 210 == exposed[(CHARGED, rule)]
    assert 2 == exposed[(DEBTS, rule)]
    # A charge refuses nothing: it is not among the decisions.
    assert 1 == exposed[("ratekeeper_decisions_total", (("outcome", "within"), ("rule", "tokens")))]
    assert 1 == exposed[("ratekeeper_decisions_total", (("outcome", "over"), ("rule", "tokens")))]


def test_refunds_count_the_cost_given_back_and_lease_releases_do_not() -> None:
    slots = Rule("slots", "2/min", algorithm="concurrency")
    metrics = Metrics()
    metrics.configured_rules([TOKENS, slots])
    with Limiter("memory://", clock=FakeClock(), observer=metrics) as limiter:
        assert limiter.try_acquire(TOKENS, "user-1", 40).allowed
        assert limiter.refund(TOKENS, "user-1", 25)
        with limiter.lease(slots, "user-1"):
            pass
    assert 25 == metrics.value(REFUNDED, rule="tokens")
    assert metrics.value(REFUNDED, rule="slots") is None


def test_charges_of_rules_not_configured_count_under_other_and_keep_no_state_per_name() -> None:
    metrics = Metrics()
    metrics.configured_rules([TOKENS])
    with Limiter("memory://", clock=FakeClock(), observer=metrics) as limiter:
        for n in range(300):  # names a client made up
            made_up = Rule(f"made.up.{n}", "5/min", algorithm="token_bucket")
            limiter.charge(made_up, "k", 7)
            limiter.try_acquire(made_up, "k")
            limiter.refund(made_up, "k", 1)
        limiter.charge(TOKENS, "k", 1)
    assert 2100 == metrics.value(CHARGED, rule=OTHER_RULE)
    assert 300 == metrics.value(DEBTS, rule=OTHER_RULE)  # 7 charged to 5: two in debt each
    assert 300 == metrics.value(REFUNDED, rule=OTHER_RULE)
    assert 1 == metrics.value(CHARGED, rule="tokens")
    labels = {dict(labels).get("rule") for name, labels in samples(metrics) if name in (CHARGED, DEBTS, REFUNDED)}
    assert {"tokens", OTHER_RULE} == labels
    assert set(metrics._charge_children) == {"tokens"}
    assert not metrics._refund_children


def test_a_reload_that_drops_a_rule_moves_its_later_charges_to_other() -> None:
    metrics = Metrics()
    metrics.configured_rules([TOKENS])
    with Limiter("memory://", clock=FakeClock(), observer=metrics) as limiter:
        limiter.charge(TOKENS, "k", 5)
        metrics.configured_rules(["other"])
        limiter.charge(TOKENS, "k", 6)
    assert 5 == metrics.value(CHARGED, rule="tokens")
    assert 6 == metrics.value(CHARGED, rule=OTHER_RULE)


def test_a_charge_the_failure_policy_answers_is_counted_when_applied_and_not_when_denied() -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    allowing, denying = Rule("down.allow", "100/min", on_error="allow"), Rule("down.deny", "100/min", on_error="deny")
    metrics = Metrics()
    metrics.configured_rules([allowing, denying])
    with Limiter(down, timeout=0.5, breaker=False, observer=metrics) as limiter:
        after = limiter.charge(allowing, "k", 130)
        assert after.fallback == "allow" and after.remaining == -30
        refused = limiter.charge(denying, "k", 5)
        assert refused.fallback == "deny" and not refused.allowed
    assert 130 == metrics.value(CHARGED, rule="down.allow")
    assert 1 == metrics.value(DEBTS, rule="down.allow")
    assert 0 == metrics.value(CHARGED, rule="down.deny")  # the deny policy dropped it
    assert 2 == sum(
        v for (name, _), v in samples(metrics).items() if name == "ratekeeper_store_errors_total"
    )  # both failed calls counted


def test_the_asyncio_limiter_reports_charges_and_refunds_alike() -> None:
    metrics = Metrics()
    metrics.configured_rules([TOKENS])

    async def run() -> None:
        async with AsyncLimiter("memory://", clock=FakeClock(), observer=metrics) as limiter:
            await limiter.charge(TOKENS, "k", 150)
            await limiter.refund(TOKENS, "k", 20)

    asyncio.run(run())
    assert 150 == metrics.value(CHARGED, rule="tokens")
    assert 1 == metrics.value(DEBTS, rule="tokens")
    assert 20 == metrics.value(REFUNDED, rule="tokens")


def test_metrics_ask_the_limiter_for_no_key_unless_otel_records_them() -> None:
    assert Metrics().wants_keys is False
