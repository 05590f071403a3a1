"""Inputs that used to break or bypass the middleware, in every ASGI integration, each
through a real uvicorn: a rendered key over 512 characters, a cost header that is a
digit to ``str.isdigit`` but not ASCII, an exempt key sent in another rule's header, a
``deny_response`` answering bytes, and a rules file that fails to load at start."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError

from .asgi_apps import KINDS, make
from .conftest import http_rule
from .uvicorn_server import serve

kinds = pytest.mark.parametrize("kind", KINDS)


def get_all(base: str, path: str, headers_each: list[dict[str, str]]) -> list[httpx.Response]:
    with httpx.Client(base_url=base, timeout=20.0) as c:
        return [c.get(path, headers=h) for h in headers_each]


@kinds
def test_a_key_over_512_characters_is_bounded_not_an_error(kind: str, rule_name: str) -> None:
    """A long ``Authorization`` header: the same long value is one key, two long values
    that differ only at the end are two keys; never a 500."""
    rule = http_rule(rule_name, "2/minute", path="/header", key="{header.authorization}")
    one, two = "Bearer " + "a" * 3000 + "1", "Bearer " + "a" * 3000 + "2"
    with serve(make(kind, [rule])) as base:
        got = get_all(base, "/header", [{"Authorization": v} for v in (one, one, one, two)])
    assert [200, 200, 429, 200] == [r.status_code for r in got]


@kinds
def test_a_long_path_segment_is_bounded_too(kind: str, rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", path="/items/{user}", key="{path.user}")
    with serve(make(kind, [rule])) as base:
        got = get_all(base, "/items/" + "u" * 2000, [{}, {}])
    assert [200, 429] == [r.status_code for r in got]


@kinds
def test_a_cost_header_of_non_ascii_digits_is_charged_the_missing_cost(kind: str, rule_name: str) -> None:
    """``x-cost: ²`` (latin-1 0xB2, as a server decodes it) is a digit to ``str.isdigit``
    and not to ``int``: it is not a cost, so the request is charged 1 (writing the cost
    wrongly never dodges the rule) and never answered with a 500."""
    rule = http_rule(rule_name, "3/minute", path="/items/{user}", key="{path.user}", cost="{header.x-cost}")
    with serve(make(kind, [rule])) as base, httpx.Client(base_url=base, timeout=20.0) as c:
        got = [c.get("/items/a", headers=[(b"X-Cost", v)]).status_code for v in (b"\xb2", b"\xb3", b"\xb9", b"1")]
    assert [200, 200, 200, 429] == got


MONITOR = "203.0.113.50"


@kinds
def test_an_exempt_key_applies_to_its_own_rule_only(kind: str, rule_name: str) -> None:
    """The monitoring address is exempt from the per-address rule; a client that sends
    that address as its tenant is not exempt from the per-tenant rule. A key template
    exempts a request from every rule."""
    per_ip = http_rule(rule_name + ".ip", "1/minute", path="/ip", key="{client_ip}")
    per_tenant = http_rule(rule_name + ".tenant", "1/minute", path="/ip", key="{header.x-tenant}")
    exempt_keys = {per_ip.name: [MONITOR], "{header.x-probe}": ["probe-secret"]}
    app = make(kind, [per_ip, per_tenant], trusted_proxies=["127.0.0.1"], exempt_keys=exempt_keys)
    with serve(app) as base:
        monitor = get_all(base, "/ip", [{"X-Forwarded-For": MONITOR, "X-Tenant": t} for t in ("t1", "t2", "t3")])
        spoof = get_all(base, "/ip", [{"X-Forwarded-For": f"198.51.100.{i}", "X-Tenant": MONITOR} for i in (1, 2)])
        probe = get_all(base, "/ip", [{"X-Forwarded-For": "198.51.100.9", "X-Probe": "probe-secret"}] * 3)
    assert [200, 200, 200] == [r.status_code for r in monitor]
    assert [200, 429] == [r.status_code for r in spoof]
    assert [200, 200, 200] == [r.status_code for r in probe]
    assert all("RateLimit" not in r.headers for r in probe)


def bytes_denial(denied: Sequence[Decision]) -> tuple[int, list[tuple[Any, Any]], bytes]:
    return 429, [(b"X-Denied-By", denied[0].rule.encode()), ("Retry-After", b"7")], b"slow down"


def broken_denial(denied: Sequence[Decision]) -> tuple[int, list[tuple[Any, Any]], bytes]:
    return 429, [("X-Injected", "a\r\nSet-Cookie: x=1")], b"never sent"


@kinds
def test_a_deny_response_may_answer_bytes_and_a_broken_one_gives_the_standard_429(kind: str, rule_name: str) -> None:
    rule = http_rule(rule_name, "1/minute", path="/items/{user}", key="{path.user}")
    with serve(make(kind, [rule], deny_response=bytes_denial)) as base:
        ok, denied = get_all(base, "/items/a", [{}, {}])
    assert 200 == ok.status_code
    assert (429, rule_name, "7", b"slow down") == (
        denied.status_code,
        denied.headers["X-Denied-By"],
        denied.headers["Retry-After"],
        denied.content,
    )
    with serve(make(kind, [http_rule(rule_name + ".b", "1/minute")], deny_response=broken_denial)) as base:
        statuses = [r.status_code for r in get_all(base, "/items/a", [{}, {}])]
        refused = get_all(base, "/items/a", [{}])[0]
    assert [200, 429] == statuses
    assert refused.headers["Content-Type"].startswith("application/problem+json")
    assert "X-Injected" not in refused.headers and "Set-Cookie" not in refused.headers


def broken_rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  - name: api\n    limits: [ten per minute]\n")
    return path


@pytest.mark.parametrize("kind", ["starlette", "fastapi", "raw-asgi"])
def test_a_rules_file_that_fails_to_load_fails_the_servers_startup(
    kind: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """uvicorn's default lifespan mode ("auto") takes an exception from the app's startup
    for "no lifespan support" and serves on; the middleware answers
    ``lifespan.startup.failed`` instead, so uvicorn refuses to start and logs why."""
    app = make(kind, str(broken_rules(tmp_path)))
    with pytest.raises(RuntimeError, match="uvicorn did not start"), serve(app, lifespan="auto"):
        pass
    logged = capfd.readouterr().err
    assert "RateLimitMiddleware cannot start" in logged and "rules.yaml:3: cannot parse limit" in logged, logged


def test_a_rules_file_that_fails_to_load_fails_the_fastapi_dependency_at_once(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"rules\.yaml:3: cannot parse limit"):
        make("fastapi-dependency", str(broken_rules(tmp_path)))


def test_exempt_keys_as_a_bare_list_is_refused_at_startup(capfd: pytest.CaptureFixture[str]) -> None:
    """The old form (keys compared with every rule's key) is the bypass: it is refused,
    with the form to use instead."""
    app = make("starlette", [http_rule("x", "1/minute")], exempt_keys=["203.0.113.50"])
    with pytest.raises(RuntimeError, match="uvicorn did not start"), serve(app, lifespan="auto"):
        pass
    assert "exempt_keys must say what each key is exempt from" in capfd.readouterr().err
