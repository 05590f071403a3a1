"""Fallback chains in key templates: ``{user|client_ip}`` is the first part the request has."""

from __future__ import annotations

import pytest

from ratekeeper.config import parse_rules
from ratekeeper.config.model import Fallback, KeyTemplate, PartLookup
from ratekeeper.errors import ConfigurationError


def lookup_of(values: dict[tuple[str, str | None], str]) -> PartLookup:
    return lambda part, name: values.get((part, name))


def test_a_chain_parses_into_its_alternatives_in_order() -> None:
    template = KeyTemplate.parse("u:{ user | header.X-Key | client_ip }")
    assert (
        "u:",
        Fallback((("user", None), ("header", "x-key"), ("client_ip", None))),
    ) == template.parts
    assert (("user", None), ("header", "x-key"), ("client_ip", None)) == template.needs


def test_the_first_part_the_request_has_renders() -> None:
    template = KeyTemplate.parse("{user|client_ip}")
    assert "alice" == template.render(lookup_of({("user", None): "alice", ("client_ip", None): "10.0.0.1"}))
    assert "10.0.0.1" == template.render(lookup_of({("client_ip", None): "10.0.0.1"}))


def test_an_empty_value_falls_through_to_the_next_part() -> None:
    template = KeyTemplate.parse("{user|client_ip}")
    assert "10.0.0.1" == template.render(lookup_of({("user", None): "", ("client_ip", None): "10.0.0.1"}))


def test_a_request_with_none_of_the_parts_is_not_keyed() -> None:
    assert KeyTemplate.parse("{user|header.x-key}").render(lookup_of({})) is None


def test_a_chain_sits_among_literal_text_and_other_parts() -> None:
    template = KeyTemplate.parse("{method}:{user|client_ip}")
    values: dict[tuple[str, str | None], str] = {("method", None): "GET", ("client_ip", None): "10.0.0.1"}
    assert "GET:10.0.0.1" == template.render(lookup_of(values))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{|}", "empty alternative in {|}"),
        ("{user|}", "empty alternative in {user|}"),
        ("{|client_ip}", "empty alternative"),
        ("{user||client_ip}", "empty alternative"),
        (
            "{user|clientip}",
            "unknown request part {clientip} in key template '{user|clientip}'; did you mean {client_ip}?",
        ),
        ("{user|header}", "did you mean {header.<name>}?"),
        ("{user|user}", "a part appears twice in {user|user}"),
    ],
)
def test_a_bad_chain_is_refused_naming_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        KeyTemplate.parse(text)
    assert message in str(caught.value)


def test_a_rules_file_accepts_a_chain_and_checks_every_path_alternative() -> None:
    rules = parse_rules(
        'version: 1\nrules:\n  - name: per-caller\n    limits: [10/minute]\n    key: "{user|client_ip}"\n'
    )
    assert Fallback((("user", None), ("client_ip", None))) == rules.rules[0].key.parts[0]
    with pytest.raises(ConfigurationError) as caught:
        parse_rules('version: 1\nrules:\n  - name: per-caller\n    limits: [10/minute]\n    key: "{user|path.org}"\n')
    assert "{path.org} but the rule's match has no path" in str(caught.value)
