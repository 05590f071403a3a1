"""The Envoy form: matching case by case as Envoy's rate-limit service does, the rules it
builds, and its problems with their lines."""

from __future__ import annotations

import pytest

from conftest import WriteFile
from ratekeeper import Limit, Limiter, Rule
from ratekeeper.config import ConfigProblems, EnvoyConfig, load_any, load_envoy, parse_envoy
from ratekeeper.config.envoy import UNIT_SECONDS
from ratekeeper.testing import FakeClock

CONFIG = """
domain: edge
descriptors:
  - key: message_type
    value: marketing
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_number}
    descriptors:
      - key: msg
        value: "hi*"
        rate_limit: {unit: hour, requests_per_unit: 1, replaces: [{name: per_number}]}
      - key: msg
        value: "h*"
        rate_limit: {unit: hour, requests_per_unit: 7}
      - key: msg
        value: hello
        rate_limit: {unit: hour, requests_per_unit: 3}
      - key: msg
        rate_limit: {unit: hour, requests_per_unit: 9}
  - key: user
    value: admin
  - key: user
    value: vip
    rate_limit: {unlimited: true}
  - key: user
    detailed_metric: true
    rate_limit: {limits: ["1/s", "100/hour"], algorithm: gcra, burst: 3}
  - key: remote_address
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /api
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: week, requests_per_unit: 50}
"""


@pytest.fixture
def config() -> EnvoyConfig:
    return parse_envoy(CONFIG, "envoy.yaml")


def _rule_name(config: EnvoyConfig, entries: list[tuple[str, str]]) -> str | None:
    limit = config.resolve(entries)
    return None if limit is None or limit.rule is None else limit.rule.name


def test_an_exact_value_matches_only_itself(config: EnvoyConfig) -> None:
    limit = config.resolve([("message_type", "marketing")])
    assert limit is not None and limit.rule == Rule("edge.message_type_marketing", [Limit(5, 86_400)], "fixed_window")
    assert limit.key == "message_type_marketing"
    assert config.resolve([("message_type", "transactional")]) is None


def test_a_value_less_key_gives_each_value_its_own_bucket(config: EnvoyConfig) -> None:
    a, b = config.resolve([("to_number", "111")]), config.resolve([("to_number", "222")])
    assert a is not None and b is not None
    # the YAML name is a label; the rule (the state's identity) is named by the descriptor path
    assert a.rule is b.rule and a.rule is not None and a.rule.name == "edge.to_number"
    assert a.name == "per_number"
    assert (a.key, b.key) == ("to_number_111", "to_number_222")
    limiter = Limiter("memory://", clock=FakeClock())
    assert [bool(limiter.try_acquire(a.rule, a.key)) for _ in range(3)] == [True, True, False]
    assert b.rule is not None
    assert limiter.try_acquire(b.rule, b.key)  # the other value's bucket is untouched
    limiter.close()


def test_nested_descriptors_most_specific_wins(config: EnvoyConfig) -> None:
    """Exact value before wildcard before value-less; among wildcards the first declared."""
    assert _rule_name(config, [("to_number", "1"), ("msg", "hello")]) == "edge.to_number.msg_hello"
    assert _rule_name(config, [("to_number", "1"), ("msg", "hiya")]) == "edge.to_number.msg_hi*"
    assert _rule_name(config, [("to_number", "1"), ("msg", "hey")]) == "edge.to_number.msg_h*"
    assert _rule_name(config, [("to_number", "1"), ("msg", "yo")]) == "edge.to_number.msg"
    limit = config.resolve([("to_number", "1"), ("msg", "hiya")])
    assert limit is not None and limit.key == "to_number_1.msg_hiya"


def test_a_limit_applies_only_at_the_depth_of_the_request(config: EnvoyConfig) -> None:
    # Deeper than the tree: no limit (not even the parent's).
    assert config.resolve([("user", "bob"), ("extra", "x")]) is None
    # Shallower than the node with the limit: no limit.
    assert config.resolve([("path", "/api")]) is None
    assert _rule_name(config, [("path", "/api"), ("method", "GET")]) == "edge.path_/api.method_GET"
    assert config.resolve([("path", "/api"), ("method", "POST")]) is None
    assert config.resolve([("unknown", "x")]) is None
    assert config.resolve([]) is None


def test_a_value_without_rate_limit_is_exempt(config: EnvoyConfig) -> None:
    assert config.resolve([("user", "admin")]) is None
    assert _rule_name(config, [("user", "bob")]) == "edge.user"


