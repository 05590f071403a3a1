"""The servers that ``ratekeeper bench web`` loads with wrk, and what drives them.

One small endpoint (``GET /bench`` answering ``ok`` as text/plain) per framework, in
several variants: the bare app, the app behind ratekeeper's middleware, and the app
behind a peer (slowapi, flask-limiter, django-ratelimit). A server process learns which
variant to build from its environment (``AppConfig.from_env``), so the same factory
serves every case:

- ``starlette_app:create_app`` (uvicorn ``--factory``): bare, ratekeeper (ASGI), slowapi
- ``flask_app:create_app()`` (gunicorn): bare, ratekeeper (WSGI), flask-limiter
- ``django_app:create_app()`` (gunicorn): bare, ratekeeper, django-ratelimit

``servers`` starts and stops those processes; ``wrk`` runs wrk and reads its output.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["PATH", "AppConfig"]

PATH = "/bench"
"""The one endpoint every app serves."""

_PREFIX = "RK_BENCH_WEB_"


@dataclass(frozen=True, slots=True)
class AppConfig:
    """Which variant a server builds and the one limit it enforces on ``PATH``.

    ``count`` requests per ``period`` seconds, per client address (every request of a
    run comes from 127.0.0.1, so one key); ``store`` is ratekeeper's store URL (the
    peers use their own in-memory storage); ``rule`` names ratekeeper's rule, unique per
    run so runs never share state in Redis.
    """

    variant: str
    count: int = 1_000_000
    period: int = 1
    store: str = "memory://"
    rule: str = "bench"

    def to_env(self) -> dict[str, str]:
        """The environment variables that ``from_env`` reads back."""
        return {
            f"{_PREFIX}VARIANT": self.variant,
            f"{_PREFIX}COUNT": str(self.count),
            f"{_PREFIX}PERIOD": str(self.period),
            f"{_PREFIX}STORE": self.store,
            f"{_PREFIX}RULE": self.rule,
        }

    @classmethod
    def from_env(cls) -> AppConfig:
        """The configuration a server was started with (``KeyError`` when none was given)."""
        env = os.environ
        return cls(
            variant=env[f"{_PREFIX}VARIANT"],
            count=int(env[f"{_PREFIX}COUNT"]),
            period=int(env[f"{_PREFIX}PERIOD"]),
            store=env[f"{_PREFIX}STORE"],
            rule=env[f"{_PREFIX}RULE"],
        )

    @property
    def ratekeeper_limit(self) -> str:
        """The limit as ratekeeper parses it: ``"1000000/1s"``."""
        return f"{self.count}/{self.period}s"

    @property
    def limits_limit(self) -> str:
        """The limit as the ``limits`` package (slowapi, flask-limiter) parses it."""
        return f"{self.count} per {self.period} second"

    @property
    def django_rate(self) -> str:
        """The limit as django-ratelimit parses it: ``"1000000/1s"``."""
        return f"{self.count}/{self.period}s"

    def ratekeeper_rules(self) -> list[Any]:
        """ratekeeper's rules: one rule on every request, keyed by ``{client_ip}`` as the
        peers key theirs by the remote address (a bare ``Rule`` would charge one global
        key and skip reading the address)."""
        from ratekeeper import Rule
        from ratekeeper.config import HttpRule, KeyTemplate

        return [HttpRule(Rule(self.rule, [self.ratekeeper_limit]), key=KeyTemplate.parse("{client_ip}"))]

    def unknown(self, framework: str) -> ValueError:
        """The error for a variant that ``framework``'s app does not have."""
        return ValueError(f"the {framework} bench app has no variant {self.variant!r}")
