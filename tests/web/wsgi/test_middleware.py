"""The WSGI and Django middleware through real servers: Flask under gunicorn, Django under
gunicorn's sync worker and under uvicorn (ASGI), on the memory store.

Every test keys its requests by a fresh id, so the session's shared servers never carry
state from one test to another.
"""

from __future__ import annotations

import random
import uuid

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from web.wsgi.appserver import AppServer
from web.wsgi.checks import assert_denied, assert_limited_headers, burst

# Tests of one framework's features run on its servers only (the session's instances are shared).
django_only = pytest.mark.parametrize("server", ["django", "django-asgi"], indirect=True)
flask_only = pytest.mark.parametrize("server", ["flask"], indirect=True)


def fresh() -> str:
    return uuid.uuid4().hex[:12]


def test_partner_burst_admits_exactly_one(server: AppServer) -> None:
    """1/3s on GET /items/{user}: of 10 concurrent requests one passes and nine get a 429."""
    responses = burst(f"{server.url}/items/{fresh()}")
    admitted = [r for r in responses if r.status_code == 200]
    denied = [r for r in responses if r.status_code != 200]
    assert len(admitted) == 1, [r.status_code for r in responses]
    assert_limited_headers(admitted[0], "items", 1, 3, remaining=0)
    assert len(denied) == 9
    for r in denied:
        assert_denied(r, "items", 1, 3)


@django_only
def test_async_view_partner_burst(server: AppServer) -> None:
    """The same on a Django async view (on the event loop under uvicorn)."""
    user = fresh()
    responses = burst(f"{server.url}/aitems/{user}")
    assert sorted(r.status_code for r in responses) == [200] + [429] * 9
    ok = next(r for r in responses if r.status_code == 200)
    assert ok.json() == {"user": user, "pid": ok.json()["pid"], "mode": "async"}
    for r in responses:
        if r.status_code == 429:
            assert_denied(r, "aitems", 1, 3)


def test_headers_on_an_app_error(server: AppServer) -> None:
    """A view that raises gives the framework's 500, with the rate-limit headers on it."""
    response = httpx.get(f"{server.url}/boom", params={"k": fresh()})
    assert response.status_code == 500
    assert_limited_headers(response, "boom", 5, 60, remaining=4)


def test_a_5xx_is_refunded_a_4xx_is_not(server: AppServer) -> None:
    """1/minute: after a 503 the cost is given back, so the next request is let through; after a 404 it is not."""
    k = fresh()
    first = httpx.get(f"{server.url}/fail/503", params={"k": k})
    second = httpx.get(f"{server.url}/fail/503", params={"k": k})
    assert (first.status_code, second.status_code) == (503, 503)
    assert_limited_headers(second, "fail", 1, 60, remaining=0)
    k = fresh()
    first = httpx.get(f"{server.url}/fail/404", params={"k": k})
    second = httpx.get(f"{server.url}/fail/404", params={"k": k})
    assert (first.status_code, second.status_code) == (404, 429)
    assert_denied(second, "fail", 1, 60)


def test_a_request_without_the_key_header_is_not_limited(server: AppServer) -> None:
    """``{header.x-api-key}``: requests without the header skip the rule (no headers, never 429)."""
    for _ in range(3):
        response = httpx.get(f"{server.url}/header")
        assert response.status_code == 200
        assert "RateLimit" not in response.headers
        assert "X-RateLimit-Limit" not in response.headers
    key = {"X-Api-Key": fresh()}
    assert httpx.get(f"{server.url}/header", headers=key).status_code == 200
    assert_denied(httpx.get(f"{server.url}/header", headers=key), "header", 1, 60)


def test_client_ip_behind_a_trusted_proxy(server: AppServer) -> None:
    """``{client_ip}``: the peer (127.0.0.1) is a trusted proxy, so X-Forwarded-For names the client."""
    first, second = (f"198.51.100.{n}" for n in random.sample(range(1, 255), 2))
    assert httpx.get(f"{server.url}/ip", headers={"X-Forwarded-For": first}).status_code == 200
    assert_denied(httpx.get(f"{server.url}/ip", headers={"X-Forwarded-For": f"203.0.113.9, {first}"}), "ip", 1, 60)
    assert httpx.get(f"{server.url}/ip", headers={"X-Forwarded-For": second}).status_code == 200


