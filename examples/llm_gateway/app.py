"""An LLM gateway in front of a streaming model: 1000 tokens a minute per API key.

What every LLM gateway has to do: limit each API key by the tokens its requests cost,
prompt and answer together, when that cost is known only once the answer has streamed.

- ``POST /v1/completions`` (``{"prompt": "...", "max_tokens": 300, "stream": true}``, with
  ``Authorization: Bearer <api key>``) runs a fake model: deterministic, it answers with
  ``max_tokens`` words of a canned text, one token per word, streamed as Server-Sent Events
  (``"stream": false``: one JSON answer).
- ``rules.yaml`` limits it per ``Authorization`` header to 1000 tokens a minute (a token
  bucket). ``RateLimitMiddleware`` charges each request 1 when it admits it (the estimate:
  "this key still has tokens"), and settles at the end of the response with what the answer
  really cost: a streamed answer adds its tokens to ``ratekeeper.web.usage(scope)`` as
  they go out, a JSON answer names its cost in the ``x-tokens-used`` header
  (``response_cost``). A key that spent more than it had is in debt: refused with 429 and
  ``Retry-After`` until time has paid the debt back. A client that hangs up mid-stream pays
  for what was streamed until then.
- ``GET /v1/usage`` tells a key what it has left (``remaining`` below 0: in debt), charging
  nothing.

Run it on its own (``LLM_GATEWAY_STORE``, default ``memory://``; ``LLM_GATEWAY_TOKEN_DELAY``,
seconds per token, default 0.02)::

    uvicorn app:app --app-dir examples/llm_gateway
    curl -N localhost:8000/v1/completions -H 'authorization: Bearer sk-alice' \\
        -d '{"prompt": "Tell me about rate limits", "max_tokens": 40}'

``run.py`` runs the whole story in a few seconds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ratekeeper import AsyncLimiter
from ratekeeper.clock import Clock
from ratekeeper.config.model import RuleSet
from ratekeeper.config.native import load_rules
from ratekeeper.keys import bounded_key
from ratekeeper.web import RateLimitMiddleware, usage

RULES = Path(__file__).with_name("rules.yaml")
RULE_NAME = "llm.tokens"
TOKENS_USED = "x-tokens-used"  # what a JSON answer cost, for the settlement (response_cost)
MAX_BODY = 64 * 1024  # bytes of a request body; the client is not trusted with memory
MAX_TOKENS = 4096  # the most one answer may ask for
MAX_API_KEY = 200  # characters of the token after "Bearer "
MAX_REQUEST_ID = 64
KEPT_RECORDS = 1000  # finished requests the log remembers (bounded: one per request otherwise)
RECORD = "llm_gateway.record"  # where a request's record travels in the ASGI scope

log = logging.getLogger("llm_gateway")

# The model's one answer, repeated as far as max_tokens asks. One word is one token.
CANNED = " ".join(
    (
        "A rate limiter in front of a model counts tokens, not requests: one question may cost",
        "ten tokens and the next ten thousand, and nobody knows which until the answer is out.",
        "So the gateway admits a request while the key still has budget, lets the answer stream,",
        "and settles the real count at the end; a key that spent more than it had waits until",
        "time has paid its debt back, and every other key keeps its own budget.",
    )
).split()


def tokens_of(text: str) -> int:
    """The tokens of ``text`` as this fake model counts them: its words."""
    return len(text.split())


def answer(max_tokens: int) -> list[str]:
    """The model's answer: ``max_tokens`` words of the canned text, deterministic."""
    return [CANNED[i % len(CANNED)] for i in range(max_tokens)]


