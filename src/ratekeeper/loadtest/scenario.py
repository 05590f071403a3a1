"""The built-in scenario, the API-gateway team's test: our app (``loadtest.app``) started
under uvicorn, and one profile per kind of user: an account per plan (1/minute, 10/s,
100/s), an unknown account (the failsafe applies), a flood of unique unknown accounts (a
new id each request: the server's memory must stay flat), the admin who bypasses the
limiter (the control), and anonymous traffic. Each trial gets a fresh server, so no
trial inherits another's counts."""

from __future__ import annotations

import http.client
import os
import sys
import time
from pathlib import Path

from ratekeeper.limit import Limit
from ratekeeper.loadtest.app import ACCOUNT_HEADER, ACCOUNTS, ADMIN, ANONYMOUS_LIMIT, FAILSAFE
from ratekeeper.loadtest.process import HOST, ProcessError, ServerProcess, free_port
from ratekeeper.loadtest.profiles import Plan, Profile, Stage

__all__ = ["AppServer", "scenario_plan"]

START_TIMEOUT = 30.0


def scenario_plan(target: str, seconds: float) -> Plan:
    """Every profile sends more than its limit admits, so each bound is met exactly."""

    def profile(name: str, rate: float, account: str | None, expect: str | None, control: bool = False) -> Profile:
        headers = {ACCOUNT_HEADER: account} if account is not None else {}
        return Profile(
            name, (Stage(rate, seconds),), headers=headers,
            expect=Limit.parse(expect) if expect else None, control=control,
        )  # fmt: skip

    return Plan(
        target,
        (
            profile("alice (1/minute)", 20, "alice@example.com", ACCOUNTS["alice@example.com"]),
            profile("bob (10/s)", 40, "bob@example.com", ACCOUNTS["bob@example.com"]),
            profile("carol (100/s)", 150, "carol@example.com", ACCOUNTS["carol@example.com"]),
            profile("unknown (failsafe)", 20, "nobody@example.com", FAILSAFE),
            profile("flood of unknown ids", 150, "invalid-{n}@example.com", None),
            profile("admin (control)", 100, ADMIN, None, control=True),
            profile("anonymous", 40, None, ANONYMOUS_LIMIT),
        ),
    )


class AppServer(ServerProcess):
    """The scenario's app under uvicorn on a free loopback port."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        super().__init__(log_dir / f"app-{self.port}.log")

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> None:
        command = [
            sys.executable, "-m", "uvicorn", "--factory", "ratekeeper.loadtest.app:create_app",
            "--host", HOST, "--port", str(self.port), "--no-access-log", "--log-level", "warning",
        ]  # fmt: skip
        self.spawn(command, {**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.exited():
                raise ProcessError(f"the scenario's app exited: {self.log_tail()}")
            conn = http.client.HTTPConnection(HOST, self.port, timeout=1.0)
            try:
                # As the admin: the probe must not spend any profile's allowance.
                conn.request("GET", "/", headers={ACCOUNT_HEADER: ADMIN})
                conn.getresponse().read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise ProcessError(f"the scenario's app did not answer in {START_TIMEOUT:g} s") from None
                time.sleep(0.1)
            finally:
                conn.close()
