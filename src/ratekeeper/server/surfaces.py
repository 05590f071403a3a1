"""The two HTTP surfaces of ``ratekeeper serve`` and which routes each one has.

The decision surface answers what a rate-limited application or proxy asks: checks,
peeks, Envoy's ``/json``, health. The admin surface holds what changes or reveals state
beyond one decision: reset, refund, the rules, the metrics, the status page and (only with
``--store-api``) the service as a store. They listen on separate ports so the admin one
can stay on loopback, behind other tokens, or off, while the decision one is exposed.

``/healthz`` and ``/readyz`` answer without a token: probes carry none, and they reveal
nothing but "up".
"""

from __future__ import annotations

from dataclasses import dataclass

from ratekeeper.server.auth import TokenSource

__all__ = [
    "ADMIN",
    "DECISION",
    "OPEN_PATHS",
    "STATUS_PAGE_PATHS",
    "STORE_PATH",
    "Surface",
    "store_namespace",
    "surface_paths",
]

DECISION = "decision"
ADMIN = "admin"

STORE_PATH = "/v1/store"

STATUS_PAGE_PATHS = ("/", "/status/page.js", "/status/page.css", "/status.json", "/status/try")
"""The live status page (``status_page``) on the admin surface: the page, what it reads,
and its form (a peek, which charges nothing)."""

_PATHS = {
    DECISION: ("/v1/check", "/v1/peek", "/json", "/healthz", "/readyz", "/openapi.json"),
    ADMIN: ("/v1/reset", "/v1/refund", "/v1/rules", "/metrics", "/healthz", "/openapi.json", *STATUS_PAGE_PATHS),
}

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
"""Answered without a token on either surface."""


@dataclass(slots=True)
class Surface:
    """One HTTP surface: its name, its paths and the tokens it takes (none: open)."""

    name: str
    tokens: TokenSource
    store_api: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        return surface_paths(self.name, self.store_api)


def surface_paths(name: str, store_api: bool) -> tuple[str, ...]:
    """The routes of surface ``name`` (``DECISION`` or ``ADMIN``): what it serves and what
    its ``/openapi.json`` describes; ``store_api``: whether the admin one has ``/v1/store``."""
    if name not in _PATHS:
        raise ValueError(f"surface is one of {sorted(_PATHS)}, got {name!r}")
    paths = _PATHS[name]
    return (*paths, STORE_PATH) if name == ADMIN and store_api else paths


def store_namespace(token_name: str | None) -> str:
    """Where the rules a store-API client sends keep their state: one namespace per token
    (one fleet), apart from the configured rules."""
    return "store-api" if token_name is None else f"store-api/{token_name}"
