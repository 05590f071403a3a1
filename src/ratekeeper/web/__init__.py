"""HTTP integrations: ASGI and WSGI middleware, Django, FastAPI, over one
request-to-decision core (``ratekeeper.web.base``: ``RateLimitCore`` and
``AsyncRateLimitCore``). See docs/web.md for their use and
docs/architecture.md for what may import what.

Names are imported lazily, so using one integration never imports another's framework.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ratekeeper.web.asgi import RateLimitMiddleware
    from ratekeeper.web.core import RateLimitCore
    from ratekeeper.web.core_async import AsyncRateLimitCore
    from ratekeeper.web.request import RequestView, Verdict
    from ratekeeper.web.settle import Usage, usage
    from ratekeeper.web.wsgi import WSGIRateLimitMiddleware

__all__ = [
    "AsyncRateLimitCore",
    "RateLimitCore",
    "RateLimitMiddleware",
    "RequestView",
    "Usage",
    "Verdict",
    "WSGIRateLimitMiddleware",
    "usage",
]

_WHERE = {
    "RateLimitMiddleware": "ratekeeper.web.asgi",
    "AsyncRateLimitCore": "ratekeeper.web.core_async",
    "RateLimitCore": "ratekeeper.web.core",
    "RequestView": "ratekeeper.web.request",
    "Verdict": "ratekeeper.web.request",
    "Usage": "ratekeeper.web.settle",
    "usage": "ratekeeper.web.settle",
    "WSGIRateLimitMiddleware": "ratekeeper.web.wsgi",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ratekeeper.web' has no attribute {name!r}")
    return getattr(import_module(module), name)
