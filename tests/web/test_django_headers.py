"""The Django middleware reads a request's headers from ``META`` one name at a time; what
it reads is what ``request.headers`` (lower-cased) holds, for every name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("django")

from django.http.request import HttpHeaders  # type: ignore[import-untyped]

from ratekeeper.web.django import _Headers

META = {
    "HTTP_HOST": "api.example",
    "HTTP_X_API_KEY": "k1",
    "HTTP_X_FORWARDED_FOR": "203.0.113.7, 10.0.0.1",
    "HTTP_X_EMPTY": "",
    "HTTP_X_B3_TRACEID": "abc",
    "CONTENT_TYPE": "application/json",
    "CONTENT_LENGTH": "12",
    "HTTP_ACCEPT_LANGUAGE": "caf\xc3\xa9",  # UTF-8 bytes as WSGI strings carry them
    "REMOTE_ADDR": "192.0.2.1",
    "SERVER_NAME": "testserver",
    "wsgi.url_scheme": "http",
}

NAMES = [
    "host", "x-api-key", "x-forwarded-for", "x-empty", "x-b3-traceid", "content-type", "content-length",
    "accept-language", "remote-addr", "server-name", "x_api_key", "X-API-KEY", "x-missing", "caf\xe9", "",
]  # fmt: skip


def _request() -> SimpleNamespace:
    return SimpleNamespace(META=META, headers=HttpHeaders(META))


def test_each_name_reads_as_request_headers_lower_cased() -> None:
    expected = {k.lower(): v for k, v in HttpHeaders(META).items()}
    for name in NAMES:
        assert _Headers(_request()).get(name) == expected.get(name), name
    headers = _Headers(_request())
    assert dict(headers) == expected
    for name in NAMES:  # after the walk, from the whole mapping
        assert headers.get(name) == expected.get(name), name


def test_a_missing_name_is_a_key_error() -> None:
    headers = _Headers(_request())
    assert headers["x-api-key"] == "k1"
    with pytest.raises(KeyError):
        headers["x-missing"]
