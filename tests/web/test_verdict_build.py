"""The core's cheaper constructions are the public ones.

``new_verdict`` and ``new_charge`` build a ``Verdict`` / ``Charge`` without the frozen
dataclass's ``__init__``: the objects must be the constructors' (same class, fields,
equality, hash, repr, still frozen). ``problem_body`` builds a one-rule refusal from the
parts of the body that do not change with the retry time: its bytes must be the document's
JSON whatever the rule's name, limits, retry time and status, and follow a rule reloaded
under the same name with other limits.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from ratekeeper import Limiter, Rule
from ratekeeper.decision import Decision
from ratekeeper.testing import FakeClock
from ratekeeper.web.problem import problem, problem_body
from ratekeeper.web.request import Charge, Verdict, new_charge, new_verdict


def _refused(rule: Rule, cost: int = 1) -> Decision:
    limiter = Limiter("memory://", clock=FakeClock())
    for _ in range(max(limit.count for limit in rule.limits) + 1):
        decision = limiter.try_acquire(rule, "k", cost)
        if not decision.allowed:
            return decision
    raise AssertionError("the rule never refused")


def test_a_built_charge_is_the_constructed_one() -> None:
    rule = Rule("r", ["1/second"])
    for lease in (None, "lease-1"):
        built, made = new_charge(rule, "k", 3, lease), Charge(rule, "k", 3, lease)
        assert type(built) is Charge
        assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
        assert [getattr(built, f.name) for f in dataclasses.fields(built)] == [rule, "k", 3, lease]
        with pytest.raises(dataclasses.FrozenInstanceError):
            built.cost = 0  # type: ignore[misc]
    assert new_charge(rule, "k", 3, None) != new_charge(rule, "k", 4, None)


@pytest.mark.parametrize("allowed", [True, False])
def test_a_built_verdict_is_the_constructed_one(allowed: bool) -> None:
    rule = Rule("r", ["1/second"])
    decision = _refused(rule)
    charges = (new_charge(rule, "k", 1, None),) if allowed else ()
    args = (allowed, (("RateLimit", "x"),), 200 if allowed else 429, b"" if allowed else b"{}")
    built = new_verdict(*args, (decision,), (), charges, ("skipped",), (rule,))
    made = Verdict(*args, (decision,), (), charges, ("skipped",), rules=(rule,))
    assert type(built) is Verdict
    assert built == made and hash(built) == hash(made) and repr(built) == repr(made)
    assert built.enforced == made.enforced and built.denied == made.denied and not built.exempt
    assert dataclasses.replace(built, status=503) == dataclasses.replace(made, status=503)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.allowed = not allowed  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del built.body  # type: ignore[misc]


def _json(denied: list[Decision], retry_after: int | None, status: int) -> bytes:
    return json.dumps(problem(denied, retry_after, status), separators=(",", ":")).encode()


@pytest.mark.parametrize("name", ["bench", "it's", 'a "quoted" \\ name', "naïve-ünïcode", "emoji-😀", "tab\there"])
@pytest.mark.parametrize("limits", [["1/hour"], ["3/second", "5/minute"], ["2/100ms", "3/100ms"]])
def test_a_one_rule_refusal_body_is_the_documents_json(name: str, limits: list[str]) -> None:
    decision = _refused(Rule(name, limits))
    for status in (429, 403):
        for retry_after in (0, 1, 59, 3600, 10**12, None):
            body = problem_body([decision], retry_after, status)
            assert body == _json([decision], retry_after, status)
            assert problem_body([decision], retry_after, status) == body  # the remembered parts
            assert json.loads(body)["retry_after"] == retry_after


def test_a_rule_reloaded_with_other_limits_under_its_name_gets_its_new_body() -> None:
    before = _refused(Rule("login", ["1/minute"]))
    after = _refused(Rule("login", ["2/hour"]))
    assert problem_body([before], 5) == _json([before], 5, 429)
    assert problem_body([after], 5) == _json([after], 5, 429)
    assert problem_body([after], 5) != problem_body([before], 5)


def test_a_refusal_by_several_rules_is_the_documents_json() -> None:
    denied = [_refused(Rule("a", ["1/second"])), _refused(Rule("b", ["1/minute", "5/hour"]))]
    assert problem_body(denied, 7) == _json(denied, 7, 429)
    assert json.loads(problem_body(denied, 7))["violated-policies"] == ["a", "b.60s"]
