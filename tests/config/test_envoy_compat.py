"""Envoy's configuration test cases, restated: each loads one of Envoy's own test files
(``envoy_cases/``, kept as they are) or a configuration Envoy's tests build in code
(restated here as YAML), resolves one request descriptor, and asserts what Envoy's
service finds: the limit, its YAML name, its flags, the key its statistics are kept under
(``metric_key``) and, for ``share_threshold``, the key its count is kept under. A file
Envoy refuses is refused here too, with our own message.

One test item per case, so the count of Envoy's cases that pass is pytest's count.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper.config import ConfigProblems, EnvoyConfig, parse_envoy
from ratekeeper.config.envoy import UNIT_SECONDS
from ratekeeper.config.envoy_match import wildcard_match
from ratekeeper.errors import ConfigurationError
from ratekeeper.server.catalog import build_catalog

CASES = Path(__file__).parent / "envoy_cases"


def _file(name: str) -> EnvoyConfig:
    return parse_envoy((CASES / name).read_text(encoding="utf-8"), name)


def _text(text: str) -> EnvoyConfig:
    return parse_envoy(textwrap.dedent(text), "inline.yaml")


@dataclass(frozen=True)
class Case:
    """One lookup of an Envoy test: ``entries`` resolved against ``config`` (a file of
    ``envoy_cases`` or inline YAML), and what Envoy finds (``None``: no limit)."""

    config: str
    entries: tuple[tuple[str, str], ...]
    found: bool = True
    rpu: int | None = None
    unit: str | None = None
    name: str = ""
    unlimited: bool = False
    shadow: bool = False
    metric: str | None = None
    state_key: str | None = None
    metadata: dict[str, Any] | None = field(default=None)

    def load(self) -> EnvoyConfig:
        return _file(self.config) if self.config.endswith(".yaml") else _text(self.config)


def e(*pairs: str) -> tuple[tuple[str, str], ...]:
    """Entries from "key=value" texts."""
    return tuple((p.split("=", 1)[0], p.split("=", 1)[1]) for p in pairs)


# Configurations Envoy's tests build in code, restated as YAML.
NESTED_TOP_DETAILED = """
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {detailed}
    rate_limit: {{unit: minute, requests_per_unit: 100}}
    descriptors:
      - key: key-2
        detailed_metric: {child}
        rate_limit: {{unit: minute, requests_per_unit: 5}}
"""
REALISTIC = """
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {unit: minute, requests_per_unit: 500}
  - key: key_2
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 5000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 50000}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 100}
"""
ROUTE_METHOD_SUBJECT = """
domain: {domain}
descriptors:
  - key: route
    value_to_metric: {route}
    descriptors:
      - key: http_method
        value_to_metric: {method}
        descriptors:
          - key: subject_id
            detailed_metric: {detailed}
            rate_limit: {{unit: minute, requests_per_unit: 60}}
"""
K1_K2_K3 = """
domain: d
descriptors:
  - key: k1
    value_to_metric: {k1}
    descriptors:
      - key: k2
        value_to_metric: {k2}
        {tail}
"""
CONFIGURED_VALUES = """
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 30}
"""
WILDCARD_VALUE_TO_METRIC = """
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 100}
"""
WILD = """
domain: test-domain
descriptors:
  - key: wild
    value: "{pattern}"
    share_threshold: {share}
    value_to_metric: {v2m}
    rate_limit: {{unit: minute, requests_per_unit: 20}}