class BadRequest(Exception):
    """A request the gateway answers with ``status`` and this message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class Completion:
    """A checked ``POST /v1/completions`` body."""

    prompt: str
    max_tokens: int
    stream: bool


def parse_completion(body: bytes) -> Completion:
    """The request's fields, or ``BadRequest`` saying what is wrong and what would be right."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f'the body must be JSON such as {{"prompt": "...", "max_tokens": 100}}: {exc}') from None
    if not isinstance(doc, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(doc).__name__}")
    prompt = doc.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BadRequest('"prompt" must be a non-empty string')
    max_tokens = doc.get("max_tokens", 16)
    # bool is an int in Python: true is not a token count
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
        raise BadRequest(f'"max_tokens" must be a whole number from 1 to {MAX_TOKENS}, got {max_tokens!r}')
    stream = doc.get("stream", True)
    if not isinstance(stream, bool):
        raise BadRequest(f'"stream" must be true or false, got {stream!r}')
    return Completion(prompt, max_tokens, stream)


async def read_body(request: Request) -> bytes:
    """The request's body, refused past ``MAX_BODY`` bytes before it is all read."""
    declared = request.headers.get("content-length")
    if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_BODY):
        raise BadRequest(f"the body may hold at most {MAX_BODY} bytes", 413)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            raise BadRequest(f"the body may hold at most {MAX_BODY} bytes", 413)
    return bytes(body)


def api_key(request: Request) -> str:
    """The caller's ``Authorization`` header, the rule's key: exactly one ``Bearer`` token.

    Without it the rule could not build its key and would not limit the request, so the
    gateway refuses it here (401) instead of serving it unlimited.
    """
    values = request.headers.getlist("authorization")
    if len(values) != 1:
        raise BadRequest("send exactly one 'Authorization: Bearer <api key>' header", 401)
    scheme, _, token = values[0].partition(" ")
    if scheme.lower() != "bearer" or not token or len(token) > MAX_API_KEY or not token.isprintable():
        raise BadRequest(f"the Authorization header must be 'Bearer <api key>' (at most {MAX_API_KEY} characters)", 401)
    return values[0]


def sse(data: object) -> str:
    """One Server-Sent Event carrying ``data`` as JSON."""
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


