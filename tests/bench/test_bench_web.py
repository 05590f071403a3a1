"""``ratekeeper bench web`` starts real uvicorn and gunicorn servers, loads each case with wrk,
and prints a table per stack with numbers; every case answers what its name says (200 or
429), and the run leaves no Redis key behind."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import socket
import uuid
from pathlib import Path

import pytest
import redis as redis_py

from ratekeeper.cli import build_parser
from ratekeeper_bench import web
from ratekeeper_bench.web_apps import PATH, AppConfig
from ratekeeper_bench.web_apps.servers import FRAMEWORKS, Server, free_port
from ratekeeper_bench.web_apps.wrk import MARKER, WrkError, find_wrk, parse_output

pytestmark = pytest.mark.slow  # a benchmark run

STACKS = ("starlette", "django")
"""The quick run's stacks: uvicorn + ASGI and gunicorn + Django (Flask is checked in process
below), to stay well under a minute on a busy machine."""


@pytest.fixture(scope="module")
def wrk_installed() -> None:
    if find_wrk() is None:
        reason = "wrk is not installed (apt-get install wrk)"
        if os.environ.get("RATEKEEPER_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason}; RATEKEEPER_REQUIRE_SERVICES=1 forbids skipping it")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def quick(wrk_installed: None) -> tuple[web.WebBenchResult, str, str]:
    """One quick run: the result, the Markdown it printed and its progress lines."""
    parser = argparse.ArgumentParser()
    web.add_arguments(parser)
    argv = ["--quick", *(x for stack in STACKS for x in ("--stack", stack))]
    settings = web.settings_from_args(parser.parse_args(argv))
    prefix = f"rk-test-bench-web-{uuid.uuid4().hex[:12]}:"
    settings = dataclasses.replace(settings, prefix=prefix)
    out, err = io.StringIO(), io.StringIO()
    result = web.run_web_bench(settings, out, True, err)
    return result, out.getvalue(), err.getvalue()


@pytest.mark.redis
def test_quick_run_measures_every_case_of_the_chosen_stacks(quick: tuple[web.WebBenchResult, str, str]) -> None:
    result, _, progress = quick
    assert result.failures == [], progress
    assert result.skipped == []
    expected = [c for c in web.CASES if c.stack in STACKS]
    assert [r.case for r in result.results] == expected
    for r in result.results:
        w = r.median.wrk
        assert len(r.rounds) == 1
        assert w.requests > 0
        assert w.rate > 0
        assert 0 < w.p50_us <= w.p99_us <= w.max_us
        assert r.median.server_cpu > 0
        assert r.median.wrk_cpu > 0


@pytest.mark.redis
def test_allowed_cases_answer_200_and_denied_cases_429(quick: tuple[web.WebBenchResult, str, str]) -> None:
    result, _, _ = quick
    for r in result.results:
        if r.case.denied:
            assert r.probe == (429, 429, 429), r.case
            assert r.median.wrk.non_2xx == r.median.wrk.requests, r.case
        else:
            assert r.probe == (200, 200, 200), r.case
            assert r.median.wrk.non_2xx == 0, r.case


@pytest.mark.redis
def test_markdown_has_a_table_per_stack_with_numbers_and_the_targets(
    quick: tuple[web.WebBenchResult, str, str],
) -> None:
    result, text, _ = quick
    assert text == result.to_markdown()
    assert "### Starlette (uvicorn, 1 process, httptools, uvloop)" in text
    assert "### Django (gunicorn, 1 gthread worker, 1 thread)" in text
    assert "### Flask" not in text
    ratios = r"[\d,]+ \| \d+\.\d\d \| [\d,]+ \| \d+\.\d\d"  # requests/s, × bare, per CPU-s, × bare
    share = r"[<>]?[\d.]+%(, \d+ socket errors)?"  # ">99.9%", and socket errors on a loaded machine
    number = rf"{ratios} \| \d+\.\d\d \| \d+\.\d\d \| {share} \| \d+% \| \d+% \| (\d+%|n/a) \| [\d,]+ \|"
    for label in ("bare", "ratekeeper memory", "ratekeeper redis", "slowapi", "django-ratelimit, denied"):
        assert re.search(rf"^\| {re.escape(label)} \| {number}$", text, re.MULTILINE), (label, text)
    met = r"(met|\*\*not met\*\*)"
    target = rf"^\| starlette: ratekeeper memory / bare \| ≥ 0\.65 \| \d+\.\d\d \| {met} \| \d+\.\d\d \| "
    assert re.search(target, text, re.MULTILINE)
    bare = result.result(web.Case("starlette", "bare"))
    assert bare is not None
    assert result.ratio_to_bare(bare) == 1.0
    assert result.cpu_ratio_to_bare(bare) == 1.0
    assert {t.what for t in result.targets()} >= {
        "django: ratekeeper memory / django-ratelimit",
        "starlette: ratekeeper memory / slowapi",
    }


@pytest.mark.redis
def test_progress_is_one_line_per_case_and_round(quick: tuple[web.WebBenchResult, str, str]) -> None:
    _, _, progress = quick
    lines = progress.splitlines()
    cases = [c for c in web.CASES if c.stack in STACKS]
    assert len(lines) == len(cases)
    assert lines[0].startswith(f"[ 1/{len(cases)}] starlette bare, round 1/1: ")
    assert all(" req/s, p50 " in line for line in lines)


@pytest.mark.redis
def test_the_run_leaves_no_redis_key_behind(quick: tuple[web.WebBenchResult, str, str]) -> None:
    result, _, _ = quick
    assert result.redis_keys_deleted > 0  # the ratekeeper redis cases did write
    client = redis_py.Redis.from_url(web.DEFAULT_URL)
    try:
        assert list(client.scan_iter(match=result.settings.prefix + "*")) == []
    finally:
        client.close()


def test_wrk_summary_line_is_parsed() -> None:
    line = (
        MARKER + '{"requests": 3000, "duration_us": 1500000, "bytes": 1, "connect": 1, "read": 2, "write": 0, '
        '"status": 30, "timeout": 3, "p50_us": 900, "p90_us": 1500, "p99_us": 4000, "mean_us": 1000.5, "max_us": 9000}'
    )
    result = parse_output("Running 1s test @ http://x\n" + line + "\n")
    assert result.rate == 2000.0
    assert (result.non_2xx, result.socket_errors) == (30, 6)
    assert result.non_2xx_fraction == 0.01
    assert (result.p50_us, result.p99_us) == (900.0, 4000.0)
    with pytest.raises(WrkError, match="no RKBENCH line"):
        parse_output("Running 1s test\n")


@pytest.mark.parametrize("variant", ["bare", "ratekeeper", "flask-limiter"])
def test_flask_app_variants_allow_then_deny(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Flask app (served by gunicorn in the full run) in process, under a limit of 1/hour."""
    from ratekeeper_bench.web_apps import flask_app

    config = AppConfig(variant, count=1, period=3600, rule=f"test-bench-web-{uuid.uuid4().hex[:8]}")
    for name, value in config.to_env().items():
        monkeypatch.setenv(name, value)
    client = flask_app.create_app().test_client()
    statuses = [client.get(PATH).status_code for _ in range(3)]
    assert statuses == ([200, 200, 200] if variant == "bare" else [200, 429, 429])


def test_the_cli_registers_bench_web(tmp_path: Path) -> None:
    args = build_parser().parse_args(["bench", "web", "--quick", "--stack", "flask", "--markdown", str(tmp_path / "x")])
    assert args.bench_run is web.run
    settings = web.settings_from_args(args)
    assert (settings.duration, settings.rounds, settings.warm_up, settings.stacks) == (1, 1, False, ("flask",))


def test_servers_get_ports_below_the_ephemeral_range() -> None:
    """An outgoing connection (a Redis client's) cannot take a server's port before it binds."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(20_000 <= port < low for port in ports)


def test_a_server_whose_port_was_taken_starts_again_on_another(tmp_path: Path) -> None:
    server = Server(FRAMEWORKS["starlette"], AppConfig("bare"), tmp_path)
    taken = server.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with server:
            assert server.wait_ready() == 200
            assert server.port != taken
            assert server.probe(1) == (200,)
