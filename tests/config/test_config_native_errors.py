"""Every kind of problem of a native-form file is reported with its file and line, and all
problems of a file are reported together."""

from __future__ import annotations

import pytest

from conftest import WriteFile
from ratekeeper.config import ConfigProblems, load_rules
from ratekeeper.errors import ConfigurationError

CASES = {
    "yaml syntax": ("rules:\n  - name: a\n    limits: [1/s\n  - name: b\n", 4, "YAML syntax error"),
    "tab indentation": ("rules:\n\t- name: a\n", 2, "YAML syntax error"),
    "not a mapping": ("- a\n- b\n", 1, "must be a mapping with 'rules:'"),
    "empty file": ("", 1, "must be a mapping with 'rules:', got nothing"),
    "no rules key": ("version: 1\n", 1, "has no 'rules:' list"),
    "bad version": ("version: 2\nrules: []\n", 1, "version must be 1"),
    "unknown top field": (
        "rules: []\nrulez: []\n",
        2,
        "unknown field 'rulez' in the top level (did you mean 'rules'?)",
    ),
    "rules not a list": ("rules: {name: a}\n", 1, "rules must be a list of rules, got a mapping"),
    "rule not a mapping": ("rules:\n  - just-a-name\n", 2, "each rule must be a mapping"),
    "misspelled field": (
        "rules:\n  - name: a\n    limits: [1/s]\n    algoritm: gcra\n",
        4,
        "unknown field 'algoritm' in a rule (did you mean 'algorithm'?); accepted: name, match",
    ),
    "missing name": ("rules:\n  - limits: [1/s]\n", 2, "a rule needs a name"),
    "name not text": ("rules:\n  - name: 3\n    limits: [1/s]\n", 2, "name must be a non-empty text, got the number 3"),
    "duplicate name": (
        "rules:\n  - name: a\n    limits: [1/s]\n  - name: a\n    limits: [2/s]\n",
        4,
        "two rules are named 'a' (the other on line 2)",
    ),
    "duplicate yaml key": (
        "rules:\n  - name: a\n    limits: [1/s]\n    limits: [2/s]\n",
        4,
        "key 'limits' appears twice in one mapping (first on line 3)",
    ),
    "missing limits": ("rules:\n  - name: a\n", 2, "rule 'a' has no limits"),
    "empty limits": ("rules:\n  - name: a\n    limits: []\n", 3, "limits is empty"),
    "limits wrong type": ("rules:\n  - name: a\n    limits: 5\n", 3, "limits must be a limit such as '20/minute'"),
    "malformed limit": (
        "rules:\n  - name: a\n    limits:\n      - 1/s\n      - twenty per minute\n",
        5,
        "cannot parse limit 'twenty per minute'; accepted forms:",
    ),
    "unknown unit": ("rules:\n  - name: a\n    limits: [2/fortnight]\n", 3, "unknown time unit 'fortnight'"),
    "unknown algorithm": (
        "rules:\n  - name: a\n    limits: [1/s]\n    algorithm: token_buckt\n",
        4,
        "unknown algorithm 'token_buckt' (did you mean 'token_bucket'?); accepted: fixed_window",
    ),
    "bad on_error": (
        "rules:\n  - name: a\n    limits: [1/s]\n    on_error: alow\n",
        4,
        "on_error must be one of allow, deny, local, raise, got the text 'alow' (did you mean 'allow'?)",
    ),
    "burst on fixed window": (
        "rules:\n  - name: a\n    limits: [1/s]\n    algorithm: fixed_window\n    burst: 3\n",
        5,
        "burst does not apply to fixed_window; it applies to token_bucket, gcra, leaky_bucket",
    ),
    "burst not positive": ("rules:\n  - name: a\n    limits: [1/s]\n    burst: 0\n", 4, "burst must be a positive"),
    "shadow not bool": (
        "rules:\n  - name: a\n    limits: [1/s]\n    shadow: maybe\n",
        4,
        "shadow must be true or false",
    ),
    "negative cost": ("rules:\n  - name: a\n    limits: [1/s]\n    cost: -1\n", 4, "cost must be an integer >= 0"),
    "cost float": ("rules:\n  - name: a\n    limits: [1/s]\n    cost: 1.5\n", 4, "cost must be an integer >= 0"),
    "cost text without part": ("rules:\n  - name: a\n    limits: [1/s]\n    cost: '3'\n", 4, "names no request part"),
    "cost unknown part": (
        "rules:\n  - name: a\n    limits: [1/s]\n    cost: '{body.n}'\n",
        4,
        "unknown request part {body.n}",
    ),
    "key unknown part": (
        "rules:\n  - name: a\n    limits: [1/s]\n    key: '{ip}'\n",
        4,
        "unknown request part {ip} in key template '{ip}'; accepted: {client_ip}",
    ),
    "key misspelt part": (
        "rules:\n  - name: a\n    limits: [1/s]\n    key: 'org:{clientip}'\n",
        4,
        "unknown request part {clientip} in key template 'org:{clientip}'; did you mean {client_ip}? Accepted: "
        "{client_ip}, {user}",
    ),
    "key misspelt named part": (
        "rules:\n  - name: a\n    limits: [1/s]\n    key: '{headers.x-api-key}'\n",
        4,
        "unknown request part {headers.x-api-key} in key template '{headers.x-api-key}'; "
        "did you mean {header.x-api-key}?",
    ),
    "key named part without a name": (
        "rules:\n  - name: a\n    limits: [1/s]\n    key: '{query}'\n",
        4,
        "unknown request part {query} in key template '{query}'; did you mean {query.<name>}?",
    ),
    "cost misspelt part": (
        "rules:\n  - name: a\n    limits: [1/s]\n    cost: '{heder.x-cost}'\n",
        4,
        "did you mean {header.x-cost}?",
    ),
    "limit misspelt unit": (
        "rules:\n  - name: a\n    limits: [1/s, 2/minuet]\n",
        3,
        "unknown time unit 'minuet' in '2/minuet'; did you mean 'minute'? Accepted forms: ",
    ),
    "an Envoy file without domain": (
        "# the service's rules\ndescriptors:\n  - key: generic_key\n    value: default\n"
        "    rate_limit: {unit: second, requests_per_unit: 5}\n",
        2,
        "this file looks like the Envoy form (top-level 'descriptors') but has no 'domain:'; add domain: <name> "
        "at the top level (or write 'rules:' for the native form)",
    ),
    "key unbalanced": ("rules:\n  - name: a\n    limits: [1/s]\n    key: 'x{client_ip'\n", 4, "unbalanced brace"),
    "key not text": ("rules:\n  - name: a\n    limits: [1/s]\n    key: [a]\n", 4, "key must be a template text"),
    "path param without path": (
        "rules:\n  - name: a\n    limits: [1/s]\n    key: '{path.user}'\n",
        4,
        "key uses {path.user} but the rule's match has no path",
    ),
    "path param not in every path": (
        "rules:\n  - name: a\n    match: {path: ['/u/{user}', '/v/{id}']}\n    limits: [1/s]\n    key: '{path.user}'\n",
        5,
        "not every path of the rule's match has the parameter {user}; accepted here: none",
    ),
    "cost path param": (
        "rules:\n  - name: a\n    match: {path: '/u/{user}'}\n    limits: [1/s]\n    cost: '{path.n}'\n",
        5,
        "cost uses {path.n} but not every path",
    ),
    "match not mapping": ("rules:\n  - name: a\n    match: GET\n    limits: [1/s]\n", 3, "match must be a mapping"),
    "match unknown field": (
        "rules:\n  - name: a\n    match:\n      method: GET\n    limits: [1/s]\n",
        4,
        "unknown field 'method' in match (did you mean 'methods'?)",
    ),
    "bad path": ("rules:\n  - name: a\n    match: {path: items}\n    limits: [1/s]\n", 3, "a path must start with '/'"),
    "bad path param": (
        "rules:\n  - name: a\n    match:\n      path:\n        - /ok\n        - /x/{a-b}\n    limits: [1/s]\n",
        6,
        "bad path parameter {a-b}",
    ),
    "method not text": (
        "rules:\n  - name: a\n    match:\n      methods:\n        - GET\n        - 3\n    limits: [1/s]\n",
        6,
        "each of methods must be a text",
    ),
    "host and hosts": (
        "rules:\n  - name: a\n    match:\n      host: a.example\n      hosts: [b.example]\n    limits: [1/s]\n",
        5,
        "give host or hosts, not both",
    ),
    "quota bad import": (
        "rules:\n  - name: a\n    limits: [1/s]\n    quota: no_such_module_xyz:lookup\n",
        4,
        "cannot import quota provider 'no_such_module_xyz:lookup'",
    ),
    "quota missing attr": (
        "rules:\n  - name: a\n    limits: [1/s]\n    quota: config_quota_provider.nope\n",
        4,
        "has no 'nope'",
    ),
    "quota no provider": ("rules:\n  - name: a\n    limits: [1/s]\n    quota: {ttl: 3}\n", 4, "quota needs a provider"),
    "quota unknown option": (
        "rules:\n  - name: a\n    limits: [1/s]\n    quota:\n"
        "      provider: config_quota_provider:lookup\n      tll: 3\n",
        6,
        "unknown field 'tll' in quota (did you mean 'ttl'?)",
    ),
    "quota bad option": (
        "rules:\n  - name: a\n    limits: [1/s]\n    quota: {provider: config_quota_provider:lookup, ttl: -1}\n",
        4,
        "Quota ttl must be a positive number",
    ),
    "python tag refused": (
        "rules:\n  - name: !!python/name:os.system a\n    limits: [1/s]\n",
        2,
        "cannot read this value",
    ),
    "envoy file to native loader": ("domain: x\ndescriptors: []\n", 1, "this file has the Envoy form"),
}


