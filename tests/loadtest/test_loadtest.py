"""``ratekeeper loadtest``: profiles and their schedules, the built-in scenario's short run
against the real app (uvicorn, Starlette, our middleware), its outputs, and a target that
does not answer."""

from __future__ import annotations

import asyncio
import csv
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hdrh.log import HistogramLogReader

from ratekeeper.limit import Limit
from ratekeeper.loadtest.engine import run_plan
from ratekeeper.loadtest.outputs import COLUMNS, write_outputs
from ratekeeper.loadtest.process import free_port
from ratekeeper.loadtest.profiles import Profile, Stage, plan_from
from ratekeeper.loadtest.schedule import send_offsets

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ShortRun = tuple[subprocess.CompletedProcess[str], Path]


def test_the_issues_form_and_ramp_stages_parse() -> None:
    doc = yaml.safe_load(
        """
        target: http://127.0.0.1:8000
        duration: 60s
        profiles:
          - {name: alice, rate: 200/s, path: /, headers: {X-Account-ID: alice@example.com}, expect: 1/minute}
          - name: ramp
            stages: [{rate: 5, for: 180s}, {rate: 50, for: 180s}, {rate: 100, for: 240s}]
            headers: {X-Account-ID: "invalid-{n}@example.com"}
            method: post
        """
    )
    plan = plan_from(doc)
    alice, ramp = plan.profiles
    assert plan.target == "http://127.0.0.1:8000"
    assert alice.stages == (Stage(200.0, 60.0),) and alice.expect == Limit.parse("1/minute")
    assert ramp.seconds == 600 and ramp.planned == 5 * 180 + 50 * 180 + 100 * 240 and ramp.method == "POST"
    assert ramp.render(ramp.headers["X-Account-ID"], 7) == "invalid-7@example.com"
    # 1/minute over a minute: its one request at once, and one more as the minute ends.
    assert alice.bound(59.9) == 1 and alice.bound(60.0) == 2
    with pytest.raises(ValueError, match="unknown fields"):
        plan_from({"target": "http://x", "duration": "1s", "profiles": [{"name": "a", "rate": 1, "rats": 2}]})


def test_sends_are_scheduled_open_loop_within_the_run() -> None:
    steady = Profile("steady", (Stage(10, 1.0), Stage(20, 0.5)))
    assert list(send_offsets(steady)) == pytest.approx([i / 10 for i in range(10)] + [1 + i / 20 for i in range(10)])
    poisson = Profile("poisson", (Stage(1000, 2.0),), poisson=True)
    offsets = list(send_offsets(poisson, seed=1))
    assert offsets == sorted(offsets) and offsets[-1] < 2.0
    assert 1800 < len(offsets) < 2200  # the mean rate is kept
    assert offsets == list(send_offsets(poisson, seed=1)) != list(send_offsets(poisson, seed=2))


@pytest.fixture(scope="module")
def short_run(tmp_path_factory: pytest.TempPathFactory) -> ShortRun:
    out = tmp_path_factory.mktemp("loadtest")
    done = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "loadtest", "--short", "--no-live", "--out", str(out)],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    return done, out


def test_the_built_in_scenario_admits_at_most_each_bound(short_run: ShortRun) -> None:
    done, out = short_run
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    profiles = {e["profile"]: e for e in summary["profiles"]}
    assert len(profiles) == 7
    for name, e in profiles.items():
        assert e["sent"] == e["allowed"] + e["denied"] + e["errors"], name
        assert e["sent"] == e["planned"], name  # open loop: every planned send left
        if "bound" in e:
            assert e["sent"] > e["bound"], name  # each limited profile sends more than it may get
            assert e["allowed"] <= e["bound"], name
            assert e["within_bound"] and "ok" in done.stdout
    # 1/minute over a few seconds: exactly one. The faster limits reach their bound but
    # for the requests the network's jitter can shift across the run's edges (the bound is
    # taken over the span from the first send to the last answer, so it is never too low).
    assert profiles["alice (1/minute)"]["allowed"] == profiles["alice (1/minute)"]["bound"] == 1
    for name in ("bob (10/s)", "carol (100/s)", "unknown (failsafe)", "anonymous"):
        assert profiles[name]["allowed"] >= 0.9 * profiles[name]["bound"], name
    # The control and the flood of fresh ids are never refused.
    for name in ("admin (control)", "flood of unknown ids"):
        assert profiles[name]["denied"] == 0 and profiles[name]["allowed"] > 0, name
    assert summary["rss_bytes"], "the run started the server, so it sampled its memory"
    assert 0 < summary["rss_first_bytes"] and 0 < summary["rss_halfway_bytes"] and "MiB halfway" in done.stdout


