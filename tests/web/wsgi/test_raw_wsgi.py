"""The WSGI middleware around a bare WSGI app under gunicorn: an app that raises, an
error page replacing a started response, a plain iterator body."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from web.wsgi.appserver import AppServer
from web.wsgi.checks import OPTIONS, assert_denied, assert_limited_headers

RULES = [
    {"name": "raise", "path": "/raise", "key": "{query.k}", "limits": ["1/minute"]},
    {"name": "page", "path": "/error-page", "key": "{query.k}", "limits": ["1/minute"]},
    {"name": "plain", "path": "/plain", "key": "{query.k}", "limits": ["1/minute"]},
]


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    config = {"store": "memory://", "rules": RULES, "options": OPTIONS}
    with AppServer("web.wsgi.raw_wsgi:app", config, tmp_path_factory.mktemp("raw"), name="raw") as server:
        yield server


def test_an_app_that_raises_gives_its_charge_back(raw: AppServer) -> None:
    """The server's own 500 (no start_response from the app) counts as a 500: refunded."""
    k = uuid.uuid4().hex
    assert [httpx.get(f"{raw.url}/raise", params={"k": k}).status_code for _ in range(3)] == [500] * 3
    assert "RuntimeError: the app failed before answering" in raw.log_tail(200)


def test_an_error_page_through_exc_info_gets_the_headers_and_is_refunded(raw: AppServer) -> None:
    """start_response(503, exc_info) replacing a 200: the 503 is sent with the headers and its status refunds.

    gunicorn keeps the first call's headers and appends the second's (the app's own
    Content-Type comes twice too), so each header is checked in every copy.
    """
    k = uuid.uuid4().hex
    for _ in range(2):
        response = httpx.get(f"{raw.url}/error-page", params={"k": k})
        assert (response.status_code, response.text) == (503, "error page\n")
        assert set(response.headers.get_list("RateLimit-Policy")) == {'"page";q=1;w=60'}
        assert set(response.headers.get_list("X-RateLimit-Remaining")) == {"0"}


def test_a_plain_iterator_body_and_no_refund_for_a_200(raw: AppServer) -> None:
    """An iterator without close() is passed through; a 200 keeps its charge (the next is a 429)."""
    k = uuid.uuid4().hex
    first = httpx.get(f"{raw.url}/plain", params={"k": k})
    assert (first.status_code, first.text) == (200, "one\ntwo\nthree\n")
    assert_limited_headers(first, "plain", 1, 60, remaining=0)
    assert_denied(httpx.get(f"{raw.url}/plain", params={"k": k}), "plain", 1, 60)
