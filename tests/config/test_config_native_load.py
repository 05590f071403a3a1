"""A native-form file builds the same rules as code: equal ``Rule``s, equal decisions."""

from __future__ import annotations

import pytest

from conftest import WriteFile
from ratekeeper import Limit, Limiter, Rule
from ratekeeper.config import HttpRule, KeyTemplate, RuleSet, load_rules, parse_rules, rules_from
from ratekeeper.errors import ConfigurationError
from ratekeeper.quota import Quota
from ratekeeper.testing import FakeClock

FILE = """
version: 1
rules:
  - name: items.list
    match: {methods: [get], path: "/items/{user}"}
    key: "{path.user}"
    limits: ["3/2s"]
    algorithm: gcra
  - name: auth.create_token
    match: {methods: [POST], path: /auth/token, host: API.example.com}
    key: "{client_ip}"
    limits: ["20/minute", "5/3s"]
    algorithm: sliding_window_log
    on_error: deny
  - name: upload
    limits: 10 per 5 seconds
    algorithm: token_bucket
    burst: 4
    cost: "{header.X-Cost}"
    shadow: true
"""

CODE = [
    Rule("items.list", ["3/2s"], "gcra"),
    Rule("auth.create_token", ["20/minute", "5/3s"], "sliding_window_log", on_error="deny"),
    Rule("upload", ["10/5s"], "token_bucket", burst=4),
]


def test_file_rules_equal_the_same_rules_built_in_code(write: WriteFile) -> None:
    rules = load_rules(write(FILE))
    assert [r.rule for r in rules] == CODE
    assert [r.rule.burst for r in rules] == [None, None, 4]
    assert [r.rule.limits for r in rules] == [c.limits for c in CODE]


def test_file_fields_become_the_http_rule(write: WriteFile) -> None:
    path = write(FILE)
    items, auth, upload = load_rules(path)
    assert items.match.methods == frozenset({"GET"})
    assert items.match.match("GET", "/items/alice", None) == {"user": "alice"}
    assert items.match.match("POST", "/items/alice", None) is None
    assert items.key.render(lambda part, name: {"path": "alice"}.get(part)) == "alice"
    assert auth.match.hosts == frozenset({"api.example.com"})
    assert auth.match.match("POST", "/auth/token", "api.example.com:443") == {}
    assert isinstance(upload.cost, KeyTemplate) and upload.cost.parts == (("header", "x-cost"),)
    assert upload.shadow is True and items.shadow is False
    # no key: each client by its address (a request without one is not limited by the rule)
    assert upload.key.render(lambda part, name: {"client_ip": "10.0.0.7"}.get(part)) == "10.0.0.7"
    assert upload.key.render(lambda part, name: None) is None
    assert upload.key.is_default and upload.key.describe() == "client address (default)"
    assert (items.origin, auth.origin, upload.origin) == (f"{path}:3", f"{path}:8", f"{path}:14")


def test_file_rules_and_code_rules_decide_alike(write: WriteFile) -> None:
    rules = load_rules(write(FILE))
    clock = FakeClock()
    limiter = Limiter("memory://", clock=clock)
    for from_file, from_code in zip((r.rule for r in rules), CODE, strict=True):
        file_decisions, code_decisions = [], []
        for step in range(40):
            # Same state: reset between the two runs; same times: the fake clock.
            file_decisions.append(limiter.try_acquire(from_file, "k", 1, now=clock.now_us() + step * 250_000))
        limiter.reset(from_file, "k")
        for step in range(40):
            code_decisions.append(limiter.try_acquire(from_code, "k", 1, now=clock.now_us() + step * 250_000))
        assert [d.as_dict() for d in file_decisions] == [d.as_dict() for d in code_decisions]
        assert any(not d.allowed for d in file_decisions)
    limiter.close()


def test_file_rule_and_code_rule_share_state(write: WriteFile) -> None:
    """Equal rules are one rule to the store: the file's charge is seen through the code's rule."""
    (items, *_) = load_rules(write(FILE))
    limiter = Limiter("memory://", clock=FakeClock())
    for _ in range(3):
        assert limiter.try_acquire(items.rule, "bob")
    assert not limiter.try_acquire(CODE[0], "bob")
    limiter.close()


def test_a_single_limit_string_and_a_global_key(write: WriteFile) -> None:
    (rule,) = load_rules(write("rules:\n  - name: g\n    limits: 100/hour\n"))
    assert rule.rule == Rule("g", [Limit(100, 3600)])
    assert rule.key.source == "" and rule.match.paths == () and rule.cost == 1


def test_quota_by_dotted_path_and_by_mapping(write: WriteFile) -> None:
    rules = load_rules(
        write(
            """
            rules:
              - name: q1
                limits: [10/minute]
                quota: config_quota_provider:lookup
              - name: q2
                limits: [10/minute]
                quota: {provider: config_quota_provider.lookup, ttl: 30, max_keys: 5}
            """
        )
    )
    q1, q2 = (r.rule.quota for r in rules)
    assert isinstance(q1, Quota) and isinstance(q2, Quota)
    assert q1.provider("bob") == ["2/minute"] and q1.provider("admin") is None
    assert (q2.ttl, q2.max_keys) == (30.0, 5)


