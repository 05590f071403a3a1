"""The Flask app of ``ratekeeper bench web``, served by gunicorn (``flask_app:create_app()``).

Variants: ``bare``; ``ratekeeper``: the WSGI app wrapped in
``ratekeeper.web.WSGIRateLimitMiddleware`` with one ``Rule`` on ``AppConfig.store``;
``flask-limiter``: the endpoint decorated with flask-limiter's ``Limiter.limit`` on its
memory storage.
"""

from __future__ import annotations

from flask import Flask

from ratekeeper_bench.web_apps import PATH, AppConfig

__all__ = ["VARIANTS", "create_app"]

VARIANTS = ("bare", "ratekeeper", "flask-limiter")


def _ok() -> tuple[str, int, dict[str, str]]:
    return "ok", 200, {"Content-Type": "text/plain"}


def create_app() -> Flask:
    """The app for the variant in the environment (``AppConfig.from_env``)."""
    config = AppConfig.from_env()
    app = Flask(__name__)
    if config.variant == "bare":
        app.add_url_rule(PATH, "ok", _ok)
    elif config.variant == "ratekeeper":
        from ratekeeper.web import WSGIRateLimitMiddleware

        app.add_url_rule(PATH, "ok", _ok)
        rules = config.ratekeeper_rules()
        app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, rules=rules, store=config.store)  # type: ignore[method-assign]
    elif config.variant == "flask-limiter":
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address

        limiter = Limiter(get_remote_address, app=app, storage_uri="memory://")
        app.add_url_rule(PATH, "ok", limiter.limit(config.limits_limit)(_ok))
    else:
        raise config.unknown("Flask")
    return app