def test_exempt_paths_are_never_limited(server: AppServer) -> None:
    """A rule that matches /exempt/* (1/minute, one global key) never applies to an exempt path."""
    for i in range(3):
        response = httpx.get(f"{server.url}/exempt/{i}")
        assert response.status_code == 200
        assert "RateLimit-Policy" not in response.headers


def test_a_streamed_body_passes_through(server: AppServer) -> None:
    """A streamed response arrives whole, chunk by chunk, with the headers; Flask's iterable is closed."""
    closed_before = httpx.get(f"{server.url}/closed").json()["closed"] if server.name == "flask" else 0
    with httpx.stream("GET", f"{server.url}/stream/200", params={"k": fresh()}) as response:
        assert response.status_code == 200
        assert_limited_headers(response, "stream", 10, 60, remaining=9)
        body = b"".join(response.iter_bytes())
    assert body == b"".join(f"chunk {i}\n".encode() for i in range(200))
    if server.name == "flask":
        assert httpx.get(f"{server.url}/closed").json()["closed"] == closed_before + 1


@django_only
def test_user_key_is_the_authenticated_user(server: AppServer) -> None:
    """``{user}`` is request.user's primary key when authenticated; anonymous requests skip the rule."""
    for view in ("me", "ame"):
        user = {"X-User": str(uuid.uuid4().int % 10**9)}
        assert httpx.get(f"{server.url}/{view}", headers=user).json() == {"user": int(user["X-User"])}
        assert_denied(httpx.get(f"{server.url}/{view}", headers=user), view, 1, 60)
        for _ in range(2):
            anonymous = httpx.get(f"{server.url}/{view}")
            assert anonymous.status_code == 200
            assert "RateLimit" not in anonymous.headers


@django_only
def test_route_key_is_the_django_route(server: AppServer) -> None:
    """``{route}`` is the URL pattern: /r/a and /r/b share one bucket."""
    a = httpx.get(f"{server.url}/r/{fresh()}")
    b = httpx.get(f"{server.url}/r/{fresh()}")
    assert a.status_code == 200
    assert_denied(b, "route", 1, 60)


@django_only
def test_path_params_from_the_django_resolver(server: AppServer) -> None:
    """A rule whose path template has no parameter (``/kw/*``) reads ``{path.user}`` from the URL pattern."""
    a, b = fresh(), fresh()
    assert httpx.get(f"{server.url}/kw/{a}").status_code == 200
    assert_denied(httpx.get(f"{server.url}/kw/{a}"), "kw", 1, 60)
    assert httpx.get(f"{server.url}/kw/{b}").status_code == 200


@flask_only
def test_flask_under_the_wsgi_middleware_has_no_route_rule(server: AppServer) -> None:
    """Plain WSGI knows no route before the app runs: a ``{route}`` rule is refused at start
    (tests/web/test_unkeyable_web.py), so this server runs without one and /r/ is unlimited."""
    for _ in range(2):
        response = httpx.get(f"{server.url}/r/{fresh()}")
        assert response.status_code == 200
        assert "RateLimit" not in response.headers


def metrics(server: AppServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of one ``GET /metrics``, by name and sorted labels."""
    text = httpx.get(f"{server.url}/metrics").text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_middleware_exports_metrics(server: AppServer) -> None:
    """Decisions per rule and outcome, skipped rules and requests by transport reach ``metrics``."""
    transport = {"flask": "wsgi", "django": "django", "django-asgi": "django"}[server.name]
    over = ("ratekeeper_decisions_total", (("outcome", "over"), ("rule", "items")))
    skipped = ("ratekeeper_skipped_total", (("rule", "header"),))
    requests = ("ratekeeper_requests_total", (("transport", transport),))
    before = metrics(server)
    user = fresh()
    statuses = [httpx.get(f"{server.url}/items/{user}").status_code for _ in range(3)]
    assert statuses == [200, 429, 429]
    assert httpx.get(f"{server.url}/header").status_code == 200
    after = metrics(server)
    assert after[over] == before.get(over, 0.0) + 2
    assert after[skipped] == before.get(skipped, 0.0) + 1
    # the four requests, and the second /metrics request (counted before it answers)
    assert after[requests] == before[requests] + 5
