"""``ratekeeper serve --workers N``: N worker processes behind the same ports, one supervisor.

Each worker is a whole service (``process.serve``: its event loop, its limiter, its HTTP
and gRPC servers). The decision surface's HTTP port and the gRPC port are shared: every
worker binds them with ``SO_REUSEPORT`` and the kernel spreads new connections over the
workers. The admin surface is one port per worker: worker ``i`` listens on
``admin_port + i`` (on free ports when ``admin_port`` is 0; the ``supervisor`` log line
lists them), so ``/metrics`` of one port is one worker's counts, never a random worker's:
scrape every worker and sum them (docs/deployment.md). Resets, refunds and the store API
act on the shared store, so any worker's admin surface does.

The supervisor binds every port first, with ``SO_REUSEPORT`` and without listening, so a
busy port is one clear error before any worker starts, a port of 0 is chosen once, and a
port stays reserved while its worker restarts.

The supervisor does no request work:

- a worker that dies after it served is started again on the same ports (after
  ``RESTART_DELAY`` when it lived less than ``SHORT_LIFE``); one that fails before it
  serves (a busy port, a bad rules file) stops every worker, and ``serve`` ends with 2;
- SIGHUP is passed to every serving worker: each reads the rules, TLS and token files
  again;
- SIGTERM and SIGINT are passed to every worker: each stops accepting and answers the
  requests in flight (``process.GRACE``), then the supervisor ends.

Counting needs one state for all workers: a ``memory://`` store would be one count per
worker, so ``--workers`` above 1 refuses it (``memory_refused``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import multiprocessing
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from ratekeeper.errors import ConfigurationError
from ratekeeper.server.logs import configure, log

__all__ = ["STOP_MARGIN", "memory_refused", "reserve", "supervise"]

STOP_MARGIN = 5.0
"""Seconds past the workers' grace the supervisor waits before it kills a worker."""

SHORT_LIFE = 2.0
"""A worker that dies within these seconds of its start is started again only after
``RESTART_DELAY``: a worker that cannot live does not take a core restarting."""

RESTART_DELAY = 1.0


def memory_refused(store: str, workers: int) -> str | None:
    """Why ``store`` cannot serve ``workers`` processes, or None when it can."""
    if workers > 1 and store.split(":", 1)[0].lower() == "memory":
        return (
            f"--workers {workers} needs a store the workers share: on memory:// each worker would keep its own "
            f"counts and admit up to {workers} times each limit; use --store redis://host:6379/0 or "
            "--store postgresql://user@host/db (or --workers 1 for the memory store)"
        )
    return None


