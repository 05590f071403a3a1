"""RulesWatcher: reload on change (by mtime/size, at most once per interval of the injected
clock, on a worker thread), a bad file refused with the old rules kept, the hook and the log
told. The reload's own settling and thread are tested in test_stable_reload.py."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from conftest import WriteFile
from ratekeeper.config import ConfigProblems, EnvoyConfig, RuleSet, RulesWatcher, load_rules


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _rules(limit: str, name: str = "a") -> str:
    return f"rules:\n  - name: {name}\n    limits: [{limit}]\n"


def _change(path: Path, text: str, bump: int) -> None:
    """Write ``text`` and move the mtime forward so the change shows even within one tick."""
    path.write_text(text, encoding="utf-8")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump * 1_000_000_000))


SETTLE = 0.01


def _limits(watcher: RulesWatcher[RuleSet]) -> list[str]:
    """The limits in force once a reload that the look at the file started has ended."""
    watcher.current  # noqa: B018 - the look at the file that starts the reload
    assert watcher.wait_idle(10)
    return [str(x) for r in watcher.current for x in r.rule.limits]


def test_a_changed_file_is_reloaded_after_the_interval(write: WriteFile) -> None:
    path = write(_rules("1/s"))
    clock = Clock()
    events: list[tuple[bool, str | None]] = []
    watcher = RulesWatcher(
        path,
        loader=load_rules,
        interval=1.0,
        settle=SETTLE,
        clock=clock,
        on_reload=lambda ok, e: events.append((ok, e)),
    )
    first = watcher.current
    assert _limits(watcher) == ["1/second"]
    _change(path, _rules("2/s"), bump=5)
    clock.now += 0.5
    assert watcher.current is first  # not checked before the interval
    clock.now += 0.5
    assert _limits(watcher) == ["2/second"]
    assert events == [(True, None)] and watcher.reloads == 1


def test_an_unchanged_file_is_not_reloaded(write: WriteFile) -> None:
    path = write(_rules("1/s"))
    clock = Clock()
    watcher = RulesWatcher(path, loader=load_rules, clock=clock)
    first = watcher.current
    for _ in range(3):
        clock.now += 5
        assert watcher.current is first
    assert watcher.reloads == 0


def test_a_bad_file_is_refused_and_the_old_rules_stay(write: WriteFile, caplog: pytest.LogCaptureFixture) -> None:
    path = write(_rules("1/s"))
    clock = Clock()
    events: list[tuple[bool, str | None]] = []
    watcher = RulesWatcher(
        path, loader=load_rules, settle=SETTLE, clock=clock, on_reload=lambda ok, e: events.append((ok, e))
    )
    first = watcher.current
    _change(path, "rules:\n  - name: a\n    limits: [1/fortnight]\n    algoritm: gcra\n", bump=5)
    clock.now += 2
    with caplog.at_level(logging.ERROR, logger="ratekeeper"):
        assert watcher.current is first
        assert watcher.wait_idle(10)
    assert len(events) == 1 and events[0][0] is False
    error = events[0][1]
    assert error is not None and f"{path}:3: unknown time unit" in error and f"{path}:4: unknown field" in error
    assert any(f"{path}:4: unknown field 'algoritm'" in r.getMessage() for r in caplog.records)
    assert all(r.name == "ratekeeper" for r in caplog.records)
    # The same broken file is not tried again at every interval ...
    clock.now += 2
    assert watcher.current is first and watcher.wait_idle(10)
    assert len(events) == 1 and watcher.failures == 1
    # ... but its repair is taken.
    _change(path, _rules("3/s"), bump=10)
    clock.now += 2
    assert _limits(watcher) == ["3/second"] and events[-1] == (True, None)


def test_a_removed_file_keeps_the_rules(write: WriteFile) -> None:
    path = write(_rules("1/s"))
    clock = Clock()
    watcher = RulesWatcher(path, loader=load_rules, settle=SETTLE, clock=clock)
    first = watcher.current
    path.unlink()
    clock.now += 2
    assert watcher.current is first and watcher.wait_idle(10)
    assert watcher.current is first and watcher.failures == 1


def test_reload_forces_a_load(write: WriteFile) -> None:
    path = write(_rules("1/s"))
    clock = Clock()
    watcher = RulesWatcher(path, loader=load_rules, settle=SETTLE, clock=clock)
    first = watcher.current
    assert watcher.reload() is True
    assert watcher.current is not first and watcher.current.rules == first.rules
    path.write_text("rules: [", encoding="utf-8")
    assert watcher.reload() is False
    assert watcher.current.rules == first.rules


def test_a_bad_file_at_start_raises(write: WriteFile) -> None:
    with pytest.raises(ConfigProblems):
        RulesWatcher(write("rules: 3\n"), loader=load_rules)


def test_the_default_loader_takes_either_form(write: WriteFile) -> None:
    path = write(_rules("1/s"))
    clock = Clock()
    watcher = RulesWatcher(path, settle=SETTLE, clock=clock)
    assert isinstance(watcher.current, RuleSet)
    _change(path, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 5)
    clock.now += 2
    watcher.current  # noqa: B018 - the look at the file that starts the reload
    assert watcher.wait_idle(10)
    assert isinstance(watcher.current, EnvoyConfig)


def test_a_failing_hook_does_not_stop_the_reload(write: WriteFile, caplog: pytest.LogCaptureFixture) -> None:
    path = write(_rules("1/s"))

    def hook(ok: bool, error: str | None) -> None:
        raise RuntimeError("metrics down")

    watcher = RulesWatcher(path, loader=load_rules, settle=SETTLE, on_reload=hook)
    with caplog.at_level(logging.ERROR, logger="ratekeeper"):
        assert watcher.reload() is True
    assert "on_reload hook failed" in caplog.text


def test_a_file_replaced_by_a_rename_is_reloaded(write: WriteFile) -> None:
    """Same size, same mtime, new inode: an atomic replacement is still seen."""
    path = write(_rules("1/s"))
    clock = Clock()
    watcher = RulesWatcher(path, loader=load_rules, settle=SETTLE, clock=clock)
    st = path.stat()
    replacement = write(_rules("2/s"), "next.yaml")
    os.utime(replacement, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(replacement, path)
    clock.now += 2
    assert _limits(watcher) == ["2/second"]
