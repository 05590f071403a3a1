"""Rules whose key an integration can never build, found from the rules alone (``ratekeeper.web.keyable``)."""

from __future__ import annotations

import logging
import re

import pytest

from ratekeeper.config import parse_rules
from ratekeeper.errors import ConfigurationError
from ratekeeper.web.keyable import (
    DJANGO_AUTH,
    NO_ROUTER,
    NO_SCOPE_USER,
    REMOTE_USER,
    KeyReport,
    Provides,
    Supply,
    django_user_lack,
    unkeyable,
)

WSGI = Provides("the WSGI middleware", {"route": NO_ROUTER, "user": REMOTE_USER})
RATEKEEPER = "ratekeeper.web.django.RateLimitMiddleware"


def rules(*keys: str | None) -> list:  # type: ignore[type-arg]
    """One rule per key (None: no key), named r0, r1, ..."""
    entries = [
        f"{{name: r{i}, limits: [5/s]" + ("" if k is None else f", key: '{k}'") + "}" for i, k in enumerate(keys)
    ]
    return list(parse_rules("rules: [" + ", ".join(entries) + "]", "rules.yaml"))


def found(keys: list[str | None], provides: Provides = WSGI) -> list[tuple[str, str, Supply]]:
    return [(u.rule.name, u.part, u.lack.supply) for u in unkeyable(rules(*keys), provides)]


def test_route_can_never_be_keyed_without_a_router_and_user_only_maybe() -> None:
    assert found(["{route}", "{user}", "x:{method}:{route}"]) == [
        ("r0", "route", Supply.NEVER),
        ("r1", "user", Supply.MAYBE),
        ("r2", "route", Supply.NEVER),
    ]


def test_parts_the_integration_provides_and_the_default_key_pass() -> None:
    assert found([None, "*", "{client_ip}", "{header.x-key}", "{header.a|query.q}", "{method}{host}"]) == []


def test_a_fallback_chain_is_as_good_as_its_best_alternative() -> None:
    assert found(["{route|client_ip}", "{user|client_ip}", "{route|header.x-key}"]) == []
    # none always there: the best of them is what is reported, with the whole chain
    assert found(["{route|user}"]) == [("r0", "route|user", Supply.MAYBE)]


def test_a_template_is_as_bad_as_its_worst_placeholder() -> None:
    assert found(["{user}:{route}"]) == [("r0", "route", Supply.NEVER)]


def test_everything_provided_finds_nothing() -> None:
    assert found(["{route}", "{user}"], Provides("an app with a router")) == []
    assert found(["{route}", "{user}"], WSGI.with_part("user").with_part("route")) == []


def test_the_message_names_the_rule_the_part_and_what_to_do() -> None:
    (u,) = unkeyable(rules("{route}"), WSGI)
    text = u.message(WSGI.integration)
    assert text.startswith("rules.yaml:1: rule 'r0': its key '{route}' needs {route}, which the WSGI middleware ")
    assert "can never provide (it has no router to ask which route matched), so the rule would limit no request" in text
    assert "'{route|client_ip}'" in text and "ratekeeper.web.flask.RateLimiter" in text
    (maybe,) = unkeyable(rules("{user}"), WSGI)
    assert "may not provide (it reads REMOTE_USER" in maybe.message(WSGI.integration)
    assert "give a user= callable" in maybe.message(WSGI.integration)


@pytest.mark.parametrize(
    ("middleware", "supply"),
    [
        ([DJANGO_AUTH, RATEKEEPER], None),  # the user is set before ratekeeper decides
        (["a.Session", DJANGO_AUTH, "b.Other", RATEKEEPER], None),
        ([RATEKEEPER], Supply.NEVER),  # nothing runs before it: nothing sets request.user
        ([RATEKEEPER, DJANGO_AUTH], Supply.NEVER),  # after it: too late
        (["myapp.HeaderUserMiddleware", RATEKEEPER], Supply.MAYBE),  # another middleware may set it
        (["myapp.HeaderUserMiddleware", RATEKEEPER, DJANGO_AUTH], Supply.MAYBE),
    ],
)
def test_django_user_comes_from_the_middleware_before_ratekeepers(middleware: list[str], supply: Supply | None) -> None:
    lack = django_user_lack(middleware)
    assert (None if lack is None else lack.supply) == supply
    if lack is not None:
        assert DJANGO_AUTH in lack.why and f"put {DJANGO_AUTH} before {RATEKEEPER}" in lack.remedy


def test_the_report_raises_at_start_and_logs_on_reload(caplog: pytest.LogCaptureFixture) -> None:
    report = KeyReport(WSGI, logging.getLogger("ratekeeper.test"))
    with pytest.raises(ConfigurationError, match=r"rule 'r0': its key '\{route\}' needs \{route\}"):
        report.check(rules("{route}"), at_start=True)
    with caplog.at_level(logging.WARNING, "ratekeeper.test"):
        report.check(rules("{route}", "{user}"), at_start=False)
        report.check(rules("{route}", "{user}"), at_start=False)  # a reload with the same rules
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(errors) == 2 and "(the rules were reloaded with it)" in errors[0].getMessage()
    assert len(warnings) == 1 and "rule 'r1'" in warnings[0].getMessage()  # once per rule


def test_a_part_found_missing_at_a_request_warns_once_per_rule(caplog: pytest.LogCaptureFixture) -> None:
    report = KeyReport(Provides("the ASGI middleware"), logging.getLogger("ratekeeper.test"))
    ruleset = rules("{user}", "{user|client_ip}", "u:{user}", "{client_ip}")
    report.check(ruleset, at_start=True)  # nothing known to be missing yet
    with caplog.at_level(logging.WARNING, "ratekeeper.test"):
        report.missing(ruleset, "user", NO_SCOPE_USER)
        report.missing(ruleset, "user", NO_SCOPE_USER)
    assert [re.findall(r"rule '(r\d)'", r.getMessage()) for r in caplog.records] == [["r0"], ["r2"]]
    assert "the first request's ASGI scope had no 'user'" in caplog.records[0].getMessage()