def reserve(host: str, port: int, what: str) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` and not listening: it holds
    the port (a 0 becomes a free one) for the workers, and takes no connection itself."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot bind the {what} port {host}:{port}: {exc.strerror}") from exc
    return sock


@dataclass(slots=True)
class _Worker:
    """One worker process and what the supervisor knows of it."""

    index: int
    settings: Any
    process: Any = None
    ready_pipe: Connection | None = None
    serving: bool = False
    started_at: float = 0.0
    restart_at: float | None = None


def _worker_settings(settings: Any, http_port: int | None, grpc_port: int | None, admin_port: int | None) -> Any:
    return dataclasses.replace(
        settings, http_port=http_port, grpc_port=grpc_port, admin_port=admin_port, reuse_port=True
    )


def _run_worker(settings: Any, index: int, ready_pipe: Connection) -> None:
    """A worker's process: the service until SIGTERM, ``ready_pipe`` told once it serves."""
    from ratekeeper.server import process

    # Until the service's own handler is in place a SIGHUP must not end the worker: it
    # reads the rules files as they are when it starts anyway.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)

    async def main() -> None:
        ready = asyncio.Event()
        service = asyncio.create_task(process.serve(settings, ready))
        ready_wait = asyncio.create_task(ready.wait())
        await asyncio.wait({service, ready_wait}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            ready_pipe.send(os.getpid())
        ready_wait.cancel()
        ready_pipe.close()
        await service

    sys.exit(process.run_loop(main, f"worker {index}"))


class _Supervisor:
    def __init__(self, settings: Any, workers: int) -> None:
        self.context = multiprocessing.get_context("spawn")
        self.reserved: list[socket.socket] = []
        http_port, grpc_port = settings.http_port, settings.grpc_port
        if settings.admin_port and settings.admin_port + workers - 1 > 65535:
            raise ConfigurationError(
                f"--admin-port {settings.admin_port} leaves no room for {workers} workers' admin ports"
            )
        admin_ports: list[int | None] = [None] * workers
        try:
            if http_port is not None:
                http_port = self._reserve(settings.host, http_port, "decision HTTP")
            if grpc_port is not None:
                grpc_port = self._reserve(settings.host, grpc_port, "gRPC")
            if settings.admin_port is not None:
                admin_ports = [
                    self._reserve(settings.admin_host, settings.admin_port and settings.admin_port + i, "admin HTTP")
                    for i in range(workers)
                ]
        except BaseException:
            self.close()
            raise
        self.http_port, self.grpc_port, self.admin_ports = http_port, grpc_port, admin_ports
        self.workers = [
            _Worker(i, _worker_settings(settings, http_port, grpc_port, admin_ports[i])) for i in range(workers)
        ]
        self.signals: list[int] = []
        self.stopping: str | None = None

    def _reserve(self, host: str, port: int, what: str) -> int:
        self.reserved.append(reserve(host, port, what))
        bound: int = self.reserved[-1].getsockname()[1]
        return bound

    def close(self) -> None:
        for sock in self.reserved:
            sock.close()

    def start(self, worker: _Worker) -> None:
        reader, writer = self.context.Pipe(duplex=False)
        worker.process = self.context.Process(
            target=_run_worker, args=(worker.settings, worker.index, writer), name=f"ratekeeper-worker-{worker.index}"
        )
        worker.process.start()
        writer.close()
        worker.ready_pipe, worker.serving, worker.started_at = reader, False, time.monotonic()
        log("worker", index=worker.index, pid=worker.process.pid, state="starting")

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
        previous = {sig: signal.signal(sig, lambda number, _frame: self.signals.append(number)) for sig in handled}
        previous_wakeup = signal.set_wakeup_fd(wake_write)
        try:
            for worker in self.workers:
                self.start(worker)
            log(
                "supervisor",
                pid=os.getpid(),
                workers=len(self.workers),
                http_port=self.http_port,
                grpc_port=self.grpc_port,
                admin_ports=self.admin_ports,
            )
            return self._loop(wake_read)
        finally:
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)
            for worker in self.workers:  # a failure of the supervisor itself leaves no worker behind
                if worker.process is not None and worker.process.is_alive():
                    worker.process.kill()
                    worker.process.join()
            self.close()

    def _loop(self, wake_read: int) -> int:
        from ratekeeper.server.process import GRACE

        all_serving = False
        failed = False
        deadline: float | None = None
        while True:
            alive = [w for w in self.workers if w.process is not None]
            due = [w.restart_at for w in self.workers if w.restart_at is not None and self.stopping is None]
            if not alive and not due:
                return 2 if failed else 0
            waits: list[Any] = [wake_read]
            waits += [w.process.sentinel for w in alive]
            waits += [w.ready_pipe for w in alive if w.ready_pipe is not None]
            wakes = due + ([deadline] if deadline is not None else [])
            wait(waits, max(0.0, min(wakes) - time.monotonic()) if wakes else None)
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)
            pending, self.signals = self.signals, []  # a handler may append meanwhile
            for number in pending:
                sig = signal.Signals(number)
                if sig == signal.SIGHUP and self.stopping is None:
                    self._pass(sig, serving_only=True)
                elif sig in (signal.SIGTERM, signal.SIGINT) and self.stopping is None:
                    self.stopping = sig.name
                    deadline = time.monotonic() + GRACE + STOP_MARGIN
                    log("stopping", signal=sig.name, workers=len(alive), grace=GRACE)
                    self._pass(signal.SIGTERM, serving_only=False)
            for worker in alive:
                if worker.ready_pipe is not None and worker.ready_pipe.poll():
                    with contextlib.suppress(EOFError, OSError):
                        worker.ready_pipe.recv()
                        worker.serving = True
                        log("worker", index=worker.index, pid=worker.process.pid, state="serving")
                    worker.ready_pipe.close()
                    worker.ready_pipe = None
                if worker.process.is_alive():
                    continue
                worker.process.join()
                code, pid, served = worker.process.exitcode, worker.process.pid, worker.serving
                worker.process, worker.serving = None, False
                if worker.ready_pipe is not None:
                    worker.ready_pipe.close()
                    worker.ready_pipe = None
                if self.stopping is not None:
                    log("worker", index=worker.index, pid=pid, state="stopped", exitcode=code)
                    # SIGTERM ends a starting worker whose own handler is not in place yet: no failure
                    failed = failed or code not in (0, -signal.SIGTERM)
                elif not served and code is not None and code > 0:
                    # It never served and said why (a busy port, a bad file): the next
                    # one would fail alike, so nothing is served at all.
                    log("worker", level="error", index=worker.index, pid=pid, state="failed", exitcode=code)
                    failed = True
                    self.stopping = "failed"
                    deadline = time.monotonic() + GRACE + STOP_MARGIN
                    self._pass(signal.SIGTERM, serving_only=False)
                else:
                    short = time.monotonic() - worker.started_at < SHORT_LIFE
                    delay = RESTART_DELAY if short else 0.0
                    log(
                        "worker", level="error", index=worker.index, pid=pid, state="died", exitcode=code, restart=delay
                    )
                    worker.restart_at = time.monotonic() + delay
            for worker in self.workers:
                if worker.restart_at is not None and self.stopping is None and worker.restart_at <= time.monotonic():
                    worker.restart_at = None
                    self.start(worker)
            if not all_serving and all(w.serving for w in self.workers):
                all_serving = True
                log("ready", workers=len(self.workers), pids=[w.process.pid for w in self.workers])
            if deadline is not None and time.monotonic() >= deadline:
                for worker in self.workers:
                    if worker.process is not None and worker.process.is_alive():
                        log("worker", level="error", index=worker.index, pid=worker.process.pid, state="killed")
                        worker.process.kill()
                deadline = None

    def _pass(self, sig: signal.Signals, serving_only: bool) -> None:
        """Send ``sig`` to the workers (only those serving: one that is starting reads the
        files as they are anyway)."""
        for worker in self.workers:
            if worker.process is not None and (worker.serving or not serving_only):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, sig)
        log("signal", signal=sig.name, workers=sum(1 for w in self.workers if w.process is not None))


def supervise(settings: Any, workers: int) -> int:
    """Serve ``settings`` with ``workers`` processes until SIGTERM or SIGINT; 0 after a
    clean stop, 2 when a worker could not start (``OSError`` when a port is busy)."""
    configure()
    problem = memory_refused(settings.store, workers)
    if problem is not None:
        raise ConfigurationError(problem)
    return _Supervisor(settings, workers).run()