@dataclass(slots=True)
class Finished:
    """What a request did, as the gateway's log records it once the response is over
    (after the rate limiter has settled its cost)."""

    request_id: str
    status: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    streaming: bool = False  # an answer started to stream
    completed: bool = False  # the answer went out whole (a stream: to its end)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class RequestLog:
    """The last ``KEPT_RECORDS`` finished requests by request id, for the log line and for
    whoever must know a request is over (``run.py``: its settlement has happened then)."""

    def __init__(self) -> None:
        self._done: OrderedDict[str, Finished] = OrderedDict()
        self._changed = threading.Condition()

    def add(self, record: Finished) -> None:
        with self._changed:
            self._done[record.request_id] = record
            while len(self._done) > KEPT_RECORDS:
                self._done.popitem(last=False)
            self._changed.notify_all()
        log.info(
            "request %s: %d, %d prompt + %d answer tokens%s",
            record.request_id,
            record.status,
            record.prompt_tokens,
            record.completion_tokens,
            " (cut by the client)" if record.streaming and not record.completed else "",
        )

    def wait(self, request_id: str, timeout: float = 10.0) -> Finished:
        """The record of ``request_id`` once that request is over (from any thread)."""
        with self._changed:
            if not self._changed.wait_for(lambda: request_id in self._done, timeout):
                raise TimeoutError(f"request {request_id} did not finish within {timeout} s")
            return self._done[request_id]


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class LogRequests:
    """ASGI middleware outside the rate limiter: gives each request a record (its id from
    ``x-request-id``, else a new one) and logs it when the request is over, refused ones
    included. Being outside, it returns only after the limiter has settled the request."""

    def __init__(self, app: ASGIApp, *, requests: RequestLog) -> None:
        self.app = app
        self.requests = requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = Request(scope).headers.get("x-request-id", "")
        ok = 0 < len(given) <= MAX_REQUEST_ID and given.isascii() and given.isprintable()
        record = Finished(given if ok else uuid.uuid4().hex)
        scope[RECORD] = record

        async def send_status(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", ()), (b"x-request-id", record.request_id.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.requests.add(record)


def create_app(
    *,
    store: str = "memory://",
    rules: str | os.PathLike[str] = RULES,
    token_delay: float = 0.02,
    clock: Clock | None = None,
) -> Starlette:
    """The gateway on ``store`` with the rules file ``rules``; ``token_delay`` seconds between
    two streamed tokens (0: as fast as the server sends); ``clock`` for the memory store (a
    ``FakeClock`` lets a demo or a test move time). ``app.state.limiter``, ``.rule`` and
    ``.requests`` (the ``RequestLog``) are there for whoever runs it."""
    if token_delay < 0:
        raise ValueError(f"token_delay is seconds between tokens, 0 or more, not {token_delay}")
    ruleset: RuleSet = load_rules(rules)
    if RULE_NAME not in ruleset.by_name:
        raise ValueError(f"{rules} has no rule named {RULE_NAME!r}: the gateway's usage page reports that one")
    rule = ruleset.by_name[RULE_NAME].rule
    limiter = AsyncLimiter(store, clock=clock)
    requests = RequestLog()

    async def completions(request: Request) -> Response:
        record: Finished = request.scope.get(RECORD) or Finished(uuid.uuid4().hex)
        try:
            api_key(request)
            job = parse_completion(await read_body(request))
        except BadRequest as exc:
            # Charged 1 on admission; a request the model never saw costs nothing.
            return JSONResponse({"error": str(exc)}, exc.status, headers={TOKENS_USED: "0"})
        record.prompt_tokens = tokens_of(job.prompt)
        words = answer(job.max_tokens)
        if not job.stream:
            record.completion_tokens = len(words)
            record.completed = True
            body = {"choices": [{"index": 0, "text": " ".join(words)}], "usage": usage_of(record)}
            return JSONResponse(body, headers={TOKENS_USED: str(record.total_tokens)})
        meter = usage(request.scope)
        record.streaming = True
        meter.add(record.prompt_tokens)  # the model has read the prompt, whatever happens next

        async def events() -> AsyncIterator[str]:
            for word in words:
                # the pause of a model producing its next token; also where a cut stream stops
                await asyncio.sleep(token_delay)
                meter.add(1)  # produced: paid for, even if the client hangs up before reading it
                record.completion_tokens += 1
                yield sse({"choices": [{"index": 0, "text": word + " "}]})
            record.completed = True
            yield sse({"choices": [], "usage": usage_of(record)})
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-store"})

    async def usage_page(request: Request) -> Response:
        try:
            key = api_key(request)
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, exc.status)
        key = bounded_key(key)  # the key as the middleware renders it (a long header is bounded alike)
        # A charge of 0 changes nothing and reports the balance, a debt included; a peek
        # answers for one more token, refused (remaining 0) while the key is in debt.
        balance = await limiter.charge(rule, key, 0)
        next_token = await limiter.peek(rule, key)
        return JSONResponse(
            {
                "rule": rule.name,
                "limit": str(rule.limits[0]),
                "remaining": balance.remaining,  # below 0: in debt
                "retry_after": next_token.retry_after,  # seconds until a request is admitted again
            }
        )

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await limiter.aclose()  # the middleware closes only a store it opened itself

    app = Starlette(
        lifespan=lifespan,
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/usage", usage_page, methods=["GET"]),
        ],
        middleware=[
            Middleware(LogRequests, requests=requests),
            Middleware(RateLimitMiddleware, rules=ruleset, limiter=limiter, response_cost=TOKENS_USED),
        ],
    )
    app.state.limiter = limiter
    app.state.rule = rule
    app.state.requests = requests
    return app


def usage_of(record: Finished) -> dict[str, int]:
    """An answer's ``usage`` object, as OpenAI's API reports it."""
    return {
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": record.completion_tokens,
        "total_tokens": record.total_tokens,
    }


app = create_app(
    store=os.environ.get("LLM_GATEWAY_STORE", "memory://"),
    token_delay=float(os.environ.get("LLM_GATEWAY_TOKEN_DELAY", "0.02")),
)
