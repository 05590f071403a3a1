"""Rate limits for Django, sync or async::

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",  # before: for {user}
        "ratekeeper.web.django.RateLimitMiddleware",
        ...,
    ]
    RATEKEEPER = {"rules": "rules.yaml", "store": "memory://"}

``settings.RATEKEEPER`` holds ``rules`` and ``store`` and any option of
the web core (``ratekeeper.web.base``: ``refund_statuses``, ``exempt_paths``,
``trusted_proxies``, ``shadow``, ...). A relative ``rules`` path is taken from
``settings.BASE_DIR`` when the settings define it. ``settings.RATEKEEPER_HEADER_NAMES``
is the same as ``RATEKEEPER["header_names"]`` (the rate-limit fields under other names),
as Flask's ``RATEKEEPER_HEADER_NAMES``: give one of them.

The middleware is both sync- and async-capable, as Django documents: when the rest of the
chain is async (ASGI with async views) it is a coroutine function deciding with an
``AsyncRateLimitCore`` (an ``AsyncLimiter``) on the event loop; otherwise it decides with
a ``RateLimitCore`` (the blocking ``Limiter``).
Django never mixes the two in one handler, so one instance uses one of them.

A denied request gets the core's 429 before any view or later middleware runs. An
allowed one gets the rate-limit headers on whatever the view answers (Django turns a
view's exception into a 500 response before it reaches this middleware, so error pages
carry them too); its charges are given back when the status is in ``refund_statuses``
(and concurrency leases released) as soon as the view has answered, before a streamed
body is sent. What a response cost (``response_cost``: a header of the view's response,
or what the view added to ``ratekeeper.web.usage(request)``) is settled when the view has
answered, or for a ``StreamingHttpResponse`` when Django closes it (after the last chunk,
or when the client went away: what was streamed so far).

What the rules see: ``request.path`` (with the script prefix), ``REMOTE_ADDR`` as the
peer, the request's headers, ``{user}`` = the primary key of ``request.user`` when it is
authenticated (``await request.auser()`` in async mode), ``{route}`` = Django's route
pattern (``"items/<str:user>"``) and the view's keyword arguments as path parameters for
``{path.x}`` (a rule's own path template wins); the last two come from resolving the
path, done only when a rule needs them.

``ratelimit`` limits one view without rules or middleware, as django-ratelimit's
decorator does (see its docstring).
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from asgiref.sync import AsyncToSync, async_to_sync, iscoroutinefunction, markcoroutinefunction, sync_to_async

from ratekeeper.config.model import HttpRule
from ratekeeper.config.sources import rules_from
from ratekeeper.decision import Decision
from ratekeeper.errors import ConfigurationError
from ratekeeper.keys import bounded_key
from ratekeeper.limiter.limiter import Limiter
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.rule import Rule
from ratekeeper.stores.url import open_store
from ratekeeper.web.base import BaseRateLimitCore
from ratekeeper.web.client_ip import ClientAddress, client_address
from ratekeeper.web.core import RateLimitCore
from ratekeeper.web.core_async import AsyncRateLimitCore
from ratekeeper.web.headers import HeaderOptions, header_options, rate_limit_headers, retry_after_seconds
from ratekeeper.web.keyable import Provides, django_user_lack
from ratekeeper.web.problem import PROBLEM_CONTENT_TYPE, problem_body
from ratekeeper.web.request import LazyHeaders, RequestView, Verdict
from ratekeeper.web.settle import ResponseRecord

if TYPE_CHECKING:
    from django.http import HttpRequest, HttpResponseBase  # type: ignore[import-untyped]

__all__ = ["ALL", "UNSAFE", "RateLimitMiddleware", "RateLimitState", "ratelimit", "request_view", "settings_options"]


GetResponse = Callable[["HttpRequest"], Any]


def settings_options() -> dict[str, Any]:
    """The middleware's options from ``settings.RATEKEEPER`` (a copy, with ``rules`` resolved)."""
    from django.conf import settings  # type: ignore[import-untyped]

    conf = getattr(settings, "RATEKEEPER", None)
    if not isinstance(conf, Mapping) or "rules" not in conf:
        raise ConfigurationError(
            "ratekeeper.web.django.RateLimitMiddleware needs settings.RATEKEEPER, a dict with at least "
            "'rules', e.g. RATEKEEPER = {'rules': 'rules.yaml', 'store': 'memory://'}"
        )
    options = dict(conf)
    names = _header_names_setting(settings, options)
    if names is not None:
        options["header_names"] = names
    rules = options["rules"]
    base = getattr(settings, "BASE_DIR", None)
    if isinstance(rules, str) and base is not None and not Path(rules).is_absolute():
        options["rules"] = str(Path(base) / rules)
    elif not isinstance(rules, str | os.PathLike):  # read here, so a problem names the setting
        options["rules"] = rules_from(rules, source="settings.RATEKEEPER['rules']")
    return options


