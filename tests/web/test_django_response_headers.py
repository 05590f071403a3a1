"""The Django middleware puts a verdict's headers into Django's header store directly when
Django's own checks would pass them unchanged: a response gets exactly the headers
``response[name] = value`` gives it, and a value Django refuses is still refused."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("django")

from django.http import BadHeaderError, HttpResponse  # type: ignore[import-untyped]

from ratekeeper.web.django import _add_headers, _deny

from .django_in_process import configure

configure()

CORE = [
    ("RateLimit-Policy", '"auth.token";q=20;w=60'),
    ("RateLimit", '"auth.token";r=19;t=3'),
    ("X-RateLimit-Limit", "20"),
    ("X-RateLimit-Remaining", "19"),
    ("X-RateLimit-Reset", "3"),
]
ODD = [
    ("content-type", "application/problem+json"),  # replaces the view's Content-Type, keeps its place
    ("X-Caf\xe9-Name", "v"),  # a name Django refuses to send: never learnt
    ("X-Note", "caf\xe9"),  # latin-1, not ASCII: Django's own path
    ("X-Note-2", "\u20ac uro"),  # beyond latin-1: MIME-encoded by Django
    ("X-Tab", "a\tb"),  # a control character Django lets through
    ("Retry-After", "3"),
]


def _django_way(headers: list[tuple[str, str]]) -> HttpResponse:
    response = HttpResponse("ok", content_type="text/plain")
    for name, value in headers:
        response[name] = value
    return response


def _ours(headers: list[tuple[str, str]]) -> HttpResponse:
    response = HttpResponse("ok", content_type="text/plain")
    _add_headers(response, SimpleNamespace(headers=tuple(headers)))  # type: ignore[arg-type]
    return response


def _sent(response: HttpResponse) -> tuple[Any, ...]:
    return (response.serialize_headers(), list(response.items()), response.headers._store)


@pytest.mark.parametrize("headers", [CORE, [h for h in ODD if "\xe9-" not in h[0]], CORE + CORE[:2]])
def test_the_headers_are_those_django_sets_the_first_time_and_after(headers: list[tuple[str, str]]) -> None:
    expected = _sent(_django_way(headers))
    for _ in range(3):  # the first request teaches the names, the next ones take the direct path
        assert _sent(_ours(headers)) == expected


def test_a_name_django_refuses_is_refused_every_time() -> None:
    for _ in range(2):
        with pytest.raises(UnicodeError):
            _ours([("X-Caf\xe9-Name", "v")])


@pytest.mark.parametrize("value", ["1\r\nSet-Cookie: a=b", "1\nX: y", "caf\xe9\r\nX: y"])
def test_a_line_break_in_a_value_is_refused_even_under_a_known_name(value: str) -> None:
    _ours(CORE)  # every name of CORE is known now
    with pytest.raises(BadHeaderError):
        _ours([("X-RateLimit-Remaining", value)])


def test_a_subclass_of_django_s_headers_goes_through_its_own_setitem() -> None:
    from django.http.response import ResponseHeaders  # type: ignore[import-untyped]

    seen: list[str] = []

    class Watched(ResponseHeaders):  # type: ignore[misc]
        def __setitem__(self, key: str, value: str) -> None:
            seen.append(key)
            super().__setitem__(key, value)

    _ours(CORE)
    response = HttpResponse("ok")
    response.headers = Watched(dict(response.headers))
    seen.clear()
    _add_headers(response, SimpleNamespace(headers=tuple(CORE)))  # type: ignore[arg-type]
    assert [name for name, _ in CORE] == seen


@pytest.mark.parametrize(
    "headers",
    [
        (*CORE, ("Content-Type", "application/problem+json"), ("Retry-After", "3")),  # the core's refusal
        (("X-Denied", "yes"),),  # a deny_response naming no Content-Type: Django's default
        (("content-type", "text/plain"), ("Retry-After", "9")),
    ],
)
def test_a_refusal_is_the_response_django_builds_from_the_verdict(headers: tuple[tuple[str, str], ...]) -> None:
    verdict = SimpleNamespace(headers=headers, body=b'{"status":429}', status=429)
    expected = HttpResponse(verdict.body, status=verdict.status)
    for name, value in headers:
        expected[name] = value
    for _ in range(2):
        response = _deny(verdict, HttpResponse)  # type: ignore[arg-type]
        assert (response.status_code, response.content) == (429, verdict.body)
        assert _sent(response) == _sent(expected)