"""
WILD_NESTED = """
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {unit: minute, requests_per_unit: 20}
"""


def rsm(domain: str = "domain", route: bool = True, method: bool = True, detailed: bool = False) -> str:
    return ROUTE_METHOD_SUBJECT.format(
        domain=domain, route=str(route).lower(), method=str(method).lower(), detailed=str(detailed).lower()
    )


def wild(pattern: str = "foo*", share: bool = False, v2m: bool = False) -> str:
    return WILD.format(pattern=pattern, share=str(share).lower(), v2m=str(v2m).lower())


B, W, S = "basic_config.yaml", "wildcard.yaml", "share_threshold.yaml"
LOOKUPS: dict[str, Case] = {
    # TestBasicConfig
    "basic: no entries, no limit": Case(B, (), found=False),
    "basic: key1=something, no limit": Case(B, e("key1=something"), found=False),
    "basic: key1=value1 alone has no limit": Case(B, e("key1=value1"), found=False),
    "basic: key2=value2/subkey deeper than the file": Case(B, e("key2=value2", "subkey=subvalue"), found=False),
    "basic: key5/subkey5 unknown value": Case(B, e("key5=value5", "subkey5=subvalue"), found=False),
    "basic: subkey1 default": Case(
        B, e("key1=value1", "subkey1=something"), rpu=5, unit="second", metric="test-domain.key1_value1.subkey1"
    ),
    "basic: subkey1 specific": Case(
        B,
        e("key1=value1", "subkey1=subvalue1"),
        rpu=10,
        unit="second",
        metric="test-domain.key1_value1.subkey1_subvalue1",
    ),
    "basic: key2 default": Case(B, e("key2=something"), rpu=20, unit="minute", metric="test-domain.key2"),
    "basic: key2 specific": Case(B, e("key2=value2"), rpu=30, unit="minute", metric="test-domain.key2_value2"),
    "basic: key2=value3 exempt": Case(B, e("key2=value3"), found=False),
    "basic: key3 has no name": Case(B, e("key3=foo"), rpu=1, unit="hour", name="", metric="test-domain.key3"),
    "basic: key4 named": Case(B, e("key4=foo"), rpu=1, unit="day", name="key4_rate_limit", metric="test-domain.key4"),
    "basic: key6 unlimited": Case(B, e("key6=foo"), unlimited=True, metric="test-domain.key6"),
    "basic: key7 detailed, one value": Case(
        B, e("key7=unspecified_value"), rpu=70, unit="minute", metric="test-domain.key7_unspecified_value"
    ),
    "basic: key7 detailed, another value": Case(
        B, e("key7=another_value"), rpu=70, unit="minute", metric="test-domain.key7_another_value"
    ),
    # TestShadowModeConfig
    "shadow: subkey1 default not shadow": Case(
        "shadowmode_config.yaml", e("key1=value1", "subkey1=something"), rpu=5, unit="second", shadow=False
    ),
    "shadow: subkey1 specific shadow": Case(
        "shadowmode_config.yaml", e("key1=value1", "subkey1=subvalue1"), rpu=10, unit="second", shadow=True
    ),
    "shadow: key2 default shadow": Case(
        "shadowmode_config.yaml", e("key2=something"), rpu=20, unit="minute", shadow=True
    ),
    "shadow: key2 specific not shadow": Case(
        "shadowmode_config.yaml", e("key2=value2"), rpu=30, unit="minute", shadow=False
    ),
    # TestWildcardConfig
    "wildcard: value-less key": Case(W, e("noVal=foo1"), rpu=20, metric="test-domain.noVal"),
    "wildcard: trailing *": Case(W, e("wild=foo1"), rpu=20, metric="test-domain.wild_foo*", state_key="wild_foo1"),
    "wildcard: trailing *, another value": Case(W, e("wild=foo2"), rpu=20, metric="test-domain.wild_foo*"),
    "wildcard: nested trailing *": Case(
        W, e("nestedWild=val1", "wild=goo2"), rpu=20, metric="test-domain.nestedWild_val1.wild_goo*"
    ),
    "wildcard: no match": Case(W, e("wild=bar"), found=False),
    "wildcard: an exact value does not match as a prefix": Case(W, e("noWild=foo1"), found=False),
    "wildcard: middle *": Case(W, e("midWild=barab"), rpu=20, metric="test-domain.midWild_bar*b"),
    "wildcard: middle *, longer": Case(W, e("midWild=bar123b"), rpu=20, metric="test-domain.midWild_bar*b"),
    "wildcard: middle * matches nothing": Case(W, e("midWild=barb"), rpu=20),
    "wildcard: middle *, suffix missing": Case(W, e("midWild=bara"), found=False),
    "wildcard: middle *, prefix missing": Case(W, e("midWild=xbarb"), found=False),
    "wildcard: several *": Case(W, e("multiWild=foo123bar456baz"), rpu=10, metric="test-domain.multiWild_foo*bar*baz"),
    "wildcard: several *, each empty": Case(W, e("multiWild=foobarbaz"), rpu=10),
    "wildcard: several *, middle piece missing": Case(W, e("multiWild=foo123baz"), found=False),
    "wildcard: several *, first piece missing": Case(W, e("multiWild=bar456baz"), found=False),
    # TestDetailedMetric
    "detailed: top-level key only": Case(
        NESTED_TOP_DETAILED.format(detailed="true", child="false"), e("key-1=value-1"), metric="nested.key-1_value-1"
    ),
    "detailed: top-level key only, not detailed": Case(
        NESTED_TOP_DETAILED.format(detailed="false", child="false"), e("key-1=value-1"), metric="nested.key-1"
    ),
    "detailed: nested": Case(
        NESTED_TOP_DETAILED.format(detailed="true", child="true"),
        e("key-1=value-1", "key-2=value-2"),
        metric="nested.key-1_value-1.key-2_value-2",
    ),
    "detailed: nested, not detailed": Case(
        NESTED_TOP_DETAILED.format(detailed="false", child="false"),
        e("key-1=value-1", "key-2=value-2"),
        metric="nested.key-1.key-2",
    ),
    "detailed: realistic, simple": Case(REALISTIC, e("key_1=value-for-key-1"), metric="nested.key_1_value-for-key-1"),
    "detailed: realistic, second key only": Case(REALISTIC, e("key_2=key-2-value"), metric="nested.key_2_key-2-value"),
    "detailed: realistic, nested": Case(
        REALISTIC,
        e("key_2=key-2-value", "key_3=requested-key3-value"),
        rpu=5,
        metric="nested.key_2_key-2-value.key_3_requested-key3-value",
    ),
    # TestValueToMetric_*
    "value_to_metric: runtime values": Case(
        rsm(),
        e("route=draw", "http_method=GET", "subject_id=123"),
        metric="domain.route_draw.http_method_GET.subject_id",
    ),
    "value_to_metric: a default key shows its value": Case(
        K1_K2_K3.format(k1="true", k2="false", tail="rate_limit: {unit: minute, requests_per_unit: 5}"),
        e("k1=A", "k2=foo"),
        metric="d.k1_A.k2",
    ),
    "value_to_metric: mid level only": Case(
        K1_K2_K3.format(
            k1="false", k2="true", tail="descriptors: [{key: k3, rate_limit: {unit: minute, requests_per_unit: 5}}]"
        ),
        e("k1=X", "k2=Y", "k3=Z"),
        metric="d.k1.k2_Y.k3",
    ),
    "value_to_metric: no flag, unchanged": Case(
        K1_K2_K3.format(k1="false", k2="false", tail="rate_limit: {unit: minute, requests_per_unit: 5}"),
        e("k1=X", "k2=Y"),
        metric="d.k1.k2",
    ),
    "value_to_metric: detailed_metric wins": Case(
        rsm(detailed=True),
        e("route=draw", "http_method=GET", "subject_id=123"),
        metric="domain.route_draw.http_method_GET.subject_id_123",
    ),
    "value_to_metric: configured GET": Case(
        CONFIGURED_VALUES,
        e("route=api", "http_method=GET", "subject_id=user123"),
        rpu=60,
        metric="test-domain.route_api.http_method_GET.subject_id",
    ),
    "value_to_metric: configured POST": Case(
        CONFIGURED_VALUES,
        e("route=api", "http_method=POST", "subject_id=user456"),
        rpu=30,
        metric="test-domain.route_api.http_method_POST.subject_id",
    ),
    "value_to_metric: wildcard, alice": Case(
        WILDCARD_VALUE_TO_METRIC,
        e("user=alice", "action=readfile", "resource=documents"),
        rpu=100,
        metric="domain.user_alice.action_readfile.resource",
    ),
    "value_to_metric: wildcard, bob": Case(
        WILDCARD_VALUE_TO_METRIC,
        e("user=bob", "action=readdata", "resource=database"),
        metric="domain.user_bob.action_readdata.resource",
    ),
    "value_to_metric: empty route": Case(
        rsm(), e("route=", "http_method=GET", "subject_id=123"), metric="domain.route.http_method_GET.subject_id"
    ),
    "value_to_metric: empty method": Case(
        rsm(), e("route=draw", "http_method=", "subject_id=123"), metric="domain.route_draw.http_method.subject_id"
    ),
    "value_to_metric: both empty": Case(
        rsm(), e("route=", "http_method=", "subject_id=123"), metric="domain.route.http_method.subject_id"
    ),
    "value_to_metric: full key": Case(
        rsm("test-domain"),
        e("route=api", "http_method=GET", "subject_id=user123"),
        metric="test-domain.route_api.http_method_GET.subject_id",
    ),
    "value_to_metric: disabled, full key": Case(
        rsm("test-domain", False, False),
        e("route=api", "http_method=GET", "subject_id=user123"),
        metric="test-domain.route.http_method.subject_id",
    ),
    "value_to_metric: disabled, detailed": Case(
        rsm("test-domain", False, False, True),
        e("route=api", "http_method=GET", "subject_id=user123"),
        metric="test-domain.route_api.http_method_GET.subject_id_user123",
    ),
    # TestShareThreshold
    **{
        f"share_threshold: files/{v}": Case(
            S, e(f"files=files/{v}"), rpu=100, metric="test-domain.files_files/*", state_key="files_files/*"
        )
        for v in ("a.pdf", "b.csv", "c.txt")
    },
    "share_threshold: beats value_to_metric": Case(
        S,
        e("route=api/v1", "method=GET"),
        rpu=60,
        metric="test-domain.route_api/*.method",
        state_key="route_api/*.method_GET",
    ),
    "share_threshold: beats detailed_metric": Case(
        S,
        e("service=svc/users", "endpoint=get"),
        rpu=80,
        metric="test-domain.service_svc/*.endpoint_get",
        state_key="service_svc/*.endpoint_get",
    ),
    "share_threshold: nested": Case(
        S,
        e("nested=parent", "files=nested/file1.txt"),
        rpu=200,
        metric="test-domain.nested_parent.files_nested/*",
        state_key="nested_parent.files_nested/*",
    ),
    "share_threshold: both levels": Case(
        S,
        e("files=top/test.txt", "files=nested/test2.txt"),
        rpu=300,
        metric="test-domain.files_top/*.files_nested/*",
        state_key="files_top/*.files_nested/*",
    ),
    "share_threshold: parent shares, child does not": Case(
        S,
        e("path=path/foo", "file=file/bar", "type=csv"),
        rpu=120,
        metric="test-domain.path_path/*.file_file/*.type",
        state_key="path_path/*.file_file/bar.type_csv",
    ),
    "share_threshold: parent and child share": Case(
        S,
        e("user=user/alice", "resource=res/doc1", "action=read"),
        rpu=150,
        metric="test-domain.user_user/*.resource_res/*.action",
        state_key="user_user/*.resource_res/*.action_read",
    ),
    "share_threshold: an exact value stays its own": Case(
        S, e("file=test1"), rpu=50, metric="test-domain.file_test1", state_key="file_test1"
    ),
    **{
        f"share_threshold: file={v} shares test*": Case(
            S, e(f"file={v}"), rpu=100, metric="test-domain.file_test*", state_key="file_test*"
        )
        for v in ("test2", "test23", "test123")
    },
    **{
        f"share_threshold: middle *, {v}": Case(
            S, e(f"midpath={v}"), rpu=100, metric="test-domain.midpath_/api*v1", state_key="midpath_/api*v1"
        )
        for v in ("/api/v1", "/api/users/v1", "/apiv1")
    },
    "share_threshold: middle *, no match": Case(S, e("midpath=/api/v2"), found=False),
    **{
        f"share_threshold: several *, {v}": Case(
            S,
            e(f"multiroute={v}"),
            rpu=50,
            metric="test-domain.multiroute_svc*ep*rpc",
            state_key="multiroute_svc*ep*rpc",
        )
        for v in ("svcAepBrpc", "svcep_rpc", "svc-users-ep-get-rpc")
    },
    "share_threshold: several *, no match": Case(S, e("multiroute=svcABCrpc"), found=False),
    **{
        f"share_threshold: beats value_to_metric, middle *, {v}": Case(
            S, e(f"midroute={v}"), rpu=80, metric="test-domain.midroute_/api*v2", state_key="midroute_/api*v2"
        )
        for v in ("/api/v2", "/api-beta-v2")
    },
    **{
        f"share_threshold: nested middle *, {t}": Case(
            S,
            e(f"tenant={t}", f"resource={r}"),
            rpu=60,
            metric="test-domain.tenant_t*prod.resource_res*v2",
            state_key="tenant_t*prod.resource_res*v2",
        )
        for t, r in (("t1prod", "res-a-v2"), ("tenant-xyz-prod", "resv2"))
    },
    # TestWildcardStatsBehavior
    "wildcard stats: no flags keep the pattern": Case(wild(), e("wild=foo1"), metric="test-domain.wild_foo*"),
    "wildcard stats: value_to_metric shows the value": Case(
        wild(v2m=True), e("wild=foo1"), metric="test-domain.wild_foo1"
    ),
    "wildcard stats: share_threshold keeps the pattern": Case(
        wild(share=True), e("wild=foo1"), metric="test-domain.wild_foo*", state_key="wild_foo*"
    ),
    "wildcard stats: share_threshold beats value_to_metric": Case(
        wild(share=True, v2m=True), e("wild=foo1"), metric="test-domain.wild_foo*"
    ),
    "wildcard stats: value_to_metric on another level": Case(
        WILD_NESTED, e("wild=foo1", "other=bar", "limit=X"), metric="test-domain.wild_foo*.other_bar.limit"
    ),
    "wildcard stats: middle and trailing *": Case(
        wild("foo*bar*"), e("wild=foo123bar456"), metric="test-domain.wild_foo*bar*"
    ),
    "wildcard stats: middle and trailing *, another value": Case(
        wild("foo*bar*"), e("wild=fooXbarY"), metric="test-domain.wild_foo*bar*"
    ),
    "wildcard stats: middle and trailing *, value_to_metric": Case(
        wild("foo*bar*", v2m=True), e("wild=foo123bar456"), metric="test-domain.wild_foo123bar456"
    ),
    # TestMetadata
    "metadata: none on a request without entries": Case("metadata.yaml", (), found=False),
    "metadata: flat": Case(
        "metadata.yaml",
        e("key1=value1", "subkey1=something"),
        rpu=5,
        unit="second",
        metric="test-domain.key1_value1.subkey1",
        metadata={"name": "service_1"},
    ),
    "metadata: nested": Case(
        "metadata.yaml",
        e("key2=something"),
        rpu=20,
        unit="minute",
        metric="test-domain.key2",
        metadata={"service_with_quota": {"name": "service_2"}},
    ),
}


@pytest.mark.parametrize("case", LOOKUPS.values(), ids=LOOKUPS.keys())
def test_lookup(case: Case) -> None:
    config = case.load()
    found = config.resolve(case.entries) if case.entries else None
    if not case.found:
        assert found is None
        return
    assert found is not None
    if case.rpu is not None:
        assert found.rule is not None and found.rule.limits[0].count == case.rpu
    if case.unit is not None:
        assert found.rule is not None and found.rule.limits[0].period == UNIT_SECONDS[case.unit]
    assert found.name == case.name
    assert found.unlimited == case.unlimited
    assert found.shadow == case.shadow
    if case.metric is not None:
        assert found.metric_key == case.metric
    if case.state_key is not None:
        assert found.key == case.state_key
    if case.metadata is not None:
        assert getattr(found, "metadata", None) == case.metadata


def test_wildcard_values_of_one_pattern_share_one_limit() -> None:
    """Envoy: every value matching a wildcard gets the same limit (but, without
    share_threshold, each value its own count)."""
    config = _file(W)
    a, b = config.resolve(e("wild=foo1")), config.resolve(e("wild=foo2"))
    assert a is not None and b is not None and a.rule is b.rule
    assert (a.key, b.key) == ("wild_foo1", "wild_foo2")


def test_share_threshold_values_count_together() -> None:
    """Envoy's share_threshold: every value the wildcard matches counts against one count."""
    from ratekeeper import Limiter
    from ratekeeper.testing import FakeClock

    config = _file(S)
    limiter = Limiter("memory://", clock=FakeClock())
    try:
        answers = []
        for value in ("test2", "test23", "test123") * 40:
            found = config.resolve(e(f"file={value}"))
            assert found is not None and found.rule is not None
            answers.append(bool(limiter.try_acquire(found.rule, found.key)))
        assert answers.count(True) == 100  # one count of 100 a minute, not three
    finally:
        limiter.close()