def _header_names_setting(settings: Any, conf: Mapping[str, Any]) -> Any:
    """``settings.RATEKEEPER_HEADER_NAMES`` or ``RATEKEEPER["header_names"]``, given once."""
    names = getattr(settings, "RATEKEEPER_HEADER_NAMES", None)
    if names is None:
        return conf.get("header_names")
    if "header_names" in conf:
        raise ConfigurationError(
            "the header names are given twice, as settings.RATEKEEPER_HEADER_NAMES and as "
            "RATEKEEPER['header_names']: keep one"
        )
    return names


@functools.cache
def _decorator_headers() -> HeaderOptions:
    """The rate-limit headers of ``ratelimit``'s 429, as the middleware sends them: the
    header switches of ``settings.RATEKEEPER`` and its header names; read once a process."""
    from django.conf import settings

    conf = getattr(settings, "RATEKEEPER", None)
    conf = conf if isinstance(conf, Mapping) else {}
    return header_options({**conf, "header_names": _header_names_setting(settings, conf)})


def django_provides() -> Provides:
    """What key templates get here: ``{user}`` as ``settings.MIDDLEWARE`` allows (only a
    middleware listed before this one can set ``request.user``: ``keyable.django_user_lack``)."""
    from django.conf import settings

    lack = django_user_lack(getattr(settings, "MIDDLEWARE", None) or ())
    return Provides("the Django middleware", {} if lack is None else {"user": lack})


def _user_id(user: Any) -> str | None:
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = getattr(user, "pk", None)
    return None if pk is None else str(pk)


_UNPREFIXED = frozenset({"content-type", "content-length"})


class _Headers(LazyHeaders):
    """``request.headers`` with lower-case names, as the core reads them, looked up in
    ``request.META`` one at a time: a request's rules read a header or two, and Django
    builds ``request.headers`` from every entry of ``META``. A name that cannot be looked
    up directly (``content-type`` and ``content-length``, which are also unprefixed in
    ``META``; one with ``_`` or beyond ASCII) and a walk over every name read
    ``request.headers`` itself."""

    __slots__ = ("_all", "_request")

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._all: dict[str, str] | None = None

    def every(self) -> dict[str, str]:
        if self._all is None:
            self._all = {k.lower(): v for k, v in self._request.headers.items()}
        return self._all

    def get(self, name: str, default: Any = None) -> Any:
        if self._all is not None or name in _UNPREFIXED or "_" in name or not name.isascii():
            return self.every().get(name, default)
        if name != name.lower():
            return default  # every name of the mapping is lower-case
        return self._request.META.get("HTTP_" + name.upper().replace("-", "_"), default)


