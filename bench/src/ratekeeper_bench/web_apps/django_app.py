"""The Django app of ``ratekeeper bench web``, served by gunicorn (``django_app:create_app()``).

A project in one module: settings made in code, one URL, one view, no middleware but
the one measured. Variants: ``bare``; ``ratekeeper``: ratekeeper's Django middleware
(``ratekeeper.web.django.RateLimitMiddleware``, ``settings.RATEKEEPER``) when that module
exists, else Django's WSGI app wrapped in ``WSGIRateLimitMiddleware``; ``django-ratelimit``:
the view decorated with ``@ratelimit(key="ip", ...)`` on the local-memory cache, its
``RatelimitMiddleware`` answering 429 through ``RATELIMIT_VIEW``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

from ratekeeper_bench.web_apps import PATH, AppConfig

__all__ = ["VARIANTS", "create_app", "denied", "has_django_middleware", "ok", "urlpatterns"]

VARIANTS = ("bare", "ratekeeper", "django-ratelimit")

urlpatterns: list[Any] = []
"""Filled by ``create_app`` (this module is the ``ROOT_URLCONF``)."""


def ok(request: Any) -> Any:
    from django.http import HttpResponse  # type: ignore[import-untyped,unused-ignore]

    return HttpResponse("ok", content_type="text/plain")


def denied(request: Any, exception: BaseException | None = None) -> Any:
    """django-ratelimit's ``RATELIMIT_VIEW``: the 429 its middleware answers with."""
    from django.http import HttpResponse  # type: ignore[import-untyped,unused-ignore]

    return HttpResponse("rate limited", status=429, content_type="text/plain")


def has_django_middleware() -> bool:
    """Whether ratekeeper has its Django middleware here (else the WSGI one is measured)."""
    try:
        return importlib.util.find_spec("ratekeeper.web.django") is not None
    except ImportError:
        return False


def create_app() -> Callable[..., Any]:
    """The WSGI app for the variant in the environment (``AppConfig.from_env``)."""
    config = AppConfig.from_env()
    from django.conf import settings  # type: ignore[import-untyped,unused-ignore]
    from django.urls import path  # type: ignore[import-untyped,unused-ignore]

    middleware: list[str] = []
    extra: dict[str, Any] = {}
    view: Callable[..., Any] = ok
    wrap = False
    if config.variant == "ratekeeper":
        rules = config.ratekeeper_rules()
        if has_django_middleware():
            middleware.append("ratekeeper.web.django.RateLimitMiddleware")
            extra["RATEKEEPER"] = {"rules": rules, "store": config.store}
        else:
            wrap = True
    elif config.variant == "django-ratelimit":
        from django_ratelimit.decorators import ratelimit  # type: ignore[import-untyped,unused-ignore]

        middleware.append("django_ratelimit.middleware.RatelimitMiddleware")
        extra["RATELIMIT_VIEW"] = f"{__name__}.denied"
        view = ratelimit(key="ip", rate=config.django_rate, block=True)(ok)
    elif config.variant != "bare":
        raise config.unknown("Django")
    settings.configure(
        DEBUG=False,
        SECRET_KEY="ratekeeper-bench-web",
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        MIDDLEWARE=middleware,
        INSTALLED_APPS=[],
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        USE_TZ=True,
        **extra,
    )
    urlpatterns.append(path(PATH.lstrip("/"), view))
    from django.core.wsgi import get_wsgi_application  # type: ignore[import-untyped,unused-ignore]

    app: Callable[..., Any] = get_wsgi_application()
    if wrap:
        from ratekeeper.web import WSGIRateLimitMiddleware

        app = WSGIRateLimitMiddleware(app, rules=config.ratekeeper_rules(), store=config.store)
    return app
