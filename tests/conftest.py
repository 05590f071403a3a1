"""Shared fixtures; the server stores' tests are marked ``redis`` / ``postgres``.

A marked test runs against the real server on this machine. When the server is not
reachable the test is skipped with the reason and the command that starts it, unless
``RATEKEEPER_REQUIRE_SERVICES=1`` (set by ``.ci/run``), which turns the skip into a
failure: CI never goes green by skipping them.
"""

from __future__ import annotations

import os
import socket
import uuid

import pytest

pytest_plugins = ["server_fixtures"]  # throwaway servers on spare ports: tests/servers.py

SERVICES = {
    "redis": (
        "127.0.0.1",
        6379,
        "redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save '' --appendonly no",
    ),
    "postgres": ("127.0.0.1", 5432, "pg_ctlcluster --skip-systemctl-redirect 15 main start"),
}
_reachable: dict[str, bool] = {}


def _is_up(name: str) -> bool:
    if name not in _reachable:
        host, port, _ = SERVICES[name]
        try:
            with socket.create_connection((host, port), timeout=1.0):
                _reachable[name] = True
        except OSError:
            _reachable[name] = False
    return _reachable[name]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for name, (host, port, start) in SERVICES.items():
        if item.get_closest_marker(name) is None or _is_up(name):
            continue
        reason = f"{name} is not reachable on {host}:{port} (start it with: {start})"
        if os.environ.get("RATEKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason}; RATEKEEPER_REQUIRE_SERVICES=1 forbids skipping it")
        pytest.skip(reason)


@pytest.fixture
def key_prefix() -> str:
    """A prefix unique to this test, for keys in the shared servers."""
    return f"rk-test-{uuid.uuid4().hex[:12]}"