def test_domain_merge() -> None:
    """TestDomainMerge: two files of one domain, merged, answer for both."""
    from ratekeeper.config.envoy import merge_envoy  # here, so the other cases run on code without it

    merged = merge_envoy([_file("merge_domain_key1.yaml"), _file("merge_domain_key2.yaml")])
    assert merged.resolve(()) is None
    one, two = merged.resolve(e("key1=value1")), merged.resolve(e("key2=value2"))
    assert one is not None and one.requests_per_unit == 10
    assert two is not None and two.requests_per_unit == 20


def test_domain_merge_through_the_catalog() -> None:
    """The service merges files of one domain only when told to."""
    files = [("merge_domain_key1.yaml", _file("merge_domain_key1.yaml")), ("k2.yaml", _file("merge_domain_key2.yaml"))]
    catalog = build_catalog(files, merge_domains=True)
    assert catalog.envoy["test-domain"].resolve(e("key2=value2")) is not None
    assert catalog.envoy["test-domain"].resolve(e("key1=value1")) is not None
    with pytest.raises(ConfigurationError, match="domain 'test-domain' is already served by"):
        build_catalog(files)


def test_duplicate_domain() -> None:
    """TestDuplicateDomain: a second file of a domain is refused when not merging."""
    with pytest.raises(
        ConfigurationError, match=re.escape("domain 'test-domain' is already served by basic_config.yaml")
    ):
        build_catalog([("basic_config.yaml", _file(B)), ("duplicate_domain.yaml", _file("duplicate_domain.yaml"))])