class _Lazy(_Headers):
    """What the core reads of a request only when a rule needs it, in one object a
    request: its headers (``_Headers``), its URL resolution (``route``, ``path_params``:
    resolved once, on the first call) and its user (``user``)."""

    __slots__ = ("_match",)

    def __init__(self, request: HttpRequest) -> None:
        self._request = request
        self._all = None
        self._match: Any = False  # False: not resolved yet; None: no URL pattern matched

    def match(self) -> Any:
        if self._match is False:
            from django.urls import Resolver404, resolve  # type: ignore[import-untyped]

            try:
                self._match = resolve(self._request.path_info, getattr(self._request, "urlconf", None))
            except Resolver404:
                self._match = None
        return self._match

    def route(self) -> str | None:
        match = self.match()
        return None if match is None else str(match.route) or None

    def path_params(self) -> Mapping[str, str]:
        match = self.match()
        return {} if match is None else {k: str(v) for k, v in match.kwargs.items()}

    def user(self) -> str | None:
        return _user_id(getattr(self._request, "user", None))


def request_view(request: HttpRequest, user: str | Callable[[], str | None] | None = None) -> RequestView:
    """What the core sees of ``request``; ``user`` (a value or a callable) defaults to
    ``request.user``'s primary key, read only when a rule needs ``{user}``."""
    meta = request.META
    lazy = _Lazy(request)
    return RequestView(
        method=request.method or "GET",
        path=request.path,
        host=meta.get("HTTP_HOST") or meta.get("SERVER_NAME"),
        headers=lazy,
        query_string=meta.get("QUERY_STRING", ""),
        peer=meta.get("REMOTE_ADDR") or None,
        user=user if user is not None else lazy.user,
        route=lazy.route,
        path_params=lazy.path_params,
        native=request,
    )


class RateLimitMiddleware:
    """Django middleware over the web core (see the module docstring)."""

    sync_capable = True
    async_capable = True

    sync_core: RateLimitCore
    """The core of a blocking chain (only then set)."""
    async_core: AsyncRateLimitCore
    """The core of an async chain (only then set)."""

    def __init__(self, get_response: GetResponse) -> None:
        from django.http import HttpResponse

        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        self.core: BaseRateLimitCore[Any]
        if self.is_async:
            markcoroutinefunction(self)
            self.core = self.async_core = AsyncRateLimitCore(**settings_options(), provides=django_provides())
        else:
            self.core = self.sync_core = RateLimitCore(**settings_options(), provides=django_provides())
        # read once here, not on every request: the core's metrics are fixed at its start, and
        # ``from django.http import ...`` in a function runs importlib's fromlist handling per call
        self._metrics = self.core.metrics
        self._response_class: type[HttpResponseBase] = HttpResponse
        self._user_rules: tuple[object, tuple[HttpRule, ...]] = (None, ())
        """(the rules in force, those of them whose key or cost reads ``{user}``)."""

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._acall(request)
        if self._metrics is not None:
            self._metrics.request("django")
        view = request_view(request)
        verdict = self.sync_core.check(view)
        if not verdict.allowed:
            return _deny(verdict, self._response_class)
        response = self.get_response(request)
        _add_headers(response, verdict)
        if self.core.needs_finish(verdict):
            status = response.status_code
            record = _record(self.core, verdict, view, request, response)
            if record is not None and response.streaming:
                # settled when Django closes the streamed response (also when the client went away)
                response._resource_closers.append(lambda: self.sync_core.finish(verdict, status, record))
            else:
                self.sync_core.finish(verdict, status, record)
        return response

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        if self._metrics is not None:
            self._metrics.request("django")
        user = await self._async_user(request) if self._needs_user(request) else None
        view = request_view(request, user)
        verdict = await self.async_core.check(view)
        if not verdict.allowed:
            return _deny(verdict, self._response_class)
        answer: Awaitable[HttpResponseBase] = self.get_response(request)
        response = await answer
        _add_headers(response, verdict)
        if self.core.needs_finish(verdict):
            status = response.status_code
            record = _record(self.core, verdict, view, request, response)
            if record is not None and response.streaming:
                # Django closes the response from a worker thread (sync_to_async): the
                # settlement runs back on this event loop, where the AsyncLimiter lives.
                finish = async_to_sync(self.async_core.finish)
                response._resource_closers.append(lambda: finish(verdict, status, record))
            else:
                await self.async_core.finish(verdict, status, record)
        return response

    def _needs_user(self, request: HttpRequest) -> bool:
        """Whether a rule that matches ``request`` reads ``{user}``: then the async path loads
        the user before deciding (``request.user`` may not query the database on the event
        loop), and only then."""
        if self.core.user is not None:
            return False
        rules = self.core.rules
        seen, user_rules = self._user_rules
        if seen is not rules:  # worked out once per version of the rules, not per request
            user_rules = tuple(r for r in rules if _reads_user(r))
            self._user_rules = (rules, user_rules)
        if not user_rules:
            return False
        method, path, host = request.method or "GET", request.path, request.META.get("HTTP_HOST")
        return any(rule.match.match(method, path, host) is not None for rule in user_rules)

    @staticmethod
    async def _async_user(request: HttpRequest) -> str | Callable[[], str | None]:
        auser = getattr(request, "auser", None)
        if auser is not None:
            # AuthenticationMiddleware's loader; an empty id is "no user" to the core.
            return _user_id(await auser()) or ""
        return lambda: _user_id(getattr(request, "user", None))


