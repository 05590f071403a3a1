"""``serve(settings)``: one process, one event loop, HTTP and gRPC side by side.

- HTTP: two surfaces (``surfaces.py``), each an ``HttpApp`` (plain ASGI) under its own
  ``uvicorn.Server`` run in-process with the defences of ``http_server.py`` (httptools;
  uvloop when installed), on a socket bound here so a busy port is a clear error: the
  decision surface on ``host:http_port``, the admin surface on ``admin_host:admin_port``.
  A port of None turns its listener off.
- gRPC: ``grpc.aio`` with Envoy's ``RateLimitService`` and health checking.
- TLS (``tls.py``) on every listener when a certificate is given; bearer tokens
  (``auth.py``) per surface when given.
- Every second: the store is probed (health status, ``store`` log line on each change)
  and the rules files are checked for changes (``reload`` log line).
- Signals: SIGHUP reloads the rules files, the TLS files and the token files now;
  SIGTERM and SIGINT stop gracefully: the health status turns ``NOT_SERVING``, every
  server stops accepting, requests in flight finish (at most ``GRACE`` seconds), then the
  store is closed and ``serve`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ratekeeper.errors import ConfigurationError
from ratekeeper.limiter.limiter_async import AsyncLimiter
from ratekeeper.metrics import Metrics
from ratekeeper.otel import from_environment as otel_from_environment
from ratekeeper.server.auth import TokenSource
from ratekeeper.server.envoy import overrides_of
from ratekeeper.server.envoy_charging import set_service_charging
from ratekeeper.server.examples import EXAMPLE_ENVOY, EXAMPLE_RULES, example_catalog
from ratekeeper.server.grpc_service import GrpcLimits, Health, build_grpc_server
from ratekeeper.server.http_app import HttpApp
from ratekeeper.server.http_server import HttpLimits, bind, http_server, raise_open_files_limit
from ratekeeper.server.logs import configure, log
from ratekeeper.server.service import RulesFiles, Service, ServiceObserver, redact, summary
from ratekeeper.server.status_page import history_of
from ratekeeper.server.store_api import PLANS
from ratekeeper.server.surfaces import ADMIN, DECISION, Surface
from ratekeeper.server.tls import TlsFiles, TlsState

__all__ = ["GRACE", "Settings", "run", "run_loop", "serve"]

GRACE = 10.0
"""Seconds requests in flight get to finish after SIGTERM."""

TICK = 1.0
"""Seconds between two store probes and two looks at the rules files."""

FILES_RESERVE = 128
"""Open files kept out of the HTTP connection caps: the store's connections, the gRPC
server, the log, the rules files."""


@dataclass(frozen=True, slots=True)
class TokenOptions:
    """Where a surface's tokens come from: a file, else an environment variable's text."""

    file: str | None = None
    text: str | None = None
    env_name: str = ""

    def load(self) -> TokenSource:
        return TokenSource.load(self.file, self.text, self.env_name)


@dataclass(frozen=True, slots=True)
class Settings:
    """What ``ratekeeper serve`` was told (options, else environment, else defaults).
    A port of None turns that listener off."""

    rules: tuple[str, ...] = ()
    store: str = "memory://"
    host: str = "127.0.0.1"
    http_port: int | None = 8080
    grpc_port: int | None = 8081
    admin_host: str = "127.0.0.1"
    admin_port: int | None = 8082
    store_api: bool = False
    decision_tokens: TokenOptions = TokenOptions(env_name="RATEKEEPER_DECISION_TOKENS")
    admin_tokens: TokenOptions = TokenOptions(env_name="RATEKEEPER_ADMIN_TOKENS")
    tls: TlsFiles | None = None
    http_limits: HttpLimits = dataclasses.field(default_factory=HttpLimits)
    grpc_limits: GrpcLimits = dataclasses.field(default_factory=GrpcLimits)
    on_error: str = "raise"
    over_limit_cache: bool = False
    envoy_charging: str | None = None  # None: each Envoy file's own, else "envoy"
    merge_domains: bool = False
    shadow_mode: bool = False
    otel: bool = False  # the metrics and a span per decision through OpenTelemetry too (OTEL_* variables)
    otel_record_key: bool = False  # each span carries the decision's key (bounded); off: keys are clients' data
    reuse_port: bool = False  # a worker of several (supervisor.py): its ports are the supervisor's


@dataclass(slots=True)
class _Listener:
    """One HTTP surface being served."""

    surface: Surface
    host: str
    sock: Any
    server: Any
    secure: bool  # TLS (done by the listener's protocol, not uvicorn: see http_server.py)
    task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{_url_host(self.host)}:{self.sock.getsockname()[1]}"

    @property
    def scheme(self) -> str:
        return "https" if self.secure else "http"


async def serve(settings: Settings, ready: asyncio.Event | None = None) -> None:
    """Run the service until SIGTERM or SIGINT; ``ready`` is set once both servers listen."""
    configure()
    otel, shutdown_otel = otel_from_environment(record_key=settings.otel_record_key) if settings.otel else (None, None)
    metrics = Metrics(otel=otel)
    files = (
        RulesFiles(list(settings.rules), merge_domains=settings.merge_domains, shadow=settings.shadow_mode)
        if settings.rules
        else None
    )
    catalog = files.catalog() if files is not None else example_catalog()
    limiter = AsyncLimiter(
        settings.store,
        on_error=settings.on_error,
        observer=ServiceObserver(metrics),
        over_limit_cache=settings.over_limit_cache,
    )
    if limiter.over_limit_cache is not None:
        metrics.watch_over_limit_cache(limiter.over_limit_cache)
    if settings.store_api:  # the rules store-API clients send: bounded, evictions counted
        metrics.watch_cache("store_api_rules", PLANS.cache)
    service = Service(limiter, metrics, catalog, files, settings.store)
    set_service_charging(service, settings.envoy_charging)
    overrides_of(service)  # Envoy limit overrides: bounded, their metrics shown from the start
    try:
        await _run(service, settings, ready)
    finally:
        await limiter.aclose()
        if shutdown_otel is not None:
            shutdown_otel()  # exports what is still buffered


async def _run(service: Service, settings: Settings, ready: asyncio.Event | None) -> None:
    loop = asyncio.get_running_loop()
    if settings.http_port is None and settings.admin_port is None and settings.grpc_port is None:
        raise ConfigurationError(
            "every listener is off; leave at least one of --http-port, --admin-port, --grpc-port on"
        )
    if settings.store_api and settings.admin_port is None:
        raise ConfigurationError("--store-api serves /v1/store on the admin surface, which is off (--admin-port off)")
    tls = TlsState(settings.tls) if settings.tls is not None else None
    decision_tokens, admin_tokens = settings.decision_tokens.load(), settings.admin_tokens.load()
    wanted = [(Surface(DECISION, decision_tokens), settings.host, settings.http_port)]
    wanted.append((Surface(ADMIN, admin_tokens, settings.store_api), settings.admin_host, settings.admin_port))
    serving = [(surface, host, port) for surface, host, port in wanted if port is not None]
    limits = _fit_to_open_files(settings.http_limits, raise_open_files_limit(), len(serving))
    listeners: list[_Listener] = []
    try:
        for surface, host, port in serving:
            sock = bind(host, port, f"{surface.name} HTTP", reuse_port=settings.reuse_port)
            server = http_server(HttpApp(service, surface), limits, tls.context if tls else None, GRACE)
            listeners.append(_Listener(surface, host, sock, server, secure=tls is not None))
    except BaseException:
        for listener in listeners:
            listener.sock.close()
        raise
    grpc_server: Any = None
    health, grpc_port = Health(), None
    if settings.grpc_port is not None:
        grpc_server, health, grpc_port = build_grpc_server(
            service, settings.host, settings.grpc_port, decision_tokens, settings.grpc_limits, tls
        )
    stop = asyncio.Event()
    received: list[str] = []

    def on_stop(sig: signal.Signals) -> None:
        received.append(sig.name)
        stop.set()

    def on_hup() -> None:
        _reload_secrets(tls, {DECISION: decision_tokens, ADMIN: admin_tokens})
        service.reload_soon("SIGHUP", force=True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_stop, sig)
    loop.add_signal_handler(signal.SIGHUP, on_hup)

    if grpc_server is not None:
        await grpc_server.start()
    for listener in listeners:
        listener.task = asyncio.create_task(listener.server.serve(sockets=[listener.sock]), name=listener.surface.name)
    for listener in listeners:
        task = listener.task
        assert task is not None
        while not listener.server.started and not task.done():
            await asyncio.sleep(0.01)
        if task.done():  # uvicorn gave up at startup: say why
            if grpc_server is not None:
                await grpc_server.stop(0)
            task.result()
            raise OSError(f"the {listener.surface.name} HTTP server did not start")
    await health.set(await service.store_problem() is None)
    ticker = asyncio.create_task(_tick(service, health, stop), name="tick")
    # The status page's charts (admin surface): decisions per rule sampled every few seconds
    # into a bounded ring; nothing to sample for when that surface is off.
    sampler = asyncio.create_task(
        history_of(service).run() if settings.admin_port is not None else stop.wait(), name="status sampler"
    )
    urls = {listener.surface.name: listener.url for listener in listeners}
    _warn_if_exposed(
        settings, listeners, grpc_port is not None, tls is not None
    )  # before "start": a reader of the log sees both
    log(
        "start",
        http=urls.get(DECISION),
        admin=urls.get(ADMIN),
        grpc=None if grpc_port is None else f"{_url_host(settings.host)}:{grpc_port}",
        tls=tls is not None,
        client_certificates=settings.tls is not None and settings.tls.client_ca is not None,
        decision_tokens=decision_tokens.tokens.names,
        admin_tokens=admin_tokens.tokens.names,
        store_api=settings.store_api,
        max_connections=limits.max_connections,
        store=redact(settings.store),
        on_error=settings.on_error,
        over_limit_cache=service.limiter.over_limit_cache is not None,
        envoy_charging=settings.envoy_charging,
        **summary(service.catalog),
    )
    if ready is not None:
        ready.set()
    await stop.wait()

    log("stopping", signal=received[0] if received else None, grace=GRACE)
    ticker.cancel()
    sampler.cancel()
    await health.shutting_down()
    for listener in listeners:
        listener.server.should_exit = True
    stopping = [listener.task for listener in listeners if listener.task is not None]
    if grpc_server is not None:
        stopping.append(asyncio.ensure_future(grpc_server.stop(GRACE)))
    await asyncio.gather(*stopping, return_exceptions=False)
    with contextlib.suppress(asyncio.CancelledError):
        await ticker
    with contextlib.suppress(asyncio.CancelledError):
        await sampler
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.remove_signal_handler(sig)
    log("stop", signal=received[0] if received else None)


def _fit_to_open_files(limits: HttpLimits, open_files: int, listeners: int) -> HttpLimits:
    """``limits`` with a connection cap each listener can keep under the open-file limit:
    past that limit ``accept`` fails and every newcomer waits, the legitimate ones too."""
    room = max(16, (open_files - FILES_RESERVE) // max(1, listeners))
    if limits.max_connections <= room:
        return limits
    log(
        "limits",
        level="warning",
        max_connections=room,
        asked=limits.max_connections,
        open_files=open_files,
        reason="the open-file limit leaves room for fewer connections per listener; raise it (ulimit -n) for more",
    )
    return dataclasses.replace(limits, max_connections=room)


def _reload_secrets(tls: TlsState | None, tokens: dict[str, TokenSource]) -> None:
    """SIGHUP: read the TLS files and the token files again; a file that is not usable
    now leaves what was in force, and the log says why."""
    if tls is not None:
        try:
            log("tls", reloaded=tls.reload(), cert=tls.files.cert)
        except ConfigurationError as exc:
            log("tls", level="error", reloaded=False, error=str(exc))
    for surface, source in tokens.items():
        if source.file is None:
            continue
        try:
            log("tokens", surface=surface, reloaded=source.reload(), names=source.tokens.names)
        except ConfigurationError as exc:
            log("tokens", level="error", surface=surface, reloaded=False, error=str(exc))


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _warn_if_exposed(settings: Settings, listeners: list[_Listener], grpc: bool, tls: bool) -> None:
    """A warning for each listener bound beyond loopback with neither a token nor TLS:
    anyone who can reach it can use it, and read what it sends."""
    exposed = [
        (listener.surface.name, listener.url)
        for listener in listeners
        if not _is_loopback(listener.host) and not (listener.surface.tokens.tokens or tls)
    ]
    if (
        grpc
        and not _is_loopback(settings.host)
        and not (settings.decision_tokens.file or settings.decision_tokens.text or tls)
    ):
        exposed.append(("grpc", f"{_url_host(settings.host)}:{settings.grpc_port}"))
    for surface, url in exposed:
        log(
            "exposed",
            level="warning",
            surface=surface,
            listen=url,
            detail="listening beyond loopback without a token or TLS: anyone who reaches it can use it",
            remedy="--decision-token-file / --admin-token-file, --tls-cert and --tls-key, or a loopback --host",
        )


async def _tick(service: Service, health: Any, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await asyncio.sleep(TICK)
        try:
            await health.set(await service.store_problem() is None)
            await service.reload("file changed")
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
    lines = [
        "Try it from another terminal:",
        f'  {check} \'{{"rule": "items.list", "key": "alice"}}\'   # 200; again within 2 s: 429',
        f'  {check} \'{{"checks": [{{"rule": "items.list", "key": "bob"}}, '
        f'{{"rule": "auth.create_token", "key": "10.0.0.7"}}]}}\'   # all or nothing',
        f"  curl -s {base}/openapi.json",
    ]
    if settings.admin_port:
        admin = f"http://{_url_host(settings.admin_host)}:{settings.admin_port}"
        lines.append(f"  curl -s {admin}/metrics | grep ratekeeper_decisions   # the admin surface")
        lines.append(f"The status page (rules, live decisions, a form to try a check): {admin}/")
    return "\n".join(lines) + "\n"


def run_loop(main: Callable[[], Coroutine[Any, Any, None]], what: str = "serve") -> int:
    """Run ``main()`` on a new event loop (uvloop when installed): 0 once it returns, 2 when
    the service cannot start (the reason logged and printed)."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(main())
    except (ConfigurationError, OSError) as exc:
        return _cannot_start(exc, what)
    return 0


def _cannot_start(exc: Exception, what: str = "serve") -> int:
    configure()
    log("start", level="error", ok=False, error=str(exc))
    print(f"ratekeeper {what}: {exc}", file=sys.stderr)
    return 2


def run(settings: Settings, workers: int = 1) -> int:
    """``ratekeeper serve``: print the example rules when no file is given, serve until
    stopped (``workers`` processes under a supervisor when above 1, ``supervisor.py``);
    0 after a clean stop, 2 when the service cannot start."""
    from ratekeeper.server.supervisor import memory_refused, supervise

    try:
        problem = memory_refused(settings.store, workers)
        if problem is not None:
            raise ConfigurationError(problem)
        if not settings.rules:
            print("ratekeeper serve: no --rules file, serving the example rules:\n")
            print(EXAMPLE_RULES)
            print(EXAMPLE_ENVOY)
            print(_try_it(settings), flush=True)
        if workers > 1:
            return supervise(settings, workers)
    except (ConfigurationError, OSError) as exc:
        return _cannot_start(exc)
    return run_loop(lambda: serve(settings))