def test_duplicate_key_domain_merge() -> None:
    """TestDuplicateKeyDomainMerge: merging a file with itself declares its descriptors twice."""
    from ratekeeper.config.envoy import merge_envoy  # here, so the other cases run on code without it

    with pytest.raises(ConfigurationError, match=re.escape("duplicate descriptor 'test-domain.key1_value1'")):
        merge_envoy([_file("merge_domain_key1.yaml"), _file("merge_domain_key1.yaml")])


REFUSED = {
    "empty_domain.yaml": "domain must be a non-empty text",
    "empty_key.yaml": "a descriptor needs a key",
    "duplicate_key.yaml": "duplicate descriptor 'test-domain.key1_value1'",
    "bad_limit_unit.yaml": "unknown unit 'foo'",
    "replaces_self.yaml": "cannot replace itself",
    "replaces_empty.yaml": "each entry of replaces must be {name:",
    "bad_yaml.yaml": "YAML",
    "misspelled_key.yaml": "unknown field 'ratelimit'",
    "misspelled_key2.yaml": "unknown field 'requestsperunit'",
    "non_string_key.yaml": "0.25",
    "non_map_list.yaml": "a descriptor must be a mapping",
    "unlimited_with_unit.yaml": "an unlimited rate_limit takes no unit",
}


