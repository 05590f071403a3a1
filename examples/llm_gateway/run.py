"""The LLM gateway's story in a few seconds: tokens per minute per API key, known only after the answer.

    .venv/bin/python examples/llm_gateway/run.py
    .venv/bin/python examples/llm_gateway/run.py --json account.json   # the account as JSON too

It serves ``app.py`` under a real uvicorn on a free loopback port (in this process, so
that the memory store can run on a clock the demo moves: "13 seconds later" takes no
time), sends requests as two API keys over HTTP with the standard library's client, and
prints what each cost and what the key had left afterwards (``GET /v1/usage``):

1. alice streams an answer: charged 1 on admission, settled at the stream's end with its
   tokens (prompt and answer);
2. alice streams a longer one: admitted with budget left, it costs more than was left:
   the key is in debt;
3. alice is refused: 429 with ``Retry-After``, nothing streamed, nothing charged;
4. bob, another key, is admitted as if alice did not exist; a JSON answer (not streamed)
   is settled from its ``x-tokens-used`` header;
5. bob hangs up mid-stream: he pays for what had streamed when the server noticed;
6. ``Retry-After`` seconds later alice is admitted again: time paid her debt back.

Exit status 0 when the account came out as the rules say, 1 otherwise (each problem printed).
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # app.py beside it, run from anywhere

from app import create_app

from ratekeeper.testing import FakeClock

ALICE = "Bearer sk-alice-0001"
BOB = "Bearer sk-bob-0002"
NAMES = {ALICE: "alice", BOB: "bob"}
START_TIMEOUT = 10.0
CUT_AFTER = 20  # tokens bob reads before hanging up
LONG = 2000  # the answer bob asks for: seconds of streaming, so that he hangs up mid-way even on a busy machine


@dataclass
class Step:
    """One request of the story and what it cost."""

    who: str
    what: str
    status: int
    streamed: int = 0  # answer tokens the client received
    prompt_tokens: int = 0
    completion_tokens: int = 0  # answer tokens the server produced (more than streamed when cut)
    settled: int = 0  # the request's cost after settlement (prompt + answer; 0 when refused)
    remaining: int = 0  # what the key had left afterwards (below 0: in debt)
    retry_after: int | None = None  # the 429's Retry-After
    headers: dict[str, str] = field(default_factory=dict)


@contextmanager
def serve(app: Any) -> Iterator[tuple[str, int]]:
    """Serve ``app`` under uvicorn on a free loopback port; yield (host, port)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", loop="asyncio"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT
    while not server.started:  # uvicorn has no "started" event to wait on; a bounded poll
        if not thread.is_alive() or time.monotonic() > deadline:
            raise SystemExit("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(START_TIMEOUT)
        sock.close()


class Client:
    """The demo's HTTP client: one connection per request, so a cut is a real hang-up."""

    def __init__(self, host: str, port: int, app: Any) -> None:
        self.host, self.port, self.app = host, port, app
        self.sent = 0

    def remaining(self, key: str) -> int:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", "/v1/usage", headers={"authorization": key})
            return int(json.loads(conn.getresponse().read())["remaining"])
        finally:
            conn.close()

    def complete(
        self, key: str, prompt: str, max_tokens: int, *, stream: bool = True, cut_after: int | None = None
    ) -> Step:
        """Ask for an answer; with ``cut_after``, hang up after reading that many tokens."""
        self.sent += 1
        request_id = f"demo-{self.sent}"
        body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": stream})
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        streamed = 0
        try:
            conn.request(
                "POST",
                "/v1/completions",
                body,
                {"authorization": key, "content-type": "application/json", "x-request-id": request_id},
            )
            response = conn.getresponse()
            headers = {k.lower(): v for k, v in response.getheaders()}
            if response.status == 200 and stream:
                for line in iter(response.readline, b""):
                    if not line.startswith(b"data: {"):
                        continue
                    streamed += len(json.loads(line[6:])["choices"])
                    if cut_after is not None and streamed >= cut_after:
                        break  # hang up: the connection closes below, mid-stream
            elif response.status == 200:
                streamed = len(json.loads(response.read())["choices"][0]["text"].split())
            else:
                response.read()
        finally:
            conn.close()
        # The gateway's log has the request once it is over: settled by then.
        record = self.app.state.requests.wait(request_id)
        step = Step(
            who=NAMES[key],
            what=f"{'stream' if stream else 'json'}, max_tokens {max_tokens}",
            status=response.status,
            streamed=streamed,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            settled=record.total_tokens,
            remaining=self.remaining(key),
            headers={
                k: v for k, v in headers.items() if k in ("retry-after", "x-tokens-used", "x-ratelimit-remaining")
            },
        )
        if "retry-after" in headers:
            step.retry_after = int(headers["retry-after"])
        return step


HEADER = f"{'key':<6} {'request':<24} {'status':<7} {'tokens: prompt + answer':<30} {'charged':<10} balance"


def row(step: Step, tokens: str, note: str = "") -> str:
    """One line of the account: the key's balance afterwards, ``in debt`` below 0."""
    charged = f"1 -> {step.settled}" if step.status == 200 else "0"
    balance = f"{step.remaining}" + ("  in debt" if step.remaining < 0 else "")
    line = f"{step.who:<6} {step.what:<24} {step.status:<7} {tokens:<30} {charged:<10} {balance}"
    return line + (f"\n{'':<6} {note}" if note else "")


def story(client: Client, clock: FakeClock) -> tuple[list[Step], list[str]]:
    """Run the six requests, print each, and return them with the problems found."""
    steps: list[Step] = []
    problems: list[str] = []

    def check(ok: bool, problem: str) -> None:
        if not ok:
            problems.append(problem)
            print(f"  PROBLEM: {problem}")

    def say(step: Step, tokens: str, note: str = "") -> None:
        steps.append(step)
        print(row(step, tokens, note))

    limit = 1000
    print(HEADER)
    a1 = client.complete(ALICE, "Explain token rate limits", 300)
    say(a1, f"{a1.prompt_tokens} + {a1.streamed} streamed", "charged 1 when admitted, settled when the stream ended")
    check(a1.status == 200 and a1.streamed == 300, "alice's first answer did not stream whole")
    check(a1.remaining == limit - a1.settled, f"alice should have {limit - a1.settled} left, has {a1.remaining}")

    a2 = client.complete(ALICE, "Now explain it again in much more detail", 900)
    say(a2, f"{a2.prompt_tokens} + {a2.streamed} streamed", f"admitted with {a1.remaining} left: it cost more")
    check(a2.status == 200 and a2.remaining == a1.remaining - a2.settled < 0, "alice's second answer left no debt")

    a3 = client.complete(ALICE, "One more thing", 10)
    say(a3, f"Retry-After: {a3.retry_after} s", "refused while in debt: nothing streamed, nothing charged")
    check(a3.status == 429 and a3.retry_after is not None and a3.retry_after > 0, "alice in debt was not refused")
    check(a3.remaining == a2.remaining, "the refusal changed alice's account")

    b1 = client.complete(BOB, "Summarise the rate limits", 100, stream=False)
    say(
        b1,
        f"{b1.prompt_tokens} + {b1.streamed} in one JSON answer",
        f"another key, its own budget; settled from x-tokens-used: {b1.headers.get('x-tokens-used')}",
    )
    check(b1.status == 200 and b1.remaining == limit - b1.settled, "bob was not served from his own budget")

    b2 = client.complete(BOB, "Tell me a very long story", LONG, cut_after=CUT_AFTER)
    say(
        b2,
        f"{b2.prompt_tokens} + {b2.completion_tokens} of {LONG}, cut",
        f"bob hung up after reading {b2.streamed}: settled with what the server had streamed",
    )
    check(b2.status == 200 and CUT_AFTER <= b2.completion_tokens < LONG, "bob's stream was not cut mid-way")
    check(b2.remaining == b1.remaining - b2.settled, f"bob's cut stream was not settled with {b2.settled}")

    wait = a3.retry_after or 0
    clock.advance(wait)
    before = client.remaining(ALICE)
    print(f"... {wait} s later (the demo moves the store's clock): alice's balance is {before} ...")
    a4 = client.complete(ALICE, "Thanks", 3)
    say(a4, f"{a4.prompt_tokens} + {a4.streamed} streamed", "admitted again: time paid the debt back")
    check(a4.status == 200 and a4.remaining == before - a4.settled, "alice was not admitted after Retry-After")
    return steps, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the account to this file")
    parser.add_argument("--token-delay", type=float, default=0.001, help="seconds between two streamed tokens")
    args = parser.parse_args(argv)
    clock = FakeClock()
    app = create_app(token_delay=args.token_delay, clock=clock)
    rule = app.state.rule
    print(
        f"LLM gateway: rule {rule.name}, {rule.limits[0]} per API key in tokens ({rule.algorithm});\n"
        "each request is charged 1 when admitted and settled with its real cost when its response ends\n"
    )
    with serve(app) as (host, port):
        steps, problems = story(Client(host, port, app), clock)
    print("\nVERDICT: " + ("ok" if not problems else f"{len(problems)} problem(s)"))
    if args.json is not None:
        args.json.write_text(json.dumps({"steps": [asdict(s) for s in steps], "problems": problems}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