def _reads_user(rule: HttpRule) -> bool:
    """Whether ``rule``'s key or cost template reads ``{user}``."""
    cost = rule.cost
    needs = rule.key.needs if isinstance(cost, int) else (*rule.key.needs, *cost.needs)
    return ("user", None) in needs


def _record(
    core: BaseRateLimitCore[Any], verdict: Verdict, view: RequestView, request: HttpRequest, response: HttpResponseBase
) -> ResponseRecord | None:
    """The response as ``response_cost`` settles it (None: nothing to settle); the app's
    ``usage(request)`` meter is kept in ``request.META``."""
    record = core.response_record(verdict, view, request.META)
    if record is not None:
        record.started(response.status_code, response.items())
    return record


def _add_headers(response: HttpResponseBase, verdict: Verdict) -> None:
    headers = verdict.headers
    if not headers:
        return
    store = _header_store(response)
    for name, value in headers:
        key = _KEYS.get(name)
        if store is not None and key is not None and value.isascii() and value.isprintable():
            store[key] = (name, value)
            continue
        response[name] = value  # Django's checks: a name not seen yet, a value to encode or refuse
        if key is None and name.isascii() and name.isprintable() and len(_KEYS) < _MAX_KEYS:
            _KEYS[name] = name.lower()


def _deny(verdict: Verdict, response_class: Callable[..., HttpResponseBase]) -> HttpResponseBase:
    """The refusal as ``response_class`` (Django's ``HttpResponse``) answers it."""
    # The core's own refusal names its Content-Type: given to the constructor, it spares
    # Django working out its default (text/html and the settings' charset), and the header
    # loop sets the same name and value again. A ``deny_response`` may name none: Django's default.
    content_type = PROBLEM_CONTENT_TYPE if _PROBLEM_TYPE in verdict.headers else None
    response = response_class(verdict.body, content_type=content_type, status=verdict.status)
    _add_headers(response, verdict)
    return response


# Django's ``response[name] = value`` checks every name and value (``ResponseHeaders.
# _convert_to_charset``: an encoding attempt and a search for line breaks each) and lower-
# cases the name: a third of what the middleware added to an admitted request. The core's
# names are a handful of fixed tokens and its values printable ASCII, which those checks
# pass unchanged; so a name Django has accepted once, with a printable ASCII value, goes
# straight into the headers' store, keyed as Django keys it. Anything else (a name not
# seen yet, a value with a control character or beyond ASCII) goes through Django.

_PROBLEM_TYPE = ("Content-Type", PROBLEM_CONTENT_TYPE)
"""The Content-Type header of the core's refusals."""

