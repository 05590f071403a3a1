"""The failure policy: what a limiter answers when its store fails.

A store raises ``StoreError`` (``StoreTimeout`` when it did not answer within its
``timeout``); a circuit breaker that is open raises ``CircuitOpen`` without calling it.
The limiters catch these around every store call and hand them to ``FailurePolicy``,
which answers by the rule's ``on_error`` (else the limiter's):

- ``"raise"`` (the default): the ``StoreError`` reaches the caller.
- ``"allow"`` (fail open): the decision a whole key would get, i.e. admitted with the
  limits' full ``remaining`` less the cost. A cost above a limit's capacity is still
  refused (``retry_after = inf``): no state of the store could admit it.
- ``"deny"`` (fail closed): refused, ``retry_after`` the breaker's remaining cool-down
  (its ``cool_down`` when it is not open), ``denied_by`` the rule's first limit.
- ``"local"``: decided by a private in-memory store with the same plan, so the rule's
  limits still hold, per process (N processes admit up to N times the limit while the
  store is down). Its state is dropped from use when the store answers again.

Every fallback decision has ``Decision.fallback`` set to the policy that answered. Refunds
and resets that fail raise under ``"raise"``; otherwise they are dropped (and also applied
to the local store under ``"local"``). Every failure is counted per rule, cause and
outcome, never per key (``FailureStats``), and feeds the circuit breaker, whose opening and
closing are logged at WARNING on the ``ratekeeper.store`` logger (not each request).

Sans-IO: the local store is in-process memory, so the same code serves ``Limiter`` and
``AsyncLimiter``.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.decision import Decision
from ratekeeper.errors import CircuitOpen, StoreError, StoreTimeout
from ratekeeper.limiter.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from ratekeeper.limiter.observer import Reports
from ratekeeper.op import CHARGE, DECIDE, Op
from ratekeeper.rule import POLICIES, check_policy

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.clock import Clock
    from ratekeeper.limiter.checks import Resolved
    from ratekeeper.limiter.observer import Observer
    from ratekeeper.stores.memory import MemoryStore

__all__ = ["CAUSES", "POLICIES", "FailurePolicy", "FailureStats", "check_policy"]

CAUSES = ("error", "timeout", "open")
"""Why a store call failed: it raised, it timed out, or the breaker did not call it."""

logger = logging.getLogger("ratekeeper.store")


def cause_of(exc: StoreError) -> str:
    """``"open"``, ``"timeout"`` or ``"error"``: the label a failure is counted under."""
    if isinstance(exc, CircuitOpen):
        return "open"
    return "timeout" if isinstance(exc, StoreTimeout) else "error"


class FailureStats:
    """What the failure policy did, counted per (rule, cause, outcome): never per key.

    ``cause`` is one of ``CAUSES``, ``outcome`` one of ``POLICIES``. Together with the
    breaker's ``state`` and ``transitions`` this is what a metrics exporter needs:
    ``snapshot()`` gives all of it as plain data.
    """

    __slots__ = ("_lock", "breaker", "counts")

    def __init__(self, breaker: CircuitBreaker) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, str, str]] = Counter()
        self.breaker = breaker

    def add(self, rule: str, cause: str, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.counts[rule, cause, outcome] += n

    def count(self, rule: str | None = None, *, cause: str | None = None, outcome: str | None = None) -> int:
        """The number of failed store calls answered, filtered by rule, cause and outcome."""
        with self._lock:
            items = list(self.counts.items())
        return sum(
            n
            for (r, c, o), n in items
            if (rule is None or r == rule) and (cause is None or c == cause) and (outcome is None or o == outcome)
        )

    def snapshot(self) -> dict[str, Any]:
        """``{"fallbacks": {(rule, cause, outcome): n}, "breaker": state, "transitions":
        {(old, new): n}}``: a consistent copy for exporters."""
        with self._lock:
            counts = dict(self.counts)
        return {
            "fallbacks": counts,
            "breaker": self.breaker.state,
            "transitions": dict(self.breaker.transitions),
        }

    def __repr__(self) -> str:
        return f"<FailureStats {sum(self.counts.values())} failures, breaker {self.breaker.state}>"


class FailurePolicy:
    """Answers for a store that failed, by ``on_error``; counts and feeds the breaker.

    ``store_name`` only names the store in log lines. The local store (``"local"``) is
    created on first use, on ``clock``.
    """

    def __init__(
        self,
        on_error: str,
        breaker: CircuitBreaker,
        clock: Clock,
        store_name: str = "store",
        observer: Observer | None = None,
    ) -> None:
        self.on_error = check_policy(on_error, "limiter")
        self.observer = observer
        self.reports = None if observer is None else Reports(observer)
        self.breaker = breaker
        self.clock = clock
        self.store_name = store_name
        self.stats = FailureStats(breaker)
        self._local: MemoryStore | None = None
        self._local_lock = threading.Lock()
        breaker.on_transition(self._log_transition)
        if observer is not None:
            breaker.on_transition(lambda old, new, _: observer.breaker_changed(old, new))

    @property
    def local(self) -> MemoryStore:
        """The private in-memory store of ``on_error="local"``."""
        local = self._local
        if local is None:
            from ratekeeper.stores.memory import MemoryStore

            with self._local_lock:
                if self._local is None:
                    self._local = MemoryStore(clock=self.clock)
                local = self._local
        return local

    def policy_for(self, rule: object) -> str:
        policy: str | None = getattr(rule, "on_error", None)
        return policy or self.on_error

    # -- one failed call each ---------------------------------------------------------------

    def decide(self, rule: object, op: Op, now: int | None, exc: StoreError) -> Decision:
        """The answer to a DECIDE or PEEK op (try_acquire, peek, acquire) whose store call failed."""
        policy = self.policy_for(rule)
        self._failed(op.plan.name, policy, exc)
        if policy == "local":
            decision = self.local.decide(op, now)
        elif policy == "allow":
            decision = self._allowed(op, now)
        else:
            decision = self._denied(op.plan)
        decision = decision.with_fallback(policy)
        reports = self.reports
        if reports is not None:
            if op.mode == DECIDE:
                reports.decided(decision, op.key)
            elif op.mode == CHARGE:
                reports.charge(decision, op.cost, op.key)
        return decision

    def decide_many(self, resolved: Resolved, exc: StoreError) -> tuple[Decision, ...]:
        """The answers to a batch whose store call failed, one per limited item, in order.

        Any item under ``"raise"`` raises; else any under ``"deny"`` refuses the batch (the
        other items say whether they alone would pass); else ``"local"`` items are decided
        as one batch on the local store and ``"allow"`` items are admitted. Each item is
        counted under the batch's outcome.
        """
        items = [(rule, op) for rule, op in resolved if op is not None]
        policies = [self.policy_for(rule) for rule, _ in items]
        outcome = "raise" if "raise" in policies else "deny" if "deny" in policies else None
        if not isinstance(exc, CircuitOpen):
            self.breaker.record_failure(exc)
        cause = cause_of(exc)
        for (_, op), policy in zip(items, policies, strict=True):
            self.stats.add(op.plan.name, cause, outcome or policy)
        if outcome == "raise":
            raise exc
        answers: list[Decision] = []
        if outcome == "deny":
            for (_, op), policy in zip(items, policies, strict=True):
                if policy == "deny":
                    decision = self._denied(op.plan)
                elif policy == "local":
                    decision = self.local.decide(Op.peek(op.plan, op.key, op.cost, op.lease_id))
                else:
                    decision = self._allowed(op, None)
                answers.append(decision.with_fallback("deny"))
            return self._observed(items, answers)
        local_ops = [op for (_, op), p in zip(items, policies, strict=True) if p == "local"]
        local = iter(self.local.decide_many(local_ops) if local_ops else ())
        for (_, op), policy in zip(items, policies, strict=True):
            decision = next(local) if policy == "local" else self._allowed(op, None)
            answers.append(decision.with_fallback(policy))
        return self._observed(items, answers)

    def refund(self, rule: object, op: Op, exc: StoreError) -> None:
        """A refund (or release) that failed: raised under ``"raise"``, else dropped; under
        ``"local"`` also given back to the local store, which may have charged it."""
        policy = self.policy_for(rule)
        self._failed(op.plan.name, policy, exc)
        if policy == "local":
            self.local.refund(op)

    def reset(self, rule: object, plan: Plan, key: str, exc: StoreError) -> None:
        """A reset that failed: raised under ``"raise"``, else dropped (and done locally)."""
        policy = self.policy_for(rule)
        self._failed(plan.name, policy, exc)
        if policy == "local":
            self.local.reset(plan, key)

    # -- internals -------------------------------------------------------------------------

    def _failed(self, rule: str, policy: str, exc: StoreError) -> None:
        if not isinstance(exc, CircuitOpen):
            self.breaker.record_failure(exc)
        self.stats.add(rule, cause_of(exc), policy)
        if policy == "raise":
            raise exc

    def _observed(self, items: Sequence[tuple[object, Op]], answers: list[Decision]) -> tuple[Decision, ...]:
        reports = self.reports
        if reports is not None:
            for (_, op), decision in zip(items, answers, strict=True):
                reports.decided(decision, op.key)
        return tuple(answers)

    def _allowed(self, op: Op, now: int | None) -> Decision:
        """What a whole key answers: admitted unless the cost exceeds a capacity (a charge
        without a check: admitted, as charged to a whole key)."""
        at = self.clock.now_us() if now is None else now
        if op.mode == CHARGE:
            return op.plan.algorithm.charge(op.plan, None, at, op.cost)[1]
        _, decision = op.plan.decide(None, at, op.cost, None, op.lease_id)
        return decision

    def _denied(self, plan: Plan) -> Decision:
        retry_us = max(1, round((self.breaker.remaining() or self.breaker.cool_down) * 1_000_000))
        n = len(plan.limits)
        return Decision.make(plan.name, plan.limits, False, 0, retry_us, 0, (0,) * n, (retry_us,) * n)

    def _log_transition(self, old: str, new: str, breaker: CircuitBreaker) -> None:
        if new == OPEN and old == CLOSED:
            logger.warning(
                "%s failing (%s): circuit breaker opened; the store is not called for %.3gs and "
                "on_error=%r answers (rules may override)",
                self.store_name,
                breaker.last_error,
                breaker.cool_down,
                self.on_error,
            )
        elif new == OPEN:
            logger.info(
                "%s still failing (%s): the probe failed, circuit open again", self.store_name, breaker.last_error
            )
        elif new == CLOSED:
            logger.warning("%s answers again: circuit breaker closed", self.store_name)
        elif new == HALF_OPEN:
            logger.debug("%s: circuit half-open, one probe call goes through", self.store_name)

    def __repr__(self) -> str:
        return f"<FailurePolicy on_error={self.on_error!r} {self.breaker!r}>"
