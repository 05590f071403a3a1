"""The JSON-over-HTTP API: a plain ASGI application (``HttpApp``).

Routes (``ROUTES``; ``openapi.py`` describes each one):

- ``POST /v1/check``: ``{"rule", "key", "cost"}`` or ``{"checks": [...]}`` (all or
  nothing); 200 when admitted, 429 when refused; the body is the decision
  (``Decision.as_dict()``; a batch: ``{"allowed", "decisions": [...]}``) and the headers
  are those of a rate-limited response (``RateLimit-Policy``, ``RateLimit``,
  ``X-RateLimit-*``, ``Retry-After`` on a refusal), built by the one headers function of
  ``ratekeeper.web.headers`` and decided by the one request transaction of
  ``ratekeeper.limiter.transaction`` (``core.py``), as the web middleware's are.
- ``POST /v1/peek``, ``/v1/refund``, ``/v1/reset``; ``GET /v1/rules``.
- ``GET /healthz`` (the process answers), ``/readyz`` (the store answers; 503 when not),
  ``/metrics`` (Prometheus), ``/openapi.json``.
- ``POST /json``: Envoy's rate-limit request in the proto3 JSON mapping (``envoy.py``).
- ``POST /v1/store``: the service as a store (``store_api.py``).
- ``GET /``, ``/status.json``, ``POST /status/try`` (a peek): the live status page
  (``status_page``).

Each ``HttpApp`` serves one surface (``surfaces.py``): the routes of that surface only,
and, when the surface has tokens, only to a request with ``Authorization: Bearer
<secret>`` of one of them (401 otherwise; ``/healthz`` and ``/readyz`` excepted). Every
reset and refund is logged with who asked (peer address, token name).

Bad input (malformed JSON, unknown fields or rule, wrong types, a cost out of range, a
key too long, a body over 64 KiB, a wrong content type, an unknown route or method) is
answered with a 4xx ``application/problem+json`` that says what is wrong and what is
accepted, before anything is charged. A store that fails under the ``raise`` policy is
a 503 problem.
"""

from __future__ import annotations

import contextlib
import json
import traceback
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ratekeeper.decision import Decision
from ratekeeper.errors import InvalidRequest, StoreError
from ratekeeper.server.auth import bearer_secret
from ratekeeper.server.core import answer_headers, decide_together
from ratekeeper.server.envoy import envoy_json
from ratekeeper.server.inputs import MAX_BODY, parse_json, read_check, read_checks, read_refund, read_reset
from ratekeeper.server.logs import log
from ratekeeper.server.openapi import openapi_document
from ratekeeper.server.problems import BadInput
from ratekeeper.server.service import Service
from ratekeeper.server.status_page import CONTENT_SECURITY_POLICY, asset, status_doc
from ratekeeper.server.store_api import decide_store_call, explicit_now_allowed
from ratekeeper.server.surfaces import OPEN_PATHS, Surface, store_namespace

__all__ = ["ROUTES", "HttpApp", "Request", "Response"]

JSON = "application/json"
_JSON_BYTES = JSON.encode()


@dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any = None  # the parsed JSON of a POST
    token_name: str | None = None  # the token that authenticated; None on a surface without tokens
    client: Any = None  # the ASGI scope's (host, port) of the client

    @property
    def peer(self) -> str:
        """``host:port`` of the client (``[host]:port`` for IPv6); empty when unknown.
        Written out only for the audit log, so not on every request."""
        client = self.client
        if not client:
            return ""
        host, port = client[0], client[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


@dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = JSON
    headers: list[tuple[str, str]] = field(default_factory=list)


_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
"""``json.dumps(doc, separators=(",", ":"))`` without building an encoder per answer, nor
tracking every container for cycles: an answer is built afresh from plain values, so it
never holds one."""


def json_response(status: int, doc: Any, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, _ENCODE(doc).encode(), JSON, headers or [])


Handler = Callable[["HttpApp", Request], Awaitable[Response]]

# -- the handlers ---------------------------------------------------------------------


def _decision_doc(decision: Decision, shadow: bool) -> dict[str, Any]:
    doc = decision.as_dict()
    if shadow:
        # A shadow rule never refuses: the verdict is "allowed"; what its limits said stays
        # readable (``would_deny``, ``denied_by``, ``retry_after``).
        doc["would_deny"] = not decision.allowed
        doc["allowed"] = True
        doc["shadow"] = True
    return doc


async def check(app: HttpApp, request: Request) -> Response:
    read = read_checks(request.body, app.service.catalog.rules)
    items = read if isinstance(read, list) else [read]
    outcome = await decide_together(app.service.limiter, items)
    status = 200 if outcome.allowed else 429
    docs = [_decision_doc(d, item.shadow) for d, item in zip(outcome.decisions, items, strict=True)]
    doc = {"allowed": outcome.allowed, "decisions": docs} if isinstance(read, list) else docs[0]
    return json_response(status, doc, answer_headers(outcome))


async def peek(app: HttpApp, request: Request) -> Response:
    c = read_check(request.body, app.service.catalog.rules)
    decision = await app.service.limiter.peek(c.rule.rule, c.key, c.cost)
    return json_response(200, _decision_doc(decision, c.rule.shadow))


async def refund(app: HttpApp, request: Request) -> Response:
    c, lease = read_refund(request.body, app.service.catalog.rules)
    if lease is not None and c.rule.rule.algorithm != "concurrency":
        raise BadInput(400, f"rule {c.rule.name!r} holds no leases", "lease_id only for a concurrency rule")
    with _audit("refund", request, rule=c.rule.name, key=c.key, cost=c.cost, lease=lease is not None):
        # False: nothing was charged to give back, or the lease is not this key's (expired,
        # released, or another key's): the answer says nothing was refunded.
        done = await app.service.limiter.refund(c.rule.rule, c.key, c.cost, lease_id=lease)
    return json_response(200, {"rule": c.rule.name, "key": c.key, "refunded": c.cost if done else 0})


async def reset(app: HttpApp, request: Request) -> Response:
    c = read_reset(request.body, app.service.catalog.rules)
    with _audit("reset", request, rule=c.rule.name, key=c.key):
        await app.service.limiter.reset(c.rule.rule, c.key)
    return json_response(200, {"rule": c.rule.name, "key": c.key, "reset": True})


@contextlib.contextmanager
def _audit(event: str, request: Request, **what: Any) -> Iterator[None]:
    """One log line per state-changing admin call: who (peer, token) and what, and whether it
    was done; written also when the store failed, so an attempt is never silent."""
    try:
        yield
    except BaseException as exc:
        log(event, level="warning", peer=request.peer, token=request.token_name, **what, ok=False, error=repr(exc))
        raise
    log(event, peer=request.peer, token=request.token_name, **what, ok=True)


async def rules(app: HttpApp, request: Request) -> Response:
    return json_response(200, app.service.catalog.describe())


async def healthz(app: HttpApp, request: Request) -> Response:
    return json_response(200, {"status": "ok"})


async def readyz(app: HttpApp, request: Request) -> Response:
    problem = await app.service.store_problem()
    if problem is not None:
        raise BadInput(503, f"the store is not reachable: {problem}", "a store that answers")
    return json_response(200, {"status": "ready"})


async def metrics(app: HttpApp, request: Request) -> Response:
    body, content_type = app.service.metrics.exposition(request.headers.get("accept"))
    return Response(200, body, content_type)


async def openapi(app: HttpApp, request: Request) -> Response:
    catalog = app.service.catalog
    doc = openapi_document(
        [r.name for r in catalog.rules],
        sorted(catalog.envoy),
        app.surface.name,
        leased=[r.name for r in catalog.rules if r.rule.algorithm == "concurrency"],
        store_api=app.surface.store_api,
        explicit_now=explicit_now_allowed(),
    )
    # The document describes this surface: its routes, and its tokens when it has them.
    doc["paths"] = {path: item for path, item in doc.get("paths", {}).items() if path in app.routes}
    if app.surface.tokens.tokens:
        doc.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
        }
        doc["security"] = [{"bearer": []}]
        for path in OPEN_PATHS & doc["paths"].keys():
            for operation in doc["paths"][path].values():
                if isinstance(operation, dict):
                    operation["security"] = []
    return json_response(200, doc)


async def envoy(app: HttpApp, request: Request) -> Response:
    status, doc = await envoy_json(app.service, request.body)
    return json_response(status, doc)


async def store_call(app: HttpApp, request: Request) -> Response:
    """The service as a store for other limiters (``store_api.py``); each token's rules
    keep their state in a namespace of their own (``surfaces.store_namespace``)."""
    namespace = store_namespace(request.token_name)
    results = await decide_store_call(app.service.limiter.store, request.body, namespace)
    return json_response(200, {"results": results})


async def status_asset(app: HttpApp, request: Request) -> Response:
    """The status page's HTML, script and style (``status_page``), from the package."""
    body, content_type = asset(request.path)
    headers = [
        ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
        ("X-Content-Type-Options", "nosniff"),
        ("Cache-Control", "no-cache"),
    ]
    return Response(200, body, content_type, headers)


async def status_json(app: HttpApp, request: Request) -> Response:
    return json_response(200, await status_doc(app.service), [("Cache-Control", "no-store")])