def test_unlimited_matches_without_a_rule(config: EnvoyConfig) -> None:
    limit = config.resolve([("user", "vip")])
    assert limit is not None and limit.unlimited and limit.rule is None
    assert limit.descriptor == "edge.user_vip"


def test_flags_shadow_mode_and_detailed_metric(config: EnvoyConfig) -> None:
    shadow = config.resolve([("remote_address", "10.0.0.1")])
    assert shadow is not None and shadow.shadow and not shadow.detailed_metric
    assert shadow.metric_key == "edge.remote_address"
    detailed = config.resolve([("user", "bob")])
    assert detailed is not None and detailed.detailed_metric and not detailed.shadow
    assert detailed.metric_key == "edge.user_bob"


def test_ratekeeper_fields_inside_rate_limit(config: EnvoyConfig) -> None:
    limit = config.resolve([("user", "bob")])
    assert limit is not None and limit.rule == Rule("edge.user", ["1/s", "100/hour"], "gcra", burst=3)
    assert limit.rule.burst == 3


def test_replaces_drops_the_named_limit_of_the_same_request(config: EnvoyConfig) -> None:
    limit = config.resolve([("to_number", "1"), ("msg", "hiya")])
    assert limit is not None and limit.replaces == ("per_number",)
    found = config.resolve_all([[("to_number", "1")], [("to_number", "1"), ("msg", "hiya")], [("user", "bob")]])
    assert found[0] is None
    assert [f.descriptor if f else None for f in found] == [None, "edge.to_number.msg_hi*", "edge.user"]
    # Without the replacing descriptor the named limit applies.
    (alone,) = config.resolve_all([[("to_number", "1")]])
    assert alone is not None and alone.name == "per_number"


def test_rules_and_nodes_in_file_order(config: EnvoyConfig) -> None:
    assert [n.descriptor for n in config.nodes] == [
        "edge.message_type_marketing",
        "edge.to_number",
        "edge.to_number.msg_hi*",
        "edge.to_number.msg_h*",
        "edge.to_number.msg_hello",
        "edge.to_number.msg",
        "edge.user_vip",
        "edge.user",
        "edge.remote_address",
        "edge.path_/api.method_GET",
    ]
    assert len(config.rules) == 9 and all(isinstance(r, Rule) for r in config.rules)
    assert config.domain == "edge" and config.warnings == ()


@pytest.mark.parametrize("unit", ["second", "minute", "hour", "day", "week", "month", "year", "DAY"])
def test_units_second_to_year_use_envoys_dividers(unit: str) -> None:
    config = parse_envoy(
        f"domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: {unit}, requests_per_unit: 4}}\n"
    )
    (rule,) = config.rules
    assert rule.limits == (Limit(4, UNIT_SECONDS[unit.lower()]),)
    assert UNIT_SECONDS["month"] == 30 * 86_400 and UNIT_SECONDS["year"] == 365 * 86_400