def test_results_tsv_and_hdr_logs_agree_with_the_summary(short_run: ShortRun) -> None:
    _, out = short_run
    summary = {e["profile"]: e for e in json.loads((out / "summary.json").read_text())["profiles"]}
    with (out / "results.tsv").open() as f:
        reader = csv.DictReader(f, delimiter="\t")
        assert tuple(reader.fieldnames or ()) == COLUMNS
        rows = list(reader)
    for name, e in summary.items():
        mine = [r for r in rows if r["profile"] == name]
        assert [int(r["second"]) for r in mine] == [0, 1, 2]
        for column in ("sent", "allowed", "denied", "errors", "late"):
            assert sum(int(r[column]) for r in mine) == e[column], (name, column)
        for r in mine:
            assert int(r["sent"]) == int(r["allowed"]) + int(r["denied"]) + int(r["errors"])
            assert 0 <= float(r["p50_ms"]) <= float(r["p90_ms"]) <= float(r["p99_ms"]) <= float(r["max_ms"])
        lat = e["latency_ms"]
        assert 0 < lat["p50_ms"] <= lat["p90_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    logs = sorted((out / "hdr").glob("*.hlog"))
    assert len(logs) == 7
    # Each log reads back as the profile's whole histogram.
    for log in logs:
        reader = HistogramLogReader(str(log), None)
        try:
            histogram = reader.get_next_interval_histogram()
        finally:
            reader.close()
        name = next(n for n in summary if log.stem == "".join(c if c.isalnum() or c in "-_." else "_" for c in n))
        assert histogram is not None and histogram.get_total_count() == summary[name]["sent"], log


def test_the_charts_are_png_files(short_run: ShortRun) -> None:
    _, out = short_run
    for name in ("rates.png", "latencies.png", "memory.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 5000, name


def test_a_target_that_does_not_answer_gives_errors_not_a_hang(tmp_path: Path) -> None:
    # One port with nothing listening (refused at once), one that listens and never
    # accepts (each request runs into the timeout).
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(0)
    try:
        for target in (f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{silent.getsockname()[1]}"):
            plan = plan_from(
                {"target": target, "duration": "1s", "timeout": "500ms", "profiles": [{"name": "p", "rate": 20}]}
            )
            started = time.monotonic()
            result = asyncio.run(run_plan(plan))
            assert time.monotonic() - started < 5
            summary = write_outputs(result, tmp_path)
            (entry,) = summary["profiles"]
            assert entry["sent"] == entry["errors"] == 20 and entry["allowed"] == entry["denied"] == 0, target
    finally:
        silent.close()


def test_a_profiles_file_against_a_running_app_with_its_pid(tmp_path: Path) -> None:
    # The file mode: the app started here (as a user's own would be), its pid given, so
    # the run charts its memory; a ramp of two stages and a key that varies per request.
    from ratekeeper.loadtest.scenario import AppServer

    with AppServer(tmp_path) as app:
        profiles = tmp_path / "profiles.yaml"
        profiles.write_text(
            yaml.safe_dump(
                {
                    "target": app.url,
                    "duration": "2s",
                    "profiles": [
                        {
                            "name": "bob",
                            "stages": [{"rate": 10, "for": "1s"}, {"rate": 40, "for": "1s"}],
                            "headers": {"X-Account-ID": "bob@example.com"},
                            "expect": "10/s",
                        },
                        {"name": "fresh ids", "rate": 30, "headers": {"X-Account-ID": "new-{n}@example.com"}},
                    ],
                }
            )
        )
        out = tmp_path / "out"
        done = subprocess.run(
            [sys.executable, "-m", "ratekeeper", "loadtest", str(profiles), "--pid", str(app.pid), "--out", str(out)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = {e["profile"]: e for e in json.loads((out / "summary.json").read_text())["profiles"]}
    bob = summary["bob"]
    assert bob["sent"] == 50 and bob["allowed"] <= bob["bound"] and bob["denied"] > 0
    assert summary["fresh ids"]["allowed"] == summary["fresh ids"]["sent"] == 60  # each id is new: none refused
    assert (out / "memory.png").read_bytes().startswith(PNG_SIGNATURE)


def test_trials_each_get_a_fresh_app_and_their_own_results(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "loadtest", "--trials", "2", "--duration", "1s", "--no-charts",
         "--no-live", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    trials = json.loads((tmp_path / "trials.json").read_text())
    assert len(trials) == 2 and "admitted per trial" in done.stdout
    for trial, summary in enumerate(trials, 1):
        assert (tmp_path / f"trial-{trial}" / "results.tsv").is_file()
        alice = next(e for e in summary["profiles"] if e["profile"].startswith("alice"))
        # A fresh app each trial: alice's one request a minute is admitted in both.
        assert alice["allowed"] == alice["bound"] == 1


def test_a_stalled_generator_counts_late_sends_and_their_wait(tmp_path: Path) -> None:
    # The event loop is blocked for 300 ms once (as a saturated machine would block it):
    # the sends due meanwhile still leave, late, and their latency runs from when they
    # were due, so the stall shows (no coordinated omission); the run says so.
    stalled: list[float] = []

    def stall_once(now: float, stats: object) -> None:
        if not stalled and now > 0.2:
            stalled.append(now)
            time.sleep(0.3)

    plan = plan_from(
        {"target": f"http://127.0.0.1:{free_port()}", "duration": "1s", "profiles": [{"name": "p", "rate": 100}]}
    )
    result = asyncio.run(run_plan(plan, tick=stall_once))
    summary = write_outputs(result, tmp_path)
    (entry,) = summary["profiles"]
    assert stalled and entry["sent"] == entry["planned"] == 100
    assert entry["late"] >= 20  # 300 ms of sends at 100/s, less the loop's own slack
    assert entry["latency_ms"]["max_ms"] >= 250
    assert any("could not keep" in w for w in summary["warnings"])


def test_a_bad_profiles_file_is_told_not_raised(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: http://127.0.0.1:1\nduration: 1s\nprofiles: [{name: a, rate: fast}]\n")
    done = subprocess.run(
        [sys.executable, "-m", "ratekeeper", "loadtest", str(bad), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "error:" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_live_display_shows_each_profiles_rate_counts_and_p99() -> None:
    from rich.console import Console

    from ratekeeper.loadtest.live import LiveView
    from ratekeeper.loadtest.stats import ProfileStats

    stats = ProfileStats("bob")
    for index, (sent, allowed) in enumerate([(40, 20), (40, 10)]):
        second = stats.second(index)
        second.sent, second.allowed, second.denied = sent, allowed, sent - allowed
        second.latencies_ms.extend([1.0] * 39 + [42.0])
    console = Console(width=120, record=True)
    console.print(LiveView(live=None, seconds=60).table(2.1, {"bob": stats}))  # type: ignore[arg-type]
    text = console.export_text()
    assert "2 / 60 s" in text
    row = next(line for line in text.splitlines() if "bob" in line)
    # The last whole second's rate, the totals so far, the p99 of the recent seconds.
    assert [c.strip() for c in row.split("│")[2:8]] == ["40", "80", "30", "50", "0", "42.0"]