_KEYS: dict[str, str] = {}
"""Each header name Django accepted, to its key in ``ResponseHeaders._store`` (lower case)."""
_MAX_KEYS = 64  # names come from the configuration, not from clients; bounded all the same

_DIRECT: list[Any] = []
"""Once found (by ``_header_store``'s probe): ``[ResponseHeaders]`` when its store is laid
out as ``_store[name.lower()] = (name, value)`` (Django 3.2 to 5.x), ``[None]`` when not."""


def _header_store(response: HttpResponseBase) -> dict[str, tuple[str, str]] | None:
    """``response``'s header store when it is Django's own ``ResponseHeaders`` with the layout
    ``_DIRECT`` describes; None: every header goes through ``response[name] = value``."""
    if not _DIRECT:
        from django.http.response import ResponseHeaders  # type: ignore[import-untyped]

        probe = ResponseHeaders({})
        probe["X-RateLimit-Probe"] = "1"
        layout = getattr(probe, "_store", None)
        _DIRECT.append(ResponseHeaders if layout == {"x-ratelimit-probe": ("X-RateLimit-Probe", "1")} else None)
    direct = _DIRECT[0]
    headers = response.headers
    if direct is None or type(headers) is not direct:
        return None
    store: dict[str, tuple[str, str]] = headers._store
    return store


# The per-view decorator: django-ratelimit's ``@ratelimit`` over this library's limiters.

ALL: tuple[str, ...] | None = None
"""``method=ALL``: every request counts."""
UNSAFE: tuple[str, ...] = ("DELETE", "PATCH", "POST", "PUT")
"""``method=UNSAFE``: only requests that may change state count."""

KeyFunction = Callable[[str, "HttpRequest"], "str | None"]


class RateLimitState:
    """What ``@ratelimit`` leaves on ``request.ratelimit``: ``limited`` (the request was
    over the rate) and ``decision`` (the limiter's ``Decision``; None when the request
    was not counted: its method is not limited or its key is empty)."""

    __slots__ = ("decision", "limited")

    def __init__(self, limited: bool, decision: Decision | None) -> None:
        self.limited = limited
        self.decision = decision

    def __repr__(self) -> str:
        return f"RateLimitState(limited={self.limited!r}, decision={self.decision!r})"