def test_a_fixed_window_decides_like_envoy_a_window_per_unit() -> None:
    config = parse_envoy("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
    limit = config.resolve([("k", "v")])
    assert limit is not None and limit.rule is not None
    clock = FakeClock(start_us=60_000_000 * 1000)  # the start of a minute
    limiter = Limiter("memory://", clock=clock)
    assert [bool(limiter.try_acquire(limit.rule, limit.key)) for _ in range(3)] == [True, True, False]
    clock.advance(59.9)
    assert not limiter.try_acquire(limit.rule, limit.key)
    clock.advance(0.1)  # the next window
    assert limiter.try_acquire(limit.rule, limit.key)
    limiter.close()


def test_load_envoy_and_load_any_tell_the_forms_apart(write: WriteFile) -> None:
    envoy_path = write(CONFIG, "envoy.yaml")
    native_path = write("rules:\n  - name: a\n    limits: [1/s]\n", "native.yaml")
    assert isinstance(load_envoy(envoy_path), EnvoyConfig)
    assert isinstance(load_any(envoy_path), EnvoyConfig)
    assert [r.name for r in load_any(native_path)] == ["a"]  # type: ignore[union-attr]


ERRORS = {
    "empty domain": ("domain: ''\ndescriptors: []\n", 1, "domain must be a non-empty text"),
    "no domain key": (
        "descriptors: []\ndomian: x\n",
        2,
        "unknown field 'domian' in the top level (did you mean 'domain'?)",
    ),
    "descriptors not a list": ("domain: d\ndescriptors: {key: a}\n", 2, "descriptors must be a list"),
    "empty key": ("domain: d\ndescriptors:\n  - value: v\n", 3, "a descriptor needs a key"),
    "misspelled field": (
        "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: second, requests_per_unit: 1}\n",
        4,
        "unknown field 'ratelimit' in a descriptor (did you mean 'rate_limit'?)",
    ),
    "bad unit": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
        5,
        "unknown unit 'fortnight'; accepted: second, minute, hour, day, week, month, year",
    ),
    "misspelled unit": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minut, requests_per_unit: 1}\n",
        4,
        "; did you mean 'minute'?",
    ),
    "no unit": ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", 4, "needs a unit"),
    "negative requests": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n",
        6,
        "requests_per_unit must be a whole number, 0 or more (0 refuses every request), got the number -1",
    ),
    "unit with unlimited": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n",
        6,
        "an unlimited rate_limit takes no unit",
    ),
    "limits and unit": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      limits: [1/s]\n      unit: second\n",
        6,
        "give unit and requests_per_unit, or limits, not both",
    ),
    "malformed limit": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      limits:\n        - 1/fortnight\n",
        6,
        "unknown time unit 'fortnight'",
    ),
    "unknown algorithm": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: gcr}\n",
        4,
        "unknown algorithm 'gcr' (did you mean 'gcra'?)",
    ),
    "burst on fixed window": (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 2}\n",
        4,
        "burst does not apply to fixed_window",
    ),
    "duplicate descriptor": (
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
        5,
        "duplicate descriptor 'd.k_v' (first at",
    ),
    "duplicate value-less": ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", 4, "duplicate descriptor 'd.k'"),
    "duplicate yaml key": ("domain: d\ndescriptors:\n  - key: k\n    key: j\n", 4, "key 'key' appears twice"),
    "share_threshold without a wildcard": (
        "domain: d\ndescriptors:\n  - key: a\n    value: x\n    share_threshold: true\n",
        5,
        "share_threshold applies only to a wildcard value",
    ),
    "unknown charging": (
        "domain: d\ncharging: evnoy\n",
        2,
        "charging must be one of envoy, stop_over_limit, transaction",
    ),
    "replaces itself": (
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"
        "      name: n\n      replaces:\n        - name: n\n",
        9,
        "cannot replace itself",
    ),
    "replaces without name": (
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"
        "      replaces:\n        - {}\n",
        8,
        "each entry of replaces must be {name:",
    ),
    "shadow_mode not bool": (
        "domain: d\ndescriptors:\n  - key: a\n    shadow_mode: often\n",
        4,
        "shadow_mode must be true",
    ),
    "value a list": ("domain: d\ndescriptors:\n  - key: a\n    value: [x]\n", 4, "value must be a text"),
    "yaml syntax": ("domain: d\ndescriptors:\n  - key: a\n   value: x\n", 4, "YAML syntax error"),
}


@pytest.mark.parametrize("text, line, message", ERRORS.values(), ids=ERRORS.keys())
def test_each_envoy_problem_names_its_file_and_line(write: WriteFile, text: str, line: int, message: str) -> None:
    path = write(text)
    with pytest.raises(ConfigProblems) as info:
        load_envoy(path)
    assert any(p.startswith(f"{path}:{line}: ") and message in p for p in info.value.problems), info.value.problems


def test_every_envoy_problem_at_once() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: sec, requests_per_unit: 1}\n"
        "  - key: b\n    rate_limit: {unit: second, requests_per_unit: -1}\n  - kee: c\n"
    )
    with pytest.raises(ConfigProblems) as info:
        parse_envoy(text, "e.yaml")
    assert [p.split(":")[1] for p in info.value.problems] == ["4", "6", "7", "7"]


def test_envoy_warnings_redundant_limit_and_unknown_replaces() -> None:
    text = (
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      limits: [10/10s, 600/600s]\n"
        "      replaces: [{name: nobody}]\n"
    )
    config = parse_envoy(text, "e.yaml")
    assert config.warnings == (
        "e.yaml:4: warning: d.a: limit 600/10min can never bind beside 10/10s (it is redundant); remove it",
        "e.yaml:6: warning: replaces 'nobody', but no rate_limit has that name; nothing is replaced",
    )