@pytest.mark.parametrize("text, line, message", CASES.values(), ids=CASES.keys())
def test_each_problem_names_its_file_and_line(write: WriteFile, text: str, line: int, message: str) -> None:
    path = write(text)
    with pytest.raises(ConfigProblems) as info:
        load_rules(path)
    assert any(p.startswith(f"{path}:{line}: ") and message in p for p in info.value.problems), info.value.problems


def test_every_problem_of_a_file_is_reported_in_line_order(write: WriteFile) -> None:
    path = write(
        """
        rules:
          - name: a
            limts: [1/s]
          - name: b
            limits: [1/s, 2/fortnight]
            algorithm: gcr
            on_error: never
          - name: a
            limits: [1/s]
        """
    )
    with pytest.raises(ConfigProblems) as info:
        load_rules(path)
    lines = [int(p.split(":")[1]) for p in info.value.problems]
    assert lines == [2, 3, 5, 6, 7, 8]
    assert str(info.value).startswith(f"{path}: 6 problems\n")
    assert all(p in str(info.value) for p in info.value.problems)


def test_config_problems_is_a_configuration_error(write: WriteFile) -> None:
    with pytest.raises(ConfigurationError):
        load_rules(write("rules: 3\n"))


def test_a_missing_file_is_a_problem_not_a_crash(write: WriteFile) -> None:
    path = write("rules: []\n").with_name("absent.yaml")
    with pytest.raises(ConfigProblems, match="cannot read the rules file"):
        load_rules(path)
