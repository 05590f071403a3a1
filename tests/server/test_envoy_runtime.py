"""Envoy's deployment settings on the real service: a directory of rules files swapped by
a symlink (Envoy's runtime layout), files of one domain merged (``MERGE_DOMAIN_CONFIG``),
and the service-wide shadow mode (``SHADOW_MODE``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from servers import wait_until

from .conftest import Served, start_server


def envoy(domain: str, key: str, per_minute: int) -> str:
    return (
        f"domain: {domain}\ndescriptors:\n  - key: {key}\n"
        f"    rate_limit: {{unit: minute, requests_per_unit: {per_minute}}}\n"
    )


def ask(served: Served, domain: str, key: str, value: str) -> dict[str, Any]:
    body = {"domain": domain, "descriptors": [{"entries": [{"key": key, "value": value}]}]}
    answer: dict[str, Any] = httpx.post(f"{served.url}/json", json=body, timeout=10).json()
    return answer


def limit_of(served: Served, domain: str, key: str) -> int | None:
    statuses = ask(served, domain, key, "probe")["statuses"]
    limit = statuses[0].get("currentLimit")
    return None if limit is None else int(limit["requestsPerUnit"])


def swap(link: Path, target: Path) -> None:
    """Point ``link`` at ``target`` in one rename, as a deployment swaps a runtime directory."""
    fresh = link.with_name(link.name + ".new")
    os.symlink(target, fresh)
    os.replace(fresh, link)


def test_a_rules_directory_swapped_by_symlink_reloads(serve: Callable[..., Served], tmp_path: Path, uid: str) -> None:
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir()
    v2.mkdir()
    (v1 / "a.yaml").write_text(envoy(f"{uid}-a", "k", 2))
    (v1 / ".hidden.yaml").write_text("not: [rules")  # dot files are skipped
    (v1 / "notes.txt").write_text("not rules")  # so are other files
    (v2 / "a.yaml").write_text(envoy(f"{uid}-a", "k", 7))
    (v2 / "b.yml").write_text(envoy(f"{uid}-b", "k", 3))
    current = tmp_path / "current"
    os.symlink(v1, current)
    served = serve(args=["--rules", str(current)])
    assert limit_of(served, f"{uid}-a", "k") == 2
    assert limit_of(served, f"{uid}-b", "k") is None  # not served yet
    swap(current, v2)
    wait_until(lambda: limit_of(served, f"{uid}-b", "k") == 3, 15, "the swapped directory to load")
    assert limit_of(served, f"{uid}-a", "k") == 7
    reloads = [e for e in served.events() if e.get("event") == "reload"]
    assert reloads and reloads[-1]["ok"] is True


def test_files_of_one_domain_merge_when_asked(serve: Callable[..., Served], uid: str) -> None:
    rules = [envoy(f"{uid}-d", "one", 4), envoy(f"{uid}-d", "two", 5)]
    served = serve(rules=rules, env={"MERGE_DOMAIN_CONFIG": "true"})
    assert limit_of(served, f"{uid}-d", "one") == 4
    assert limit_of(served, f"{uid}-d", "two") == 5


def test_files_of_one_domain_are_refused_unless_merged(tmp_path: Path, uid: str) -> None:
    with pytest.raises(RuntimeError) as info:
        start_server(tmp_path, rules=[envoy(f"{uid}-d", "one", 4), envoy(f"{uid}-d", "two", 5)])
    assert f"domain '{uid}-d' is already served by" in str(info.value)
    assert "--merge-domains" in str(info.value)


def test_the_service_wide_shadow_mode_never_refuses(serve: Callable[..., Served], uid: str) -> None:
    served = serve(rules=[envoy(f"{uid}-d", "k", 1)], args=["--shadow-mode"])
    answers = [ask(served, f"{uid}-d", "k", "same") for _ in range(3)]
    assert [a["overallCode"] for a in answers] == ["OK", "OK", "OK"]
    # decided and counted all the same: the descriptor itself says it is over its limit
    assert answers[-1]["statuses"][0]["code"] == "OVER_LIMIT"
