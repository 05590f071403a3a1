"""``ratekeeper config check FILE``: exit 0 and a line per rule, or exit 1 and every problem."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import WriteFile
from ratekeeper.cli import COMMANDS, main

NATIVE = """
rules:
  - name: items.list
    match: {methods: [GET], path: "/items/{user}"}
    key: "{path.user}"
    limits: ["1/2s"]
  - name: auth.create_token
    match: {methods: [POST], path: /auth/token}
    key: "{client_ip}"
    limits: ["20/minute", "5/3s"]
    algorithm: sliding_window_log
    on_error: deny
    shadow: true
  - name: global
    key: "*"
    limits: [10/10s, 600/600s]
  - name: per_client
    limits: [5/s]
"""


def test_config_is_a_command() -> None:
    assert "config" in COMMANDS


def test_a_good_native_file_prints_a_line_per_rule(write: WriteFile, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(NATIVE)
    assert main(["config", "check", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "items.list: GET /items/{user} key={path.user} limits=1/2s algorithm=gcra",
        "auth.create_token: POST /auth/token key={client_ip} limits=20/minute, 5/3s algorithm=sliding_window_log"
        " [shadow on_error=deny]",
        "global: * /* key=global (*) limits=10/10s, 600/10min algorithm=gcra",
        "per_client: * /* key=client address (default) limits=5/second algorithm=gcra",
        f"{path}:15: warning: rule 'global': limit 600/10min can never bind beside 10/10s (it is redundant); remove it",
        f"{path}: native form, 4 rules, 1 warning: OK",
    ]


def test_a_good_envoy_file_prints_a_line_per_limited_descriptor(
    write: WriteFile, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        """
        domain: messaging
        descriptors:
          - key: message_type
            value: marketing
            rate_limit: {unit: day, requests_per_unit: 5}
          - key: user
            value: vip
            rate_limit: {unlimited: true}
          - key: user
            shadow_mode: true
            rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
        """
    )
    assert main(["config", "check", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "domain messaging",
        "messaging.message_type_marketing: limits=5/day algorithm=fixed_window",
        "messaging.user_vip: unlimited",
        "messaging.user: name=per_user limits=2/minute algorithm=fixed_window [shadow_mode]",
        f"{path}: Envoy form, domain 'messaging', 3 limited descriptors, 0 warnings: OK",
    ]


def test_a_bad_file_lists_every_problem_and_exits_1(write: WriteFile, capsys: pytest.CaptureFixture[str]) -> None:
    path = write("rules:\n  - name: a\n    limts: [1/s]\n  - name: b\n    limits: [1/s]\n    algorithm: gcr\n")
    assert main(["config", "check", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"{path}:2: rule 'a' has no limits; give one or more, e.g. limits: ['20/minute']",
        f"{path}:3: unknown field 'limts' in a rule (did you mean 'limits'?); accepted: name, match, key, limits, "
        "algorithm, burst, cost, on_error, shadow, quota",
        f"{path}:6: unknown algorithm 'gcr' (did you mean 'gcra'?); accepted: fixed_window, sliding_window_log, "
        "sliding_window_counter, token_bucket, gcra, leaky_bucket, concurrency",
        f"{path}: 3 problems; the file was not loaded",
    ]


def test_a_bad_envoy_file_exits_1(write: WriteFile, capsys: pytest.CaptureFixture[str]) -> None:
    path = write("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
    assert main(["config", "check", str(path)]) == 1
    assert f"{path}:4: unknown unit 'fortnight'" in capsys.readouterr().err


def test_a_missing_file_exits_1(write: WriteFile, capsys: pytest.CaptureFixture[str]) -> None:
    path = write("rules: []\n").with_name("nope.yaml")
    assert main(["config", "check", str(path)]) == 1
    assert "cannot read the rules file" in capsys.readouterr().err


def test_the_command_runs_as_a_module(write: WriteFile) -> None:
    import subprocess
    import sys

    path = write(NATIVE)
    done = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "config", "check", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0 and "items.list: GET" in done.stdout


def test_an_envoy_file_without_domain_is_told_so_by_the_real_command(write: WriteFile) -> None:
    """Envoy's rules with the ``domain:`` line forgotten: one problem saying that, not an
    unknown native field ``descriptors`` and a missing ``rules:``."""
    path = write("descriptors:\n  - key: generic_key\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
    result = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "config", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert 1 == result.returncode
    assert [
        f"{path}:1: this file looks like the Envoy form (top-level 'descriptors') but has no 'domain:'; "
        "add domain: <name> at the top level (or write 'rules:' for the native form)",
        f"{path}: 1 problem; the file was not loaded",
    ] == result.stderr.splitlines()
    assert "unknown field" not in result.stderr