@pytest.mark.parametrize("name, message", REFUSED.items(), ids=REFUSED.keys())
def test_refused(name: str, message: str) -> None:
    """Envoy's files that its service refuses, refused here with a message naming the problem."""
    with pytest.raises(ConfigProblems) as info:
        _file(name)
    assert message in str(info.value)


def test_requests_per_unit_zero_blocks() -> None:
    """Envoy's README block list: ``requests_per_unit: 0`` loads and marks the limit blocked."""
    config = _text("""
        domain: blocklist
        descriptors:
          - key: remote_address
            value: 50.0.0.5
            rate_limit: {unit: second, requests_per_unit: 0}
    """)
    found = config.resolve(e("remote_address=50.0.0.5"))
    assert found is not None and found.blocked and found.rule is None and found.requests_per_unit == 0
    assert found.unit == "second"


def test_unlimited_beside_requests_per_unit() -> None:
    config = _text("""
        domain: d
        descriptors:
          - key: k
            rate_limit: {unlimited: true, requests_per_unit: 25}
    """)
    found = config.resolve(e("k=v"))
    assert found is not None and found.unlimited and found.rule is None


def test_two_limits_of_one_name_keep_their_own_counts() -> None:
    config = _text("""
        domain: d
        descriptors:
          - key: a
            rate_limit: {unit: second, requests_per_unit: 1, name: shared}
          - key: b
            rate_limit: {unit: second, requests_per_unit: 1, name: shared}
    """)
    a, b = config.resolve(e("a=x")), config.resolve(e("b=x"))
    assert a is not None and b is not None and a.name == b.name == "shared"
    assert a.rule is not None and b.rule is not None and a.rule.name != b.rule.name


