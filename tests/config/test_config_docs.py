"""The examples of docs/rules-file.md load as shown."""

from __future__ import annotations

import re
from pathlib import Path

from ratekeeper.config import EnvoyConfig, RuleSet, parse_any

DOC = Path(__file__).resolve().parents[2] / "docs" / "rules-file.md"


def _yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def test_the_native_example_loads() -> None:
    native = next(b for b in _yaml_blocks() if b.startswith("version: 1"))
    # The example's provider is a user's module; the tests ship one that answers alike.
    rules = parse_any(native.replace("billing.limits:for_key", "config_quota_provider:lookup"), "doc")
    assert isinstance(rules, RuleSet)
    assert [r.name for r in rules] == ["items.list", "auth.create_token", "uploads", "api.tiered"]
    assert rules.warnings == ()


def test_the_envoy_example_loads_and_resolves_as_described() -> None:
    envoy = next(b for b in _yaml_blocks() if b.startswith("domain:"))
    config = parse_any(envoy, "doc")
    assert isinstance(config, EnvoyConfig) and config.warnings == ()
    hit = config.resolve([("to_number", "+1555"), ("text", "promo-42")])
    assert hit is not None and hit.key == "to_number_+1555.text_promo-42" and hit.replaces == ("per_number",)
    assert config.resolve([("user", "admin")]) is None
    vip = config.resolve([("user", "vip")])
    assert vip is not None and vip.unlimited
