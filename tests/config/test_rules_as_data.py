"""Rules given in code as the rules file's entries (Python dicts and lists) build the
same ``HttpRule``s the file would, through the same checks, with problems named by the
rule's index in its list."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from config.test_config_native_load import FILE
from ratekeeper import Rule
from ratekeeper.config import ConfigProblems, HttpRule, parse_rules, rules_from
from ratekeeper.config.native import rules_of_data
from ratekeeper.errors import ConfigurationError


def without_origin(rules: object) -> list[HttpRule]:
    return [dataclasses.replace(r, origin="") for r in rules]  # type: ignore[attr-defined]


def test_a_files_entries_as_data_build_the_files_rules() -> None:
    document = yaml.safe_load(FILE)
    from_file = parse_rules(FILE)
    assert without_origin(rules_from(document["rules"])) == without_origin(from_file)
    assert without_origin(rules_from(document)) == without_origin(from_file)  # the whole document
    assert [r.origin for r in rules_from(document["rules"])] == ["<code>[0]", "<code>[1]", "<code>[2]"]


def test_data_and_code_rules_mix_in_their_order() -> None:
    rules = rules_from(
        [
            Rule("first", ["1/s"]),
            {"name": "second", "limits": ["2/minute"], "key": "*"},
            HttpRule(Rule("third", "3/s")),
        ],
        source="settings.RATEKEEPER['rules']",
    )
    assert [r.name for r in rules] == ["first", "second", "third"]
    assert rules.rules[1].key.source == "*"
    assert rules.rules[1].origin == "settings.RATEKEEPER['rules'][1]"
    assert rules.source == "settings.RATEKEEPER['rules']"


def test_every_problem_is_named_by_its_rules_index_in_the_whole_list() -> None:
    with pytest.raises(ConfigProblems) as info:
        rules_from(
            [
                Rule("ok", ["1/s"]),
                {"name": "fine", "limits": ["5/minute"]},
                {"limits": ["5/fortnight"], "kee": "{client_ip}"},
                {"name": "typo", "limits": "3/s", "match": {"path": "/x", "mehtods": ["GET"]}},
            ],
            source="app.config['RATEKEEPER_RULES']",
        )
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert all(p.startswith("app.config['RATEKEEPER_RULES'][2]: ") for p in problems[:3]), problems
    assert "did you mean 'key'?" in problems[0] + problems[1] + problems[2]
    assert "a rule needs a name" in " ".join(problems[:3])
    assert "'fortnight'" in " ".join(problems[:3])
    assert problems[3].startswith("app.config['RATEKEEPER_RULES'][3]: ") and "did you mean 'methods'?" in problems[3]


def test_a_document_that_is_not_a_rules_document_says_so_without_an_index() -> None:
    with pytest.raises(ConfigProblems) as info:
        rules_of_data({"rules": 3}, source="RATEKEEPER")
    assert info.value.problems == ("RATEKEEPER: rules must be a list of rules, got the number 3",)
    with pytest.raises(ConfigProblems, match=r"RATEKEEPER\[0\]: each rule must be a mapping"):
        rules_of_data({"rules": ["1/s"]}, source="RATEKEEPER")


def test_names_are_unique_across_data_and_code_rules() -> None:
    with pytest.raises(ConfigProblems, match=r"<code>\[1\]: two rules are named 'a'"):
        rules_from([{"name": "a", "limits": ["1/s"]}, {"name": "a", "limits": ["2/s"]}])
    with pytest.raises(ConfigurationError, match="two rules are named 'a'"):
        rules_from([Rule("a", ["1/s"]), {"name": "a", "limits": ["2/s"]}])


def test_a_data_rules_redundant_limit_is_a_warning_with_its_index() -> None:
    rules = rules_from([Rule("x", ["1/s"]), {"name": "a", "limits": ["2/minute", "1/minute"]}])
    assert rules.warnings == (
        "<code>[1]: warning: rule 'a': limit 2/minute can never bind beside 1/minute (it is redundant); remove it",
    )
