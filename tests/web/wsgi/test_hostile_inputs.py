"""Inputs meant to break or bypass the middleware, through real servers: Flask, a
bare WSGI app and Django under gunicorn, Django under uvicorn (``hostile_server``, with
``checks.HOSTILE``), and rules files that fail to load at start."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from web.wsgi.appserver import AppServer
from web.wsgi.checks import MONITOR
from web.wsgi.conftest import HOSTILE_TARGETS


def fresh() -> str:
    return uuid.uuid4().hex[:12]


def statuses(url: str, headers_each: list[dict[str, str] | list[tuple[bytes, bytes]]]) -> list[int]:
    with httpx.Client(timeout=20.0) as c:
        return [c.get(url, headers=h).status_code for h in headers_each]


def test_a_key_over_512_characters_is_bounded_not_an_error(hostile_server: AppServer) -> None:
    """A long ``Authorization`` header: the same long value is one key, two long values
    that differ only at the end are two keys; never a 500."""
    tail = fresh()
    one, two = "Bearer " + "a" * 3000 + tail + "1", "Bearer " + "a" * 3000 + tail + "2"
    got = statuses(f"{hostile_server.url}/header", [{"Authorization": v} for v in (one, one, one, two)])
    assert [200, 200, 429, 200] == got


def test_a_long_path_segment_is_bounded_too(hostile_server: AppServer) -> None:
    got = statuses(f"{hostile_server.url}/items/{fresh()}{'u' * 2000}", [{}] * 4)
    assert [200, 200, 200, 429] == got


def test_a_cost_header_of_non_ascii_digits_is_charged_the_missing_cost(hostile_server: AppServer) -> None:
    """``x-cost: ²`` (latin-1 0xB2) is a digit to ``str.isdigit`` and not to ``int``:
    charged 1, never a 500."""
    url = f"{hostile_server.url}/items/{fresh()}"
    got = statuses(url, [[(b"X-Cost", v)] for v in (b"\xb2", b"\xb3", b"\xb9", b"1")])
    assert [200, 200, 200, 429] == got


def test_a_deny_response_answering_bytes_headers_is_sent(hostile_server: AppServer) -> None:
    url = f"{hostile_server.url}/items/{fresh()}"
    with httpx.Client(timeout=20.0) as c:
        ok = c.get(url, headers={"X-Cost": "3"})
        denied = c.get(url)
    assert 200 == ok.status_code
    assert (429, "cost", "7", b"slow down") == (
        denied.status_code,
        denied.headers["X-Denied-By"],
        denied.headers["Retry-After"],
        denied.content,
    )


def test_an_exempt_key_applies_to_its_own_rule_only(hostile_server: AppServer) -> None:
    """The monitoring address is exempt from the per-address rule ``ip``; a client that
    sends that address as its tenant is not exempt from ``tenant``. A key template
    (``{header.x-probe}``) exempts a request from every rule."""
    url = f"{hostile_server.url}/ip"
    monitor = statuses(url, [{"Forwarded": f"for={MONITOR}", "X-Tenant": fresh()} for _ in range(3)])
    spoof = statuses(url, [{"Forwarded": f"for=198.51.100.{i}", "X-Tenant": MONITOR} for i in (1, 2)])
    probe = statuses(url, [{"Forwarded": "for=198.51.100.9", "X-Probe": "probe-secret"}] * 3)
    assert [200, 200, 200] == monitor
    assert [200, 429] == spoof
    assert [200, 200, 200] == probe


@pytest.mark.parametrize("target", list(HOSTILE_TARGETS))
def test_a_rules_file_that_fails_to_load_stops_the_server(target: str, tmp_path: Path) -> None:
    """The middleware is built when the app is (WSGI) or when Django loads its middleware:
    the worker fails to boot, the server exits and its log says what is wrong."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: api\n    limits: [ten per minute]\n")
    kind, app = HOSTILE_TARGETS[target]
    server = AppServer(app, {"store": "memory://", "rules": str(rules)}, tmp_path, kind=kind, name=target)
    with pytest.raises(RuntimeError, match="exited") as failed:
        server.start()
    assert "rules.yaml:3: cannot parse limit" in str(failed.value)