class _Limiters:
    """One store per process for every decorated view: the blocking ``Limiter`` decides for
    sync views, the ``AsyncLimiter`` for async ones, over the same store URL; on
    ``memory://`` both wrap one ``MemoryStore``, so the two kinds of view share one budget.

    A server store's ``AsyncLimiter`` keeps connections bound to the event loop it first
    ran on, its home. Under WSGI, Django runs each async view on an event loop of its own
    (asgiref's ``async_to_sync``), which ends with the request: there the blocking
    ``Limiter`` decides, on that loop's private thread, so no connection outlives its loop.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pair: tuple[Limiter, AsyncLimiter] | None = None
        self._home: asyncio.AbstractEventLoop | None = None

    def _open(self) -> tuple[Limiter, AsyncLimiter]:
        with self._lock:
            if self._pair is None:
                from django.conf import settings

                conf = getattr(settings, "RATEKEEPER", None)
                conf = conf if isinstance(conf, Mapping) else {}
                url, on_error = conf.get("store", "memory://"), conf.get("on_error", "allow")
                if isinstance(url, str) and urlsplit(url).scheme.lower() == "memory":
                    url = open_store(url)  # one memory store for both limiters
                self._pair = (Limiter(url, on_error=on_error), AsyncLimiter(url, on_error=on_error))
            return self._pair

    def sync(self) -> Limiter:
        return (self._pair or self._open())[0]

    def on_this_loop(self) -> AsyncLimiter | None:
        """The ``AsyncLimiter`` when the running loop is its home (claimed by the first loop
        that is not one of ``async_to_sync``'s own), else None: decide with ``sync()``."""
        loop = asyncio.get_running_loop()
        if self._home is None and loop not in getattr(AsyncToSync, "loop_thread_executors", {}):
            self._home = loop
        return (self._pair or self._open())[1] if loop is self._home else None


_limiters = _Limiters()


_CLIENTS: dict[tuple[Any, ...], ClientAddress] = {}
"""The ``ClientAddress`` of each client-address configuration seen in the settings (a
process has one; tests switch between a few)."""


def _client_address() -> ClientAddress:
    """How the decorator finds a client: the middleware's settings (``RATEKEEPER``:
    ``trusted_proxies``, ``forwarded_header``, ``trusted_hops``, ``ipv6_prefix``), so that
    the decorator and the middleware key a client alike, behind proxies too; without
    them the TCP peer, IPv6 grouped by /64 (a host holds a whole /64: keying single
    addresses would give it 2**64 budgets)."""
    from django.conf import settings

    conf = getattr(settings, "RATEKEEPER", None)
    conf = conf if isinstance(conf, Mapping) else {}
    proxies = conf.get("trusted_proxies")
    spec = (
        proxies if proxies is None or isinstance(proxies, str) else tuple(proxies),
        conf.get("forwarded_header", "x-forwarded-for"),
        conf.get("trusted_hops", 1),
        conf.get("ipv6_prefix", 64),
    )
    client = _CLIENTS.get(spec)
    if client is None:
        client = client_address(conf)
        if len(_CLIENTS) >= 16:
            _CLIENTS.clear()
        _CLIENTS[spec] = client
    return client


def _peer(group: str, request: HttpRequest) -> str | None:
    client = _client_address()
    _address, key = client.resolve(
        request.META.get("REMOTE_ADDR") or None, lambda: request.headers.get(client.forwarded_header)
    )
    return key


def _user(group: str, request: HttpRequest) -> str | None:
    return _user_id(getattr(request, "user", None))


def _user_or_ip(group: str, request: HttpRequest) -> str | None:
    user = _user(group, request)
    if user is not None:
        return "user:" + user
    peer = _peer(group, request)
    return None if peer is None else "ip:" + peer


_NAMED_KEYS: dict[str, KeyFunction] = {"ip": _peer, "user": _user, "user_or_ip": _user_or_ip}


def _key_function(key: str | KeyFunction) -> KeyFunction:
    """``key`` as a function of ``(group, request)``, as django-ratelimit names keys."""
    if callable(key):
        return key
    if key in _NAMED_KEYS:
        return _NAMED_KEYS[key]
    kind, _, name = key.partition(":")
    if name:
        if kind == "header":
            return lambda group, request: request.headers.get(name)
        if kind == "post":
            return lambda group, request: request.POST.get(name)
        if kind == "get":
            return lambda group, request: request.GET.get(name)
    raise ConfigurationError(
        f"unknown ratelimit key {key!r}; expected ip, user, user_or_ip, header:<name>, post:<field>, "
        "get:<field> or a callable (group, request) -> str"
    )


def _denial(decision: Decision, rule: Rule) -> HttpResponseBase:
    """Our answer to a refused request: problem+json with the rate-limit headers."""
    from django.http import HttpResponse

    response = HttpResponse(problem_body([decision], retry_after_seconds([decision])), status=429)
    response["Content-Type"] = PROBLEM_CONTENT_TYPE
    for name, value in rate_limit_headers([(rule, decision)], allowed=False, options=_decorator_headers()):
        response[name] = value
    return response


def _denied_view() -> Callable[..., Any] | None:
    from django.conf import settings
    from django.utils.module_loading import import_string  # type: ignore[import-untyped]

    name = getattr(settings, "RATEKEEPER_DENIED_VIEW", None)
    if not name:
        return None
    view: Callable[..., Any] = import_string(name) if isinstance(name, str) else name
    return view


def ratelimit(
    key: str | KeyFunction = "user_or_ip",
    rate: str | Sequence[str] = "60/m",
    *,
    block: bool = True,
    method: str | Iterable[str] | None = ALL,
    group: str | None = None,
    cost: int = 1,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Limit one Django view, sync or async, as django-ratelimit's decorator does::

        @ratelimit(key="post:username", rate="5/m", method="POST", block=False)
        def login(request): ...
            if request.ratelimit.limited: ...  # e.g. ask for a captcha

    ``rate`` is a limit string (``"5/m"``, ``"100/h"``, ``"5/minute"``) or a list of them;
    ``key`` is ``"ip"`` (``REMOTE_ADDR``), ``"user"`` (the primary key of an authenticated
    ``request.user``), ``"user_or_ip"``, ``"header:<name>"``, ``"post:<field>"``,
    ``"get:<field>"``, or a callable ``(group, request)`` answering the key. A request
    whose key is empty (no such header, an anonymous ``user``) or whose method is not in
    ``method`` (a name or a list of them; ``ALL`` by default, ``UNSAFE`` for the
    state-changing ones) is not counted. Views with one ``group`` (the view's dotted name
    by default) and one ``rate`` share one budget per key.

    Every request gets ``request.ratelimit`` (a ``RateLimitState``). Over the rate with
    ``block=True`` the view is not called: ``settings.RATEKEEPER_DENIED_VIEW`` (a view or
    its dotted path, called with the request) answers when set, else a 429 problem+json
    with the rate-limit headers (as the middleware sends them: ``settings.RATEKEEPER``'s
    header switches and ``header_names``, checked when the view is decorated). With
    ``block=False`` the view is called and decides.

    Sync views decide with a ``Limiter``, async views with an ``AsyncLimiter``, both on
    ``settings.RATEKEEPER["store"]`` (``memory://`` when unset, one store shared by both)
    with its ``on_error`` (``"allow"`` when unset).
    """
    key_of = _key_function(key)
    from django.conf import settings

    if settings.configured:  # views are imported with the URLconf: a bad header mapping fails the start
        _decorator_headers()
    methods = (
        None if method is None else frozenset(m.upper() for m in ([method] if isinstance(method, str) else method))
    )
    limits = [rate] if isinstance(rate, str) else list(rate)

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        rule = Rule(group or f"{view.__module__}.{view.__qualname__}", limits)

        def key_for(request: HttpRequest) -> str | None:
            if methods is not None and (request.method or "GET").upper() not in methods:
                return None
            value = key_of(rule.name, request)
            return bounded_key(value) if value else None

        def blocked(request: HttpRequest, decision: Decision | None) -> Decision | None:
            """Sets ``request.ratelimit``; the decision when the view is not to be called."""
            limited = decision is not None and not decision.allowed
            request.ratelimit = RateLimitState(limited, decision)
            return decision if limited and block else None

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                if key in ("user", "user_or_ip") and getattr(request, "auser", None) is not None:
                    request.user = await request.auser()  # the lazy user may not query on the loop
                value = key_for(request)
                decision = None
                if value is not None:
                    limiter = _limiters.on_this_loop()
                    if limiter is None:
                        decision = _limiters.sync().try_acquire(rule, value, cost)
                    else:
                        decision = await limiter.try_acquire(rule, value, cost)
                refused = blocked(request, decision)
                if refused is not None:
                    denied = _denied_view()
                    if denied is None:
                        return _denial(refused, rule)
                    return await (denied if iscoroutinefunction(denied) else sync_to_async(denied))(request)
                return await view(request, *args, **kwargs)

            return async_wrapper

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            value = key_for(request)
            decision = None if value is None else _limiters.sync().try_acquire(rule, value, cost)
            refused = blocked(request, decision)
            if refused is not None:
                denied = _denied_view()
                if denied is None:
                    return _denial(refused, rule)
                return (async_to_sync(denied) if iscoroutinefunction(denied) else denied)(request)
            return view(request, *args, **kwargs)

        return wrapper

    return decorate
