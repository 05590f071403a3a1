"""Views of the test Django project: sync ones, async ones (``aitems``, ``ame``), and a
middleware that makes ``X-User: <id>`` an authenticated ``request.user`` (no database:
an unsaved ``User`` with that primary key)."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse

from ratekeeper.web.django import ratelimit


class HeaderUserMiddleware:
    """``request.user`` from the ``X-User`` header (sync or async, like Django's own)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def _set_user(self, request: HttpRequest) -> None:
        from django.contrib.auth.models import AnonymousUser, User

        user_id = request.headers.get("X-User")
        request.user = User(pk=int(user_id), username=f"user{user_id}") if user_id else AnonymousUser()

    def __call__(self, request: HttpRequest) -> Any:
        self._set_user(request)
        if self.is_async:
            return self._acall(request)
        return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        response: Awaitable[HttpResponse] = self.get_response(request)
        return await response


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok")


def items(request: HttpRequest, user: str) -> HttpResponse:
    return JsonResponse({"user": user, "pid": os.getpid(), "mode": "sync"})


async def aitems(request: HttpRequest, user: str) -> HttpResponse:
    await asyncio.sleep(0)
    return JsonResponse({"user": user, "pid": os.getpid(), "mode": "async"})


def fail(request: HttpRequest, code: int) -> HttpResponse:
    return HttpResponse("failed", status=code)


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("the view failed")


def exempt(request: HttpRequest, rest: str) -> HttpResponse:
    return JsonResponse({"rest": rest})


def ip(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"peer": request.META.get("REMOTE_ADDR")})


def header(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"key": request.headers.get("X-Api-Key")})


def me(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"user": request.user.pk})


async def ame(request: HttpRequest) -> HttpResponse:
    # With AuthenticationMiddleware the lazy request.user may not query on the event loop.
    auser = getattr(request, "auser", None)
    user = await auser() if auser is not None else request.user
    return JsonResponse({"user": user.pk})


def stream(request: HttpRequest, n: int) -> HttpResponse:
    def chunks() -> Iterator[bytes]:
        for i in range(n):
            yield f"chunk {i}\n".encode()

    return StreamingHttpResponse(chunks(), content_type="text/plain")


def route(request: HttpRequest, x: str) -> HttpResponse:
    return JsonResponse({"x": x})


def kw(request: HttpRequest, user: str) -> HttpResponse:
    return JsonResponse({"user": user})


async def login(request: HttpRequest) -> HttpResponse:
    """POST username and password: a session for that user (Django's async auth API)."""
    from django.contrib.auth import aauthenticate, alogin

    user = await aauthenticate(request, username=request.POST["username"], password=request.POST["password"])
    if user is None:
        return JsonResponse({"error": "bad credentials"}, status=403)
    await alogin(request, user)
    return JsonResponse({"user": user.pk})


def metrics(request: HttpRequest) -> HttpResponse:
    from web.wsgi import config

    body, content_type = config.metrics().exposition()
    return HttpResponse(body, content_type=content_type)


def mode(request: HttpRequest) -> HttpResponse:
    """Which limiter each live ratekeeper middleware decides with (AsyncLimiter under ASGI)."""
    from ratekeeper.web.django import RateLimitMiddleware

    found = [o for o in gc.get_objects() if isinstance(o, RateLimitMiddleware)]
    return JsonResponse({"limiters": sorted(type(m.core.limiter).__name__ for m in found)})


# Views behind ``ratekeeper.web.django.ratelimit`` (tests/web/wsgi/test_django_decorator.py).


def _state(request: HttpRequest, mode: str) -> HttpResponse:
    state = request.ratelimit
    remaining = None if state.decision is None else state.decision.remaining
    return JsonResponse({"limited": state.limited, "remaining": remaining, "mode": mode})


@ratelimit(key="ip", rate="3/m")
def rl_block(request: HttpRequest) -> HttpResponse:
    return _state(request, "sync")


@ratelimit(key="user_or_ip", rate="2/m", block=False)
def rl_soft(request: HttpRequest) -> HttpResponse:
    return _state(request, "sync")


@ratelimit(key="post:username", rate="2/m", method="POST", block=False)
def rl_login(request: HttpRequest) -> HttpResponse:
    return _state(request, "sync")


@ratelimit(key="header:x-api-key", rate="4/m", group="shared")
def rl_shared_sync(request: HttpRequest) -> HttpResponse:
    return _state(request, "sync")


@ratelimit(key="header:x-api-key", rate="4/m", group="shared")
async def rl_shared_async(request: HttpRequest) -> HttpResponse:
    await asyncio.sleep(0)
    return _state(request, "async")


@ratelimit(key="header:x-api-key", rate="1/m", block=False)
async def rl_asoft(request: HttpRequest) -> HttpResponse:
    return _state(request, "async")


def rl_denied(request: HttpRequest) -> HttpResponse:
    """The project's denial view (``RATEKEEPER_DENIED_VIEW``)."""
    return JsonResponse({"denied": True, "limited": request.ratelimit.limited}, status=429)
