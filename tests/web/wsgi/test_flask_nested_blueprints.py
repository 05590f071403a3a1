"""Nested Flask blueprints (``parent.register_blueprint(child)``) under the extension.

A limit on a blueprint covers every route registered through it, its nested blueprints'
included: a child's route is decided by the child's limit and the parent's, in one
transaction (a refusal by one charges the other nothing). ``exempt`` on a blueprint covers
its own routes (as flask-limiter's default); ``descendants=True`` covers its nested
blueprints' routes too. Through Flask's test client, and one scenario under werkzeug's
real threaded server on memory and Redis.
"""

from __future__ import annotations

from typing import Any

import http_sf
import pytest
from flask import Blueprint, Flask

from ratekeeper import Rule
from ratekeeper.config.model import HttpRule, KeyTemplate
from ratekeeper.web.flask import RateLimiter
from web.wsgi.flask_serving import serving


def build(
    store: str = "memory://",
    *,
    parent_limit: str | None = "3/minute",
    child_limit: str | None = "2/minute",
    exempt: dict[str, Any] | None = None,
    app_rules: list[HttpRule] | None = None,
) -> Flask:
    """``/p/x`` (``parent.px``), ``/p/c/y`` (``parent.child.cy``) and ``/free``;
    ``exempt`` maps ``"parent"`` / ``"child"`` to ``exempt``'s keywords."""
    app = Flask(__name__)
    app.config["RATEKEEPER_STORE"] = store
    if app_rules:
        app.config["RATEKEEPER_RULES"] = app_rules
    limiter = RateLimiter()
    parent = Blueprint("parent", __name__, url_prefix="/p")
    child = Blueprint("child", __name__, url_prefix="/c")

    @parent.get("/x")
    def px() -> str:
        return "parent"

    @child.get("/y")
    def cy() -> str:
        return "child"

    @app.get("/free")
    def free() -> str:
        return "free"

    if parent_limit:
        limiter.limit(parent_limit)(parent)
    if child_limit:
        limiter.limit(child_limit)(child)
    blueprints = {"parent": parent, "child": child}
    for name, keywords in (exempt or {}).items():
        limiter.exempt(blueprints[name], **keywords)
    parent.register_blueprint(child)
    app.register_blueprint(parent)
    limiter.init_app(app)
    return app


def policies(response: Any) -> set[str]:
    """The policy names of ``RateLimit-Policy`` (parsed by http_sf)."""
    value = response.headers.get("RateLimit-Policy")
    if value is None:
        return set()
    return {str(name) for name, _ in http_sf.parse(value.encode(), tltype="list")}  # type: ignore[misc]


def statuses(client: Any, path: str, n: int) -> list[int]:
    return [client.get(path).status_code for _ in range(n)]


def test_a_childs_route_is_decided_by_the_childs_limit_and_the_parents() -> None:
    client = build().test_client()
    first = client.get("/p/c/y")
    assert first.status_code == 200
    assert policies(first) == {"parent", "parent.child"}
    assert statuses(client, "/p/c/y", 2) == [200, 429]  # the child's 2/minute refuses
    denied = client.get("/p/c/y")
    assert denied.headers["X-RateLimit-Limit"] == "2"
    # the refusals charged the parent nothing: of its 3, the child's two passes took 2
    assert statuses(client, "/p/x", 2) == [200, 429]
    assert statuses(client, "/free", 3) == [200, 200, 200]


def test_the_parents_limit_refuses_a_childs_route_and_charges_the_child_nothing() -> None:
    app = build(parent_limit="2/minute", child_limit="3/minute")
    client = app.test_client()
    assert statuses(client, "/p/x", 2) == [200, 200]
    denied = client.get("/p/c/y")
    assert denied.status_code == 429
    assert denied.json["rule"] == "parent"
    # the child's own counter is untouched: a peek (what one more request would leave) says 2 of 3
    core = app.extensions["ratekeeper"].core
    child = core.rules.by_name["parent.child"].rule
    assert core.limiter.peek(child, "127.0.0.1").remaining == 2


def test_a_child_limited_alone_has_its_own_rule_and_leaves_the_parents_routes_alone() -> None:
    client = build(parent_limit=None, child_limit="1/minute").test_client()
    assert statuses(client, "/p/c/y", 2) == [200, 429]
    parent = client.get("/p/x")
    assert parent.status_code == 200
    assert "X-RateLimit-Limit" not in parent.headers


def test_exempting_the_child_frees_its_routes_and_not_the_parents() -> None:
    everyone = HttpRule(Rule("everyone", "4/minute"), key=KeyTemplate.parse("{client_ip}"))
    client = build(exempt={"child": {}}, app_rules=[everyone]).test_client()
    for _ in range(5):
        free = client.get("/p/c/y")
        assert free.status_code == 200
        assert "X-RateLimit-Limit" not in free.headers
    assert statuses(client, "/p/x", 4) == [200, 200, 200, 429]  # the parent's 3/minute


