"""The Flask extension (``ratekeeper.web.flask.RateLimiter``) served by werkzeug's real server.

Each test builds its own Flask app and serves it on a free loopback port from a thread
(``werkzeug.serving.make_server``); requests go over HTTP with httpx. The store is the
memory store and Redis (a prefix of its own per test).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Blueprint, Flask, jsonify

from ratekeeper import Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.errors import ConfigurationError
from ratekeeper.web.flask import RateLimiter, RateLimitExceeded, path_template
from servers import wait_until
from web.wsgi.flask_serving import serving


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest, key_prefix: str) -> str:
    """Each store the extension is tried on."""
    return "memory://" if request.param == "memory" else f"redis://127.0.0.1:6379/0?prefix={key_prefix}"


def make_app(store: str, setup: Callable[[Flask, RateLimiter], None], **config: Any) -> Flask:
    app = Flask(__name__)
    app.config["RATEKEEPER_STORE"] = store
    app.config.update(config)
    limiter = RateLimiter()
    setup(app, limiter)
    limiter.init_app(app)
    return app


def test_a_decorated_route_admits_its_limit_then_answers_429_with_headers(store: str) -> None:
    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/items/<int:n>")
        @limiter.limit("2/minute")
        def items(n: int) -> Any:
            return jsonify(n=n)

        @app.get("/free")
        def free() -> str:
            return "free"

    with serving(make_app(store, setup)) as client:
        first = client.get("/items/1")
        assert first.status_code == 200
        assert first.json() == {"n": 1}
        assert first.headers["X-RateLimit-Limit"] == "2"
        assert first.headers["X-RateLimit-Remaining"] == "1"
        assert client.get("/items/2").status_code == 200
        denied = client.get("/items/3")
        assert denied.status_code == 429
        assert denied.headers["content-type"].startswith("application/problem+json")
        assert int(denied.headers["Retry-After"]) > 0
        assert denied.headers["X-RateLimit-Remaining"] == "0"
        assert denied.json()["status"] == 429
        free = client.get("/free")  # no rule: no headers
        assert free.status_code == 200
        assert "X-RateLimit-Limit" not in free.headers


def test_a_blueprint_limit_is_shared_by_its_routes_and_leaves_other_routes_alone(store: str) -> None:
    def setup(app: Flask, limiter: RateLimiter) -> None:
        admin = Blueprint("admin", __name__, url_prefix="/admin")

        @admin.get("/a")
        def a() -> str:
            return "a"

        @admin.get("/b")
        def b() -> str:
            return "b"

        limiter.limit("3/minute")(admin)
        app.register_blueprint(admin)

        @app.get("/public")
        def public() -> str:
            return "public"

    with serving(make_app(store, setup)) as client:
        assert [client.get(p).status_code for p in ("/admin/a", "/admin/b", "/admin/a", "/admin/b")] == [
            200,
            200,
            200,
            429,
        ]
        assert all(client.get("/public").status_code == 200 for _ in range(5))


def test_exempt_routes_and_blueprints_escape_even_the_app_wide_rules(store: str) -> None:
    everyone = HttpRule(Rule("everyone", "2/minute"), key=KeyTemplate.parse("{client_ip}"))

    def setup(app: Flask, limiter: RateLimiter) -> None:
        ops = Blueprint("ops", __name__, url_prefix="/ops")

        @ops.get("/ping")
        def ping() -> str:
            return "pong"

        limiter.exempt(ops)
        app.register_blueprint(ops)

        @app.get("/health")
        @limiter.exempt
        def health() -> str:
            return "ok"

        @app.get("/page")
        def page() -> str:
            return "page"

    with serving(make_app(store, setup, RATEKEEPER_RULES=[everyone])) as client:
        for _ in range(4):
            health = client.get("/health")
            assert health.status_code == 200
            assert "X-RateLimit-Limit" not in health.headers
            assert client.get("/ops/ping").status_code == 200
        assert [client.get("/page").status_code for _ in range(3)] == [200, 200, 429]


def test_app_config_sets_the_store_the_rules_and_the_key(store: str) -> None:
    by_key = HttpRule(Rule("per-api-key", "1/minute"), key=KeyTemplate.parse("{header.x-api-key}"))

    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/data")
        @limiter.limit("5/minute")
        def data() -> str:
            return "data"

    app = make_app(store, setup, RATEKEEPER_RULES=[by_key], RATEKEEPER_KEY="{header.x-user}")
    with serving(app) as client:
        assert client.get("/data", headers={"x-api-key": "k1", "x-user": "u"}).status_code == 200
        assert client.get("/data", headers={"x-api-key": "k1", "x-user": "u"}).status_code == 429
        assert client.get("/data", headers={"x-api-key": "k2", "x-user": "u"}).status_code == 200
        core = app.extensions["ratekeeper"].core
        assert core.limiter.store.__class__.__module__.startswith(
            "ratekeeper.stores.memory" if store == "memory://" else "ratekeeper.stores.redis"
        )
        assert {r.name for r in core.rules} == {"per-api-key", "data"}


def test_app_config_rules_may_be_the_rules_files_entries_as_dicts(store: str) -> None:
    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/search")
        def search() -> str:
            return "results"

    rules = [
        {"name": "search", "match": {"path": "/search"}, "limits": ["2/minute"], "key": "{header.x-api-key|client_ip}"}
    ]
    with serving(make_app(store, setup, RATEKEEPER_RULES=rules)) as client:
        assert [client.get("/search", headers={"x-api-key": "k1"}).status_code for _ in range(3)] == [200, 200, 429]
        assert client.get("/search", headers={"x-api-key": "k2"}).status_code == 200
        assert client.get("/search").headers["X-RateLimit-Remaining"] == "1"  # no API key: by address


def test_bad_app_config_rules_fail_at_init_app_not_at_each_request() -> None:
    app = Flask(__name__)
    app.config["RATEKEEPER_RULES"] = [{"name": "search", "limits": ["2/minut"]}]
    with pytest.raises(ConfigurationError) as info:
        RateLimiter(app)
    assert "app.config['RATEKEEPER_RULES'][0]: unknown time unit 'minut'" in str(info.value)
    assert "ratekeeper" not in app.extensions  # nothing half set up
    with pytest.raises(ConfigurationError, match=r"RateLimiter\(rules=\.\.\.\)\[1\]: each rule must be"):
        RateLimiter(Flask(__name__), rules=[Rule("ok", "1/s"), "5/minute"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"trusted_proxie": ["10.0.0.0/8"]},
            "RateLimitCore() got unexpected options: trusted_proxie (did you mean 'trusted_proxies'?)",
        ),
        ({"trusted_proxies": ["10.0.0.0/99"]}, "trusted_proxies: '10.0.0.0/99' is not an IP network"),
        ({"header_names": {"Nope": "x"}}, "header_names: 'Nope' is not a field ratekeeper sends"),
    ],
)
def test_bad_options_fail_at_init_app(options: dict[str, Any], message: str) -> None:
    app = Flask(__name__)
    app.config["RATEKEEPER_OPTIONS"] = options
    with pytest.raises(ConfigurationError) as info:
        RateLimiter(app)
    assert message in str(info.value)


def test_a_users_429_handler_answers_and_keeps_the_rate_limit_headers(store: str) -> None:
    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/login")
        @limiter.limit("1/minute")
        def login() -> str:
            return "welcome"

        @app.errorhandler(429)
        def too_many(error: RateLimitExceeded) -> Any:
            assert isinstance(error, RateLimitExceeded)
            return jsonify(error="slow down", rules=[r.name for r in error.verdict.rules]), 429

    with serving(make_app(store, setup)) as client:
        assert client.get("/login").status_code == 200
        denied = client.get("/login")
        assert denied.status_code == 429
        assert denied.json() == {"error": "slow down", "rules": ["login"]}
        assert denied.headers["content-type"] == "application/json"
        assert int(denied.headers["Retry-After"]) > 0
        assert denied.headers["X-RateLimit-Limit"] == "1"


def test_the_cli_lists_the_routes_and_their_limits() -> None:
    everyone = HttpRule(Rule("everyone", "100/minute"), key=KeyTemplate.parse("{client_ip}"))

    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/items/<int:n>")
        @limiter.limit("2/minute", "10/hour")
        def items(n: int) -> str:
            return str(n)

        @app.get("/health")
        @limiter.exempt
        def health() -> str:
            return "ok"

    app = make_app("memory://", setup, RATEKEEPER_RULES=[everyone])
    result = app.test_cli_runner().invoke(args=["ratekeeper", "limits"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()}
    assert "items: 2/minute, 10/hour by {client_ip}" in lines["/items/<int:n>"]
    assert "everyone: 100/minute" in lines["/items/<int:n>"]
    assert lines["/health"].endswith("exempt")
    assert "GET" in lines["/health"]


def test_a_bad_limit_string_fails_at_decoration() -> None:
    with pytest.raises(Exception, match="limit"):
        RateLimiter().limit("two per fortnight")


def test_werkzeug_url_rules_become_path_templates() -> None:
    assert path_template("/items/<int:n>/<name>") == "/items/{n:int}/{name}"
    assert path_template("/files/<path:rest>") == "/files/{rest:path}"
    assert path_template("/u/<uuid:id>") == "/u/{id}"


def test_options_from_app_config_reach_the_core_and_a_refund_follows_the_closed_response(store: str) -> None:
    closed = threading.Event()

    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/fail/<int:code>")
        @limiter.limit("1/minute")
        def fail(code: int) -> Any:
            return "failed", code

        @app.after_request
        def tell_closed(response: Any) -> Any:
            # Registered before the extension's: runs after it, so this closes after the refund.
            response.call_on_close(closed.set)
            return response

    app = make_app(store, setup, RATEKEEPER_OPTIONS={"refund_statuses": [503]})
    with serving(app) as client:
        for _ in range(3):  # each 503 is given back: the next request is admitted again
            assert client.get("/fail/503").status_code == 503
            assert closed.wait(5)
            closed.clear()
        assert client.get("/fail/404").status_code == 404
        assert client.get("/fail/404").status_code == 429


def test_a_rules_file_in_app_config_is_reloaded_and_the_decorators_rules_stay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "rules.yaml"

    def write(name: str, limit: str) -> None:
        text = f"rules:\n  - name: {name}\n    match: {{path: /a}}\n    limits: ['{limit}']\n"
        (tmp_path / "next.yaml").write_text(text)
        os.replace(tmp_path / "next.yaml", path)  # whole at once, as a deploy writes it

    write("from_file", "1/minute")

    def setup(app: Flask, limiter: RateLimiter) -> None:
        @app.get("/a")
        def a() -> str:
            return "a"

        @app.get("/b")
        @limiter.limit("1/minute")
        def b() -> str:
            return "b"

    app = make_app("memory://", setup, RATEKEEPER_RULES=str(path), RATEKEEPER_OPTIONS={"reload_interval": 0.05})
    with serving(app) as client, caplog.at_level(logging.ERROR, "ratekeeper"):
        assert [client.get("/a").status_code for _ in range(2)] == [200, 429]
        assert [client.get("/b").status_code for _ in range(2)] == [200, 429]
        core = app.extensions["ratekeeper"].core

        write("from_file_v2", "2/minute")
        wait_until(lambda: {r.name for r in core.rules} == {"from_file_v2", "b"}, 10, "the new file's rules")
        assert [client.get("/a").status_code for _ in range(3)] == [200, 200, 429]
        assert client.get("/b").status_code == 429  # the decorator's rule and its state are kept

        write("b", "100/minute")  # the decorator's rule's name: refused, the rules in force stay

        def refused() -> bool:
            core.rules  # noqa: B018 - a look at the rules in force is what starts a reload
            return any("two rules are named 'b'" in r.getMessage() for r in caplog.records)

        wait_until(refused, 10, "the refusal of a file that names the decorator's rule")
        assert {r.name for r in core.rules} == {"from_file_v2", "b"}
        assert client.get("/b").status_code == 429