ROUTES: dict[str, dict[str, Handler]] = {
    "/v1/check": {"POST": check},
    "/v1/peek": {"POST": peek},
    "/v1/refund": {"POST": refund},
    "/v1/reset": {"POST": reset},
    "/v1/rules": {"GET": rules},
    "/healthz": {"GET": healthz},
    "/readyz": {"GET": readyz},
    "/metrics": {"GET": metrics},
    "/openapi.json": {"GET": openapi},
    "/json": {"POST": envoy},
    "/v1/store": {"POST": store_call},
    # The status page (admin surface): its form is a peek, so it lets a visitor change nothing.
    "/": {"GET": status_asset},
    "/status/page.js": {"GET": status_asset},
    "/status/page.css": {"GET": status_asset},
    "/status.json": {"GET": status_json},
    "/status/try": {"POST": peek},
}
"""Path -> method -> handler. ``HEAD`` is answered for every ``GET`` route."""


# -- the ASGI application -------------------------------------------------------------


class HttpApp:
    """The ASGI application of one surface of ``ratekeeper serve`` (HTTP only; no lifespan needed)."""

    def __init__(self, service: Service, surface: Surface) -> None:
        self.service = service
        self.surface = surface
        self.routes = {path: ROUTES[path] for path in surface.paths}
        # Resolved once (``labels()`` costs a lock and a lookup a call); it counts for the
        # OpenTelemetry backend too when the metrics have one.
        self._count_request = service.metrics.request_counter("http")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        self._count_request()
        head = scope["method"] == "HEAD"
        try:
            response = await self._answer(scope, receive)
        except BadInput as exc:
            response = Response(exc.status, exc.body(), exc.content_type, list(exc.headers))
        except InvalidRequest as exc:  # a check the inputs missed: still the caller's mistake
            bad = BadInput(400, str(exc))
            response = Response(400, bad.body(), bad.content_type)
        except StoreError as exc:
            bad = BadInput(503, f"the store failed: {type(exc).__name__}: {exc}", "retry later")
            response = Response(503, bad.body(), bad.content_type, [("Retry-After", "1")])
        except Exception as exc:  # noqa: BLE001 - an answer, a log line, and the server lives on
            log("error", level="error", path=scope.get("path"), error=repr(exc), trace=traceback.format_exc())
            bad = BadInput(500, "the service failed to answer; this is a bug, see its log")
            response = Response(500, bad.body(), bad.content_type)
        content_type = _JSON_BYTES if response.content_type is JSON else response.content_type.encode()
        headers = [(b"content-type", content_type), (b"content-length", str(len(response.body)).encode())]
        if response.headers:
            headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if head else response.body})

    async def _answer(self, scope: dict[str, Any], receive: Any) -> Response:
        path: str = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        token_name = self._authenticate(path, headers)
        methods = self.routes.get(path)
        if methods is None:
            raise BadInput(
                404,
                f"no route {path!r} on the {self.surface.name} surface",
                "one of " + ", ".join(sorted(self.routes)),
            )
        method: str = scope["method"]
        handler = methods.get("GET" if method == "HEAD" and "GET" in methods else method)
        if handler is None:
            allowed = sorted({*methods, *(["HEAD"] if "GET" in methods else [])})
            raise BadInput(
                405,
                f"{path} does not answer {method}",
                " or ".join(allowed),
                headers=(("Allow", ", ".join(allowed)),),
            )
        request = Request(method, path, headers, token_name=token_name, client=scope.get("client"))
        if method == "POST":
            _check_content_type(headers.get("content-type"))
            request.body = parse_json(await _read_body(headers, receive))
        return await handler(self, request)

    def _authenticate(self, path: str, headers: dict[str, str]) -> str | None:
        """The name of the token the request carries; None on a surface without tokens.
        A missing or unknown token is a 401 (before the route is looked up: a caller
        without a token learns nothing of the routes)."""
        tokens = self.surface.tokens.tokens
        if not tokens:
            return None
        name = tokens.match(bearer_secret(headers.get("authorization")))
        if name is None and path not in OPEN_PATHS:
            what = "no bearer token" if "authorization" not in headers else "a token this surface does not know"
            raise BadInput(
                401,
                f"the {self.surface.name} surface needs a token; the request has {what}",
                "Authorization: Bearer <secret>",
                headers=(("WWW-Authenticate", "Bearer"),),
            )
        return name


def _check_content_type(value: str | None) -> None:
    if value == JSON:  # what nearly every client sends
        return
    media = (value or "").split(";", 1)[0].strip().lower()
    if media != JSON and not (media.startswith("application/") and media.endswith("+json")):
        got = f"Content-Type {value!r}" if value else "no Content-Type"
        raise BadInput(415, f"the body must be JSON; the request has {got}", "Content-Type: application/json")


def _too_big() -> BadInput:
    return BadInput(413, f"the body is larger than {MAX_BODY} bytes", f"a body of at most {MAX_BODY} bytes")


async def _read_body(headers: dict[str, str], receive: Any) -> bytes:
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise _too_big()
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise _too_big()
        if not message.get("more_body", False):
            # Nearly every body comes in one message: returned as it is, not joined.
            return b"".join((*chunks, chunk)) if chunks else chunk
        chunks.append(chunk)
    return b"".join(chunks)


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