def test_quota_mode_and_charging_are_read() -> None:
    config = _text("""
        domain: d
        charging: stop_over_limit
        descriptors:
          - key: a
            quota_mode: true
            rate_limit: {unit: hour, requests_per_unit: 5}
    """)
    found = config.resolve(e("a=1"))
    assert config.charging == "stop_over_limit"
    assert found is not None and found.quota_mode
    assert _file(B).charging is None


def test_a_star_value_matches_an_empty_value_as_envoy_does() -> None:
    """Envoy matches the pattern against ``key_value``, so ``value: "*"`` also takes an
    entry whose value is empty (the trailing case ratekeeper used to answer differently)."""
    config = _text("""
        domain: d
        descriptors:
          - key: k
            value: "*"
            rate_limit: {unit: second, requests_per_unit: 3}
    """)
    found = config.resolve(e("k="))
    assert found is not None and found.requests_per_unit == 3


def test_config_check_describes_a_blocked_descriptor() -> None:
    """``ratekeeper config check`` shows ``requests_per_unit: 0`` as blocked, not as unlimited."""
    from ratekeeper.cli.config import describe_envoy_node

    config = _text("""
        domain: d
        descriptors:
          - key: ip
            value: 1.2.3.4
            rate_limit: {unit: second, requests_per_unit: 0}
    """)
    (node,) = config.nodes
    assert "blocked" in describe_envoy_node(node)


@given(
    parts=st.lists(st.text(alphabet="ab_", max_size=3), min_size=1, max_size=4),
    text=st.text(alphabet="ab_", max_size=10),
)
def test_wildcard_match_is_each_star_zero_or_more_characters(parts: list[str], text: str) -> None:
    """The matcher agrees with a regular expression in which each ``*`` is ``.*``."""
    expected = re.fullmatch(".*".join(re.escape(p) for p in parts), text, re.DOTALL) is not None
    assert wildcard_match(tuple(parts), text) == expected
