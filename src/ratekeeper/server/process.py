"""``serve(settings)``: one process, one event loop, HTTP and gRPC side by side.

- HTTP: ``HttpApp`` (plain ASGI) under ``uvicorn.Server`` run in-process (httptools;
  uvloop when installed), on a socket bound here so a busy port is a clear error.
- gRPC: ``grpc.aio`` with Envoy's ``RateLimitService`` and health checking.
- Every second: the store is probed (health status, ``store`` log line on each change)
  and the rules files are checked for changes (``reload`` log line).
- Signals: SIGHUP reloads the rules files now; SIGTERM and SIGINT stop gracefully: the
  health status turns ``NOT_SERVING``, both servers stop accepting, requests in flight
  finish (at most ``GRACE`` seconds), then the store is closed and ``serve`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ratekeeper.errors import ConfigurationError
from ratekeeper.limiter.async_limiter import AsyncLimiter
from ratekeeper.metrics import Metrics
from ratekeeper.server.examples import EXAMPLE_ENVOY, EXAMPLE_RULES, example_catalog
from ratekeeper.server.grpc_service import build_grpc_server
from ratekeeper.server.http_app import HttpApp
from ratekeeper.server.logs import configure, log
from ratekeeper.server.service import RulesFiles, Service, ServiceObserver, redact, summary

__all__ = ["GRACE", "Settings", "run", "serve"]

GRACE = 10.0
"""Seconds requests in flight get to finish after SIGTERM."""

TICK = 1.0
"""Seconds between two store probes and two looks at the rules files."""


@dataclass(frozen=True, slots=True)
class Settings:
    """What ``ratekeeper serve`` was told (options, else environment, else defaults)."""

    rules: tuple[str, ...] = ()
    store: str = "memory://"
    host: str = "127.0.0.1"
    http_port: int = 8080
    grpc_port: int = 8081
    on_error: str = "raise"
    over_limit_cache: bool = False


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind the HTTP port {host}:{port}: {exc.strerror}") from exc
    return sock


def _uvicorn_server(app: HttpApp) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its own signal handlers: this process handles the signals."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        app,
        http="httptools",
        loop="none",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=int(GRACE),
    )
    return Server(config)


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Run the service until SIGTERM or SIGINT; ``ready`` is set once both servers listen."""
    configure()
    metrics = Metrics()
    files = RulesFiles(list(settings.rules), metrics) if settings.rules else None
    catalog = files.catalog() if files is not None else example_catalog()
    limiter = AsyncLimiter(
        settings.store,
        on_error=settings.on_error,
        observer=ServiceObserver(metrics),
        over_limit_cache=settings.over_limit_cache,
    )
    if limiter.over_limit_cache is not None:
        metrics.watch_over_limit_cache(limiter.over_limit_cache)
    service = Service(limiter, metrics, catalog, files, settings.store)
    try:
        await _run(service, settings, ready)
    finally:
        await limiter.aclose()


async def _run(service: Service, settings: Settings, ready: asyncio.Event | None) -> None:
    loop = asyncio.get_running_loop()
    sock = _bind(settings.host, settings.http_port)
    http = _uvicorn_server(HttpApp(service))
    grpc_server, health, grpc_port = build_grpc_server(service, settings.host, settings.grpc_port)
    stop = asyncio.Event()
    received: list[str] = []

    def on_stop(sig: signal.Signals) -> None:
        received.append(sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, lambda: service.reload("SIGHUP", force=True))

    await grpc_server.start()
    http_task = asyncio.create_task(http.serve(sockets=[sock]), name="http")
    while not http.started and not http_task.done():
        await asyncio.sleep(0.01)
    if http_task.done():  # uvicorn gave up at startup: say why
        await grpc_server.stop(0)
        http_task.result()
        raise OSError("the HTTP server did not start")
    await health.set(await service.store_problem() is None)
    ticker = asyncio.create_task(_tick(service, health, stop), name="tick")
    log(
        "start",
        http=f"http://{_url_host(settings.host)}:{sock.getsockname()[1]}",
        grpc=f"{_url_host(settings.host)}:{grpc_port}",
        store=redact(settings.store),
        on_error=settings.on_error,
        over_limit_cache=service.limiter.over_limit_cache is not None,
        **summary(service.catalog),
    )
    if ready is not None:
        ready.set()
    await stop.wait()

    log("stopping", signal=received[0] if received else None, grace=GRACE)
    ticker.cancel()
    await health.shutting_down()
    http.should_exit = True
    await asyncio.gather(grpc_server.stop(GRACE), http_task, return_exceptions=False)
    with contextlib.suppress(asyncio.CancelledError):
        await ticker
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    log("stop", signal=received[0] if received else None)


async def _tick(service: Service, health: Any, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(TICK)
        try:
            await health.set(await service.store_problem() is None)
            service.reload("file changed")
        except Exception as exc:  # noqa: BLE001 - the ticker must outlive one bad tick
            log("tick", level="error", error=repr(exc))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _loop_factory() -> Any:
    try:
        import uvloop
    except ModuleNotFoundError:  # pragma: no cover - uvicorn[standard] brings it
        return None
    return uvloop.new_event_loop


def _try_it(settings: Settings) -> str:
    """What to type in another terminal to see the example rules at work."""
    if not settings.http_port:
        return ""
    base = f"http://{_url_host(settings.host)}:{settings.http_port}"
    check = f"curl -i {base}/v1/check -H 'content-type: application/json' -d"
    return (
        "Try it from another terminal:\n"
        f'  {check} \'{{"rule": "items.list", "key": "alice"}}\'   # 200; again within 2 s: 429\n'
        f'  {check} \'{{"checks": [{{"rule": "items.list", "key": "bob"}}, '
        f'{{"rule": "auth.create_token", "key": "10.0.0.7"}}]}}\'   # all or nothing\n'
        f"  curl -s {base}/metrics | grep ratekeeper_decisions\n"
        f"  curl -s {base}/openapi.json\n"
    )


def run(settings: Settings) -> int:
    """``ratekeeper serve``: print the example rules when no file is given, serve until
    stopped; 0 after a clean stop, 2 when the service cannot start."""
    if not settings.rules:
        print("ratekeeper serve: no --rules file, serving the example rules:\n")
        print(EXAMPLE_RULES)
        print(EXAMPLE_ENVOY)
        print(_try_it(settings), flush=True)
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(serve(settings))
    except (ConfigurationError, OSError) as exc:
        configure()
        log("start", level="error", ok=False, error=str(exc))
        print(f"ratekeeper serve: {exc}", file=sys.stderr)
        return 2
    return 0