def test_exempting_the_parent_frees_its_own_routes_only_unless_descendants_is_asked() -> None:
    client = build(exempt={"parent": {}}).test_client()
    assert statuses(client, "/p/x", 5) == [200] * 5
    assert statuses(client, "/p/c/y", 3) == [200, 200, 429]  # the child's limit still holds
    client = build(parent_limit="1/minute", child_limit=None, exempt={"parent": {}}).test_client()
    assert statuses(client, "/p/c/y", 2) == [200, 429]  # so does the parent's, on the child's routes
    client = build(exempt={"parent": {"descendants": True}}).test_client()
    assert statuses(client, "/p/x", 5) == [200] * 5
    assert statuses(client, "/p/c/y", 5) == [200] * 5


def test_blueprints_of_one_name_under_two_parents_are_limited_apart() -> None:
    app = Flask(__name__)
    limiter = RateLimiter()
    v1, v2 = Blueprint("v1", __name__, url_prefix="/v1"), Blueprint("v2", __name__, url_prefix="/v2")
    items1 = Blueprint("items", __name__, url_prefix="/items")
    items2 = Blueprint("items", __name__, url_prefix="/items")

    @items1.get("/")
    def list1() -> str:
        return "1"

    @items2.get("/")
    def list2() -> str:
        return "2"

    limiter.limit("1/minute")(items1)
    v1.register_blueprint(items1)
    v2.register_blueprint(items2)
    app.register_blueprint(v1)
    app.register_blueprint(v2)
    limiter.init_app(app)
    client = app.test_client()
    assert statuses(client, "/v1/items/", 2) == [200, 429]
    assert statuses(client, "/v2/items/", 3) == [200, 200, 200]
    assert {r.name for r in limiter.core(app).rules} == {"v1.items"}


def test_a_blueprint_mounted_twice_shares_one_limit_across_its_mounts() -> None:
    app = Flask(__name__)
    limiter = RateLimiter()
    api = Blueprint("api", __name__)

    @api.get("/ping")
    def ping() -> str:
        return "pong"

    limiter.limit("2/minute")(api)
    app.register_blueprint(api, url_prefix="/a")
    app.register_blueprint(api, url_prefix="/b", name="api_b")
    limiter.init_app(app)
    client = app.test_client()
    assert [client.get(p).status_code for p in ("/a/ping", "/b/ping", "/a/ping")] == [200, 200, 429]


def test_the_cli_lists_both_limits_of_a_childs_route_and_the_exemptions() -> None:
    app = build(exempt={"parent": {}})
    result = app.test_cli_runner().invoke(args=["ratekeeper", "limits"])
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.output.splitlines()}
    assert "parent.child.cy" in lines["/p/c/y"]
    assert "parent.child: 2/minute by {client_ip}" in lines["/p/c/y"]
    assert "parent: 3/minute by {client_ip}" in lines["/p/c/y"]
    assert lines["/p/x"].endswith("exempt")
    assert lines["/free"].endswith("-")


# -- under a real server ----------------------------------------------------------------------------


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def store(request: pytest.FixtureRequest, key_prefix: str) -> str:
    return "memory://" if request.param == "memory" else f"redis://127.0.0.1:6379/0?prefix={key_prefix}"


def test_under_a_real_server_both_limits_hold_on_a_childs_route(store: str) -> None:
    with serving(build(store, exempt={"parent": {}})) as client:
        first = client.get("/p/c/y")
        assert first.status_code == 200
        assert policies(first) == {"parent", "parent.child"}
        assert statuses(client, "/p/c/y", 2) == [200, 429]
        denied = client.get("/p/c/y")
        assert denied.json()["rule"] == "parent.child"
        assert int(denied.headers["Retry-After"]) > 0
        assert statuses(client, "/p/x", 4) == [200] * 4  # exempt: the parent's own routes


def test_a_limited_blueprint_without_routes_limits_nothing_else() -> None:
    """A rule with no route to match would match every request: none is made."""
    app = Flask(__name__)
    limiter = RateLimiter()
    empty, unregistered = Blueprint("empty", __name__), Blueprint("elsewhere", __name__)
    limiter.limit("1/minute")(empty)
    limiter.limit("1/minute")(unregistered)
    app.register_blueprint(empty)

    @app.get("/free")
    def free() -> str:
        return "free"

    limiter.init_app(app)
    assert statuses(app.test_client(), "/free", 3) == [200, 200, 200]
    assert list(limiter.core(app).rules) == []
