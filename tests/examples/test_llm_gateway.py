"""examples/llm_gateway: tokens per minute per API key, charged when the answer has streamed.

The demo (run.py, as a user runs it: a subprocess serving the app under a real uvicorn)
must tell its story: a streamed answer settled at its end, a key in debt refused with
Retry-After, another key admitted, a cut stream settled with what was streamed, and the
key admitted again once time paid the debt. Then the app itself, under a real uvicorn with
a real HTTP client, on the memory store (its clock injected) and on the real Redis (a key
prefix of its own): the exact amounts each settlement leaves in the store.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from ratekeeper.testing import FakeClock
from web.uvicorn_server import serve

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "llm_gateway"
REDIS_URL = "redis://127.0.0.1:6379/0"
ALICE = "Bearer sk-alice-test"
BOB = "Bearer sk-bob-test"


def load_example() -> ModuleType:
    """examples/llm_gateway/app.py under a name of its own (``app`` is every example's module)."""
    spec = importlib.util.spec_from_file_location("llm_gateway_app", EXAMPLE / "app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gateway = load_example()


# --- the demo, as a user runs it ----------------------------------------------------------


def test_the_demo_settles_streams_refuses_the_key_in_debt_and_not_the_other(tmp_path: Path) -> None:
    out = tmp_path / "account.json"
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "run.py"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    account = json.loads(out.read_text())
    assert account["problems"] == []
    first, second, refused, other, cut, again = account["steps"]

    # a streamed answer: charged 1 when admitted, settled to prompt + answer at its end
    assert (first["who"], first["status"], first["streamed"]) == ("alice", 200, 300)
    assert first["settled"] == first["prompt_tokens"] + 300
    assert first["remaining"] == 1000 - first["settled"]
    # admitted with budget left, it cost more than was left: in debt
    assert second["status"] == 200 and second["streamed"] == 900
    assert second["remaining"] == first["remaining"] - second["settled"] < 0
    # in debt: refused, told when to come back, charged nothing
    debt = -second["remaining"]
    assert (refused["who"], refused["status"], refused["streamed"]) == ("alice", 429, 0)
    assert refused["retry_after"] == -(-(debt + 1) * 60 // 1000)  # seconds to earn debt + 1 at 1000/minute
    assert refused["remaining"] == second["remaining"]
    # another key: its own budget, settled from the JSON answer's x-tokens-used
    assert (other["who"], other["status"]) == ("bob", 200)
    assert other["headers"]["x-tokens-used"] == str(other["settled"])
    assert other["remaining"] == 1000 - other["settled"]
    # a stream the client cut: settled with what the server had produced, not what was asked
    assert cut["status"] == 200 and cut["streamed"] == 20
    assert 20 <= cut["completion_tokens"] < 2000
    assert cut["settled"] == cut["prompt_tokens"] + cut["completion_tokens"]
    assert cut["remaining"] == other["remaining"] - cut["settled"]
    # Retry-After later: admitted again
    assert (again["who"], again["status"]) == ("alice", 200)
    assert again["remaining"] >= 0

    text = done.stdout
    assert "VERDICT: ok" in text
    assert f"Retry-After: {refused['retry_after']} s" in text
    assert f"{second['remaining']}  in debt" in text
    assert "cut" in text


# --- the app through the real middleware ----------------------------------------------------


class Gateway:
    """The example app served by a real uvicorn, and a real HTTP client."""

    def __init__(self, app: Any, base: str, *, memory: bool) -> None:
        self.app = app
        self.memory = memory
        self.base = base
        self.client = httpx.Client(base_url=base, timeout=10)
        self.sent = 0

    def balance(self, key: str) -> int:
        """What ``key`` has left in the store (below 0: in debt), read beside the app."""
        limiter, rule = self.app.state.limiter, self.app.state.rule
        # the memory store answers on any loop; Redis's store is bound to the server's
        # loop, so the test asks the app's own usage page instead
        if self.memory:
            remaining: int = asyncio.run(limiter.charge(rule, key, 0)).remaining
            peeked = asyncio.run(limiter.peek(rule, key, 0))
            if remaining >= 0:
                assert peeked.remaining == remaining  # a peek agrees while the key is not in debt
            return remaining
        page = self.client.get("/v1/usage", headers={"authorization": key})
        assert page.status_code == 200, page.text
        return int(page.json()["remaining"])

    def post(self, key: str | None, body: Any, *, cut_after: int | None = None) -> tuple[httpx.Response, Any, int]:
        """POST /v1/completions; the response, the gateway's record of it (once it is over,
        settled), and the answer tokens the client read."""
        self.sent += 1
        request_id = f"t-{uuid.uuid4().hex[:8]}-{self.sent}"
        headers = {"x-request-id": request_id}
        if key is not None:
            headers["authorization"] = key
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        read = 0
        with self.client.stream("POST", "/v1/completions", content=content, headers=headers) as response:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        read += len(json.loads(line[6:])["choices"])
                        if cut_after is not None and read >= cut_after:
                            break  # leaving the block unread closes the connection: a hang-up
            else:
                response.read()
        record = self.app.state.requests.wait(request_id)
        return response, record, read


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@contextmanager
def served(app: Any, *, memory: bool = True) -> Iterator[Gateway]:
    with serve(app) as base:
        gw = Gateway(app, base, memory=memory)
        try:
            yield gw
        finally:
            gw.client.close()


@pytest.fixture
def on_memory(clock: FakeClock) -> Iterator[Gateway]:
    with served(gateway.create_app(token_delay=0, clock=clock)) as gw:
        yield gw


def test_a_streamed_answer_is_settled_with_its_tokens_at_its_end(on_memory: Gateway) -> None:
    response, record, read = on_memory.post(ALICE, {"prompt": "two words", "max_tokens": 50})
    assert response.status_code == 200 and read == 50
    assert (record.prompt_tokens, record.completion_tokens, record.completed) == (2, 50, True)
    # the headers went out before the answer: they show the charge of admission, 1
    assert response.headers["x-ratelimit-remaining"] == "999"
    assert on_memory.balance(ALICE) == 1000 - 52
    assert on_memory.balance(BOB) == 1000


def test_a_key_in_debt_is_refused_until_time_pays_it_back_and_the_other_key_is_not(
    on_memory: Gateway, clock: FakeClock
) -> None:
    on_memory.post(ALICE, {"prompt": "a b c", "max_tokens": 1000})  # admitted with 1000: costs 1003
    assert on_memory.balance(ALICE) == -3

    refused, record, read = on_memory.post(ALICE, {"prompt": "again", "max_tokens": 5})
    assert refused.status_code == 429 and read == 0
    assert refused.headers["retry-after"] == "1"  # 4 tokens (debt + 1) at 1000/minute: 0.24 s
    assert refused.json()["rule"] == "llm.tokens"
    assert record.completion_tokens == 0
    assert on_memory.balance(ALICE) == -3  # a refusal charges nothing

    other, record, read = on_memory.post(BOB, {"prompt": "hello", "max_tokens": 7})
    assert other.status_code == 200 and read == 7
    assert on_memory.balance(BOB) == 1000 - 8

    clock.advance(0.18)  # 3 tokens earned: the debt is paid, the next token not yet
    assert on_memory.balance(ALICE) == 0
    assert on_memory.post(ALICE, {"prompt": "again", "max_tokens": 5})[0].status_code == 429
    clock.advance(0.06)
    again, record, read = on_memory.post(ALICE, {"prompt": "again", "max_tokens": 5})
    assert again.status_code == 200 and read == 5
    assert on_memory.balance(ALICE) == 1 - 6


def test_a_stream_the_client_cuts_is_settled_with_what_was_streamed(clock: FakeClock) -> None:
    # a pause per token, so that the client hangs up with most of the answer still to come
    with served(gateway.create_app(token_delay=0.005, clock=clock)) as gw:
        response, record, read = gw.post(BOB, {"prompt": "a long story please", "max_tokens": 2000}, cut_after=10)
        assert response.status_code == 200 and read == 10
        assert not record.completed
        assert 10 <= record.completion_tokens < 2000
        assert gw.balance(BOB) == 1000 - (4 + record.completion_tokens)


def test_a_json_answer_is_settled_from_its_header_and_a_bad_request_costs_nothing(on_memory: Gateway) -> None:
    response, _, _ = on_memory.post(ALICE, {"prompt": "one two three", "max_tokens": 40, "stream": False})
    assert response.status_code == 200
    assert response.headers["x-tokens-used"] == "43"
    assert response.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 40, "total_tokens": 43}
    assert on_memory.balance(ALICE) == 1000 - 43
    # charged 1 when admitted, refunded by x-tokens-used: 0
    for body in (
        b"not json",
        {"prompt": "", "max_tokens": 3},
        {"prompt": "x", "max_tokens": True},
        {"prompt": "x", "max_tokens": 10**9},
        [1, 2],
        b"\xff\xfe",
    ):
        bad, _, _ = on_memory.post(ALICE, body)
        assert bad.status_code == 400, body
        assert "error" in bad.json()
    assert on_memory.balance(ALICE) == 1000 - 43
    too_big, _, _ = on_memory.post(ALICE, {"prompt": "x" * (gateway.MAX_BODY + 1)})
    assert too_big.status_code == 413
    assert on_memory.balance(ALICE) == 1000 - 43


def test_a_request_without_an_api_key_is_refused_not_served_unlimited(on_memory: Gateway) -> None:
    for key in (None, "Basic YWxpY2U6cHc=", "Bearer", "Bearer " + "k" * 201):
        response, record, read = on_memory.post(key, {"prompt": "free tokens?", "max_tokens": 100})
        assert response.status_code == 401, key
        assert read == 0 and record.completion_tokens == 0
    response = on_memory.client.post(
        "/v1/completions",
        content=b'{"prompt": "x"}',
        headers=[("authorization", ALICE), ("authorization", BOB)],
    )
    assert response.status_code == 401  # two keys: which one would pay?
    assert on_memory.balance(ALICE) == 1000 and on_memory.balance(BOB) == 1000


@pytest.mark.redis
def test_on_redis_the_settlements_leave_the_exact_amounts(tmp_path: Path, key_prefix: str) -> None:
    import redis

    # The example's rule over a week instead of a minute: Redis's own clock then adds no
    # whole token during the test, so every balance is exact.
    rules = tmp_path / "rules.yaml"
    rules.write_text((EXAMPLE / "rules.yaml").read_text().replace('["1000/minute"]', '["1000/week"]'))
    assert "1000/week" in rules.read_text()
    url = f"{REDIS_URL}?prefix={key_prefix}:"
    try:
        with served(gateway.create_app(store=url, rules=rules, token_delay=0.005), memory=False) as gw:
            response, record, read = gw.post(ALICE, {"prompt": "two words", "max_tokens": 50})
            assert response.status_code == 200 and read == 50
            assert gw.balance(ALICE) == 1000 - 52

            gw.post(ALICE, {"prompt": "x", "max_tokens": 1000})
            assert gw.balance(ALICE) == 948 - 1001
            refused, _, _ = gw.post(ALICE, {"prompt": "x", "max_tokens": 1})
            assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
            assert gw.balance(ALICE) == 948 - 1001

            cut, record, read = gw.post(BOB, {"prompt": "tell me more", "max_tokens": 2000}, cut_after=10)
            assert cut.status_code == 200 and read == 10 and 10 <= record.completion_tokens < 2000
            assert gw.balance(BOB) == 1000 - (3 + record.completion_tokens)

            bad, _, _ = gw.post(BOB, b"{}")
            assert bad.status_code == 400
            assert gw.balance(BOB) == 1000 - (3 + record.completion_tokens)  # its 1 refunded
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        try:
            left = list(client.scan_iter(match=f"{key_prefix}:*"))
            if left:
                client.delete(*left)
        finally:
            client.close()
