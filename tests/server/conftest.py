"""Fixtures of the service tests: the real ``python -m ratekeeper serve`` in a subprocess
on free ports (the decision surface, gRPC and the admin surface), waited for until
``/healthz`` answers, stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from servers import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass
class Served:
    """A running ``ratekeeper serve``."""

    proc: subprocess.Popen[bytes]
    http_port: int
    grpc_port: int
    log: Path
    stdout: Path
    rules: list[Path] = field(default_factory=list)
    admin_port: int | None = None

    @property
    def url(self) -> str:
        """The decision surface."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin_url(self) -> str:
        """The admin surface (reset, refund, rules, metrics, store API)."""
        assert self.admin_port is not None, "this service was started with --admin-port off"
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def events(self) -> list[dict[str, object]]:
        """The JSON log lines written so far."""
        out = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


def _healthy(url: str) -> bool:
    return httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200


def start_server(
    tmp_path: Path,
    rules: list[str] | None = None,
    store: str | None = None,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    ports_from_env: bool = False,
    admin: bool = True,
    ready: Callable[[Served], bool] | None = None,
    open_files: int | None = None,
) -> Served:
    """Write ``rules`` (YAML texts) to files and start the service on them (the ports as
    options, or as RATEKEEPER_HTTP_PORT / _GRPC_PORT / _ADMIN_PORT when ``ports_from_env``;
    ``admin=False``: ``--admin-port off``). ``ready(served)`` says when it serves
    (default: ``/healthz`` of the decision surface answers 200). ``open_files`` sets the
    process's open-file limit (soft and hard)."""
    run_dir = tmp_path / f"serve-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir()
    paths = []
    for i, text in enumerate(rules or []):
        path = run_dir / f"rules{i}.yaml"
        path.write_text(text)
        paths.append(path)
    http_port, grpc_port, admin_port = free_port(), free_port(), free_port()
    admin_value = str(admin_port) if admin else "off"
    cmd = [sys.executable, "-m", "ratekeeper", "serve"]
    if open_files is not None:
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            pytest.skip("prlimit (util-linux) is not installed")
        cmd = [prlimit, f"--nofile={open_files}:{open_files}", "--", *cmd]
    if ports_from_env:
        env = {
            "RATEKEEPER_HTTP_PORT": str(http_port),
            "RATEKEEPER_GRPC_PORT": str(grpc_port),
            "RATEKEEPER_ADMIN_PORT": admin_value,
            **(env or {}),  # a test's own value (e.g. "off") wins
        }
    else:
        cmd += ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--admin-port", admin_value]
    for path in paths:
        cmd += ["--rules", str(path)]
    if store:
        cmd += ["--store", store]
    cmd += args or []
    log, stdout = run_dir / "stderr.log", run_dir / "stdout.log"
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    for name in list(environment):
        # The service's own settings come from this call only, never from the test runner's environment.
        if name.startswith("RATEKEEPER_") and name != "RATEKEEPER_REQUIRE_SERVICES" and name not in (env or {}):
            environment.pop(name)
    with log.open("wb") as err, stdout.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=environment, cwd=run_dir)
    served = Served(proc, http_port, grpc_port, log, stdout, paths, admin_port if admin else None)
    answers = ready or (lambda s: _healthy(s.url))
    try:
        wait_until(lambda: proc.poll() is not None or answers(served), timeout=30, what="ratekeeper serve")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.poll() is not None:
        raise RuntimeError(f"ratekeeper serve exited with {proc.returncode}:\n{log.read_text()}")
    return served


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """``serve(rules=[...], store=...)`` starts a service; every one is stopped at the end."""
    started: list[Served] = []

    def factory(*args: object, **kwargs: object) -> Served:
        served = start_server(tmp_path, *args, **kwargs)  # type: ignore[arg-type]
        started.append(served)
        return served

    yield factory
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait()


@pytest.fixture
def uid() -> str:
    """A prefix for this test's rule names and domains, so no two tests share state."""
    return f"t{uuid.uuid4().hex[:10]}"
