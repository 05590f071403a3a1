"""A rule without ``key`` is keyed by the client's address; ``key: "*"`` is one global key."""

from __future__ import annotations

import pytest

from ratekeeper import Rule
from ratekeeper.cli.config import describe_http_rule
from ratekeeper.config import ConfigProblems, HttpRule, KeyTemplate, parse_rules, rules_from
from ratekeeper.config.model import CLIENT_ADDRESS_KEY, GLOBAL_KEY, PartLookup
from ratekeeper.errors import ConfigurationError


def lookup_of(values: dict[tuple[str, str | None], str]) -> PartLookup:
    return lambda part, name: values.get((part, name))


ALICE = lookup_of({("client_ip", None): "10.0.0.1"})
BOB = lookup_of({("client_ip", None): "10.0.0.2"})


def test_a_rule_without_key_is_keyed_by_the_client_address() -> None:
    (rule,) = parse_rules("rules: [{name: r, limits: [5/s]}]")
    assert rule.key is CLIENT_ADDRESS_KEY
    assert (rule.key.render(ALICE), rule.key.render(BOB)) == ("10.0.0.1", "10.0.0.2")
    # a request without an address (a Unix socket) is not limited by it, as with {client_ip}
    assert rule.key.render(lookup_of({})) is None
    assert rule.key.is_default and not rule.key.is_global


def test_the_default_renders_like_a_written_client_ip_but_reads_as_the_default() -> None:
    written = KeyTemplate.parse("{client_ip}")
    assert written.parts == CLIENT_ADDRESS_KEY.parts and written.render(ALICE) == CLIENT_ADDRESS_KEY.render(ALICE)
    assert not written.is_default
    assert (CLIENT_ADDRESS_KEY.describe(), written.describe()) == ("client address (default)", "{client_ip}")


@pytest.mark.parametrize("text", ['"*"', "'*'", '" * "'])
def test_star_is_one_key_for_every_request(text: str) -> None:
    (rule,) = parse_rules(f"rules: [{{name: r, key: {text}, limits: [5/s]}}]")
    assert rule.key is GLOBAL_KEY and rule.key.is_global
    assert rule.key.render(ALICE) == rule.key.render(BOB) == rule.key.render(lookup_of({})) == "*"
    assert rule.key.describe() == "global (*)"


def test_a_star_inside_a_longer_template_is_literal_text() -> None:
    template = KeyTemplate.parse("*:{client_ip}")
    assert not template.is_global
    assert (template.render(ALICE), template.render(BOB)) == ("*:10.0.0.1", "*:10.0.0.2")


def test_an_empty_key_is_refused_and_says_what_to_write() -> None:
    with pytest.raises(ConfigProblems) as err:
        parse_rules('rules: [{name: r, key: "", limits: [5/s]}]', "rules.yaml")
    (problem,) = err.value.problems
    assert "rules.yaml:1: an empty key template; leave the key out to key each client by its address, " in str(problem)
    assert "or write '*' for one key that every request shares" in str(problem)
    with pytest.raises(ConfigurationError, match="an empty key template"):
        KeyTemplate.parse("")


def test_an_empty_cost_is_refused_as_a_cost() -> None:
    with pytest.raises(ConfigProblems, match="cost is empty; write a number"):
        parse_rules('rules: [{name: r, cost: "", limits: [5/s]}]')


def test_a_key_of_literal_text_only_is_a_warning_pointing_at_star() -> None:
    rules = parse_rules("rules: [{name: r, key: everyone, limits: [5/s]}]", "rules.yaml")
    assert rules.rules[0].key.render(ALICE) == rules.rules[0].key.render(BOB) == "everyone"
    (warning,) = rules.warnings
    assert "rule 'r': key 'everyone' names no request part, so every request shares it; " in warning
    assert "write key: '*' for one global key" in warning


def test_star_and_the_default_warn_nothing() -> None:
    rules = parse_rules("rules: [{name: a, key: '*', limits: [5/s]}, {name: b, limits: [5/s]}]")
    assert rules.warnings == ()


def test_a_bare_rule_in_code_is_keyed_by_the_client_address_and_star_makes_it_global() -> None:
    per_client, everyone = rules_from(
        [Rule("per_client", ["5/s"]), HttpRule(Rule("everyone", ["5/s"]), key=KeyTemplate.parse("*"))]
    )
    assert per_client.key is CLIENT_ADDRESS_KEY and per_client == HttpRule(Rule("per_client", ["5/s"]))
    assert everyone.key is GLOBAL_KEY


def test_an_http_rule_in_code_takes_its_key_and_cost_as_text() -> None:
    everyone = HttpRule(Rule("everyone", ["5/s"]), key="*")
    assert everyone.key is GLOBAL_KEY
    priced = HttpRule(Rule("priced", ["5/s"]), key="{header.x-api-key|client_ip}", cost="{header.x-cost}")
    assert priced.key == KeyTemplate.parse("{header.x-api-key|client_ip}")
    assert priced.cost == KeyTemplate.parse("{header.x-cost}")
    assert priced.key.render(ALICE) == "10.0.0.1"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"key": 42}, "HttpRule 'r': key must be a key template text such as '{client_ip}', got 42"),
        ({"key": "{nope}"}, "unknown request part {nope}"),
        ({"cost": -1}, "HttpRule 'r': cost must be a whole number of at least 0"),
        ({"cost": True}, "HttpRule 'r': cost must be a whole number of at least 0"),
        ({"match": "/login"}, "HttpRule 'r': match must be a Match, got '/login'"),
    ],
)
def test_an_http_rule_in_code_with_a_wrong_field_fails_where_it_is_built(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpRule(Rule("r", ["5/s"]), **fields)  # type: ignore[arg-type]
    assert message in str(info.value)
    with pytest.raises(ConfigurationError, match="rule must be a Rule, got '5/s'"):
        HttpRule("5/s")  # type: ignore[arg-type]


def test_config_check_shows_the_default_and_the_global_key_plainly() -> None:
    rules = parse_rules("rules: [{name: a, key: '*', limits: [5/s]}, {name: b, limits: [5/s]}]")
    a, b = (describe_http_rule(r) for r in rules)
    assert "key=global (*) " in a
    assert "key=client address (default) " in b