def test_cost_may_be_zero_or_a_template(write: WriteFile) -> None:
    text = (
        "rules:\n  - name: a\n    limits: [1/s]\n    cost: 0\n  - name: b\n    limits: [1/s]\n    cost: '{query.n}'\n"
    )
    a, b = load_rules(write(text))
    assert a.cost == 0
    assert isinstance(b.cost, KeyTemplate) and b.cost.needs == (("query", "n"),)


def test_yaml_anchors_and_merge_keys_read_as_safe_load_does(write: WriteFile) -> None:
    rules = load_rules(
        write(
            """
            rules:
              - &base {name: a, limits: [5/s], algorithm: fixed_window}
              - {<<: *base, name: b}
            """
        )
    )
    assert [r.rule for r in rules] == [Rule("a", ["5/s"], "fixed_window"), Rule("b", ["5/s"], "fixed_window")]


# -- warnings ---------------------------------------------------------------------------


def test_a_limit_that_can_never_bind_is_a_warning(write: WriteFile) -> None:
    path = write("rules:\n  - name: a\n    limits: [10/10s, 600/600s, 5/s]\n")
    rules = load_rules(path)
    assert rules.warnings == (
        f"{path}:3: warning: rule 'a': limit 600/10min can never bind beside 10/10s (it is redundant); remove it",
    )


def test_limits_that_can_each_bind_give_no_warning(write: WriteFile) -> None:
    assert load_rules(write("rules:\n  - name: a\n    limits: [20/minute, 5/3s]\n")).warnings == ()


def test_a_repeated_limit_warns_once(write: WriteFile) -> None:
    rules = load_rules(write("rules:\n  - name: a\n    limits: [5/s, 5/s]\n"))
    assert len(rules.warnings) == 1 and "limit 5/second can never bind beside 5/second" in rules.warnings[0]


@pytest.mark.parametrize(
    "match, message, matching",
    [
        ("{methods: []}", "can never match: its methods list is empty", ()),
        ("{methods: [FETCH]}", "can never match a standard request", ("FETCH",)),
        ("{path: []}", "can never match: its path list is empty", ()),
        ("{hosts: []}", "can never match: its hosts list is empty", ()),
        ("{methods: [GET, GTE]}", "GTE is not a standard HTTP method", ("GET", "GTE")),
    ],
)
def test_a_rule_that_can_never_match_is_a_warning(
    write: WriteFile, match: str, message: str, matching: tuple[str, ...]
) -> None:
    path = write(f"rules:\n  - name: a\n    match: {match}\n    limits: [1/s]\n")
    (rule,) = rules = load_rules(path)
    assert len(rules.warnings) == 1
    assert rules.warnings[0].startswith(f"{path}:3: warning: ") and message in rules.warnings[0]
    for method in ("GET", "POST", "FETCH", "GTE"):
        assert (rule.match.match(method, "/", "h") is not None) is (method in matching), method


# -- rules_from -------------------------------------------------------------------------


def test_rules_from_a_path_a_ruleset_and_code(write: WriteFile) -> None:
    path = write(FILE)
    from_path = rules_from(path)
    assert [r.name for r in from_path] == ["items.list", "auth.create_token", "upload"]
    assert rules_from(str(path)).rules == from_path.rules
    assert rules_from(from_path) is from_path
    code = rules_from([CODE[0], HttpRule(CODE[1], key=KeyTemplate.parse("{client_ip}"))])
    assert isinstance(code, RuleSet) and code.source == "<code>"
    assert code.rules[0] == HttpRule(CODE[0])
    # a bare Rule is keyed like a file's rule without key: by the client's address
    assert code.rules[0].key.render(lambda part, name: {"client_ip": "10.0.0.7"}.get(part)) == "10.0.0.7"
    assert code.rules[0].key.is_default
    assert code.rules[0].match.match("DELETE", "/anything", None) == {}
    assert code.rules[1].key.source == "{client_ip}"


def test_rules_from_a_bare_rule_and_code_warnings() -> None:
    rules = rules_from(Rule("r", ["10/10s", "600/600s"]))
    assert [r.name for r in rules] == ["r"]
    assert rules.warnings == ("<code>: warning: rule 'r': limit 600/10min can never bind beside 10/10s; remove it",)


def test_rules_from_refuses_duplicates_and_strangers() -> None:
    with pytest.raises(ConfigurationError, match="two rules are named 'r'"):
        rules_from([Rule("r", "1/s"), Rule("r", "2/s")])
    with pytest.raises(ConfigurationError, match="must be a Rule, an HttpRule or a mapping"):
        rules_from(["1/s"])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="a path to a rules file"):
        rules_from(42)  # type: ignore[arg-type]


def test_parse_rules_from_text_names_its_source() -> None:
    rules = parse_rules("rules:\n  - name: a\n    limits: [1/s]\n", "inline.yaml")
    assert rules.source == "inline.yaml" and rules.rules[0].origin == "inline.yaml:2"
