"""Django's ``settings.RATEKEEPER["rules"]`` may hold the rules file's entries as dicts:
read when the middleware starts, a problem named by the setting and the rule's index."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from ratekeeper.config import RuleSet
from ratekeeper.errors import ConfigurationError


@pytest.fixture
def settings_options(monkeypatch: pytest.MonkeyPatch) -> Callable[[object], dict[str, Any]]:
    pytest.importorskip("django")
    from ratekeeper.web.django import settings_options

    def with_rules(rules: object) -> dict[str, Any]:
        conf = {"rules": rules, "store": "memory://"}
        monkeypatch.setattr("django.conf.settings", SimpleNamespace(RATEKEEPER=conf))
        return settings_options()

    return with_rules


def test_dict_rules_become_the_rules_a_file_would_give(settings_options: Callable[[object], dict[str, Any]]) -> None:
    options = settings_options([{"name": "login", "match": {"path": "/login", "methods": ["POST"]}, "limits": ["5/m"]}])
    rules = options["rules"]
    assert isinstance(rules, RuleSet)
    assert [(r.name, r.origin) for r in rules] == [("login", "settings.RATEKEEPER['rules'][0]")]
    assert rules.rules[0].match.match("POST", "/login", None) == {}
    assert rules.rules[0].match.match("GET", "/login", None) is None


def test_a_wrong_dict_rule_fails_the_start_naming_the_setting(
    settings_options: Callable[[object], dict[str, Any]],
) -> None:
    with pytest.raises(ConfigurationError, match=r"settings\.RATEKEEPER\['rules'\]\[1\]: unknown field 'limit'"):
        settings_options([{"name": "a", "limits": ["1/s"]}, {"name": "b", "limit": ["1/s"]}])
