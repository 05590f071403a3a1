"""Progress display and Markdown tables for the benchmarks.

``Progress`` keeps one line updated in place with ``\\r`` on a terminal and writes one
plain line per finished step anywhere else (CI logs, pipes). ``render_markdown`` turns
a ``BenchResult`` into tables that can be pasted into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO, TypeVar

if TYPE_CHECKING:
    from ratekeeper_bench.memory import BenchResult

__all__ = [
    "Progress",
    "format_bytes",
    "format_fraction",
    "format_machine_load",
    "format_rate",
    "median_by",
    "ms",
    "render_calls",
    "render_markdown",
    "verdict",
]

T = TypeVar("T")


class Progress:
    """Shows which step runs and what the finished ones measured.

    On a TTY a single line is rewritten; otherwise each finished step (and each note)
    is one line. Disabled, it writes nothing.
    """

    def __init__(self, stream: TextIO, total: int, *, enabled: bool = True) -> None:
        self._stream = stream
        self._total = total
        self._enabled = enabled
        isatty = getattr(stream, "isatty", None)
        self._tty = enabled and callable(isatty) and bool(isatty())
        self._width = shutil.get_terminal_size().columns if self._tty else 0
        self._done = 0
        self._shown = 0

    def _prefix(self, n: int) -> str:
        digits = len(str(self._total))
        return f"[{n:>{digits}}/{self._total}]"

    def _rewrite(self, text: str) -> None:
        text = text[: max(10, self._width - 1)]
        pad = " " * max(0, self._shown - len(text))
        self._stream.write(f"\r{text}{pad}")
        self._stream.flush()
        self._shown = len(text)

    def _clear(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._shown = 0

    def start(self, label: str) -> None:
        """A step begins (shown only on a TTY)."""
        if self._tty:
            self._rewrite(f"{self._prefix(self._done + 1)} {label} ...")

    def finish(self, label: str, summary: str) -> None:
        """A step ended with ``summary``."""
        self._done += 1
        if not self._enabled:
            return
        text = f"{self._prefix(self._done)} {label}: {summary}"
        if self._tty:
            self._rewrite(text)
        else:
            self._stream.write(text + "\n")
            self._stream.flush()

    def note(self, text: str) -> None:
        """A message that stays visible (a skipped library, a failure)."""
        if not self._enabled:
            return
        if self._tty:
            self._clear()
        self._stream.write(text + "\n")
        self._stream.flush()

    def close(self) -> None:
        """Clear the in-place line so what follows starts on a clean line."""
        if self._tty:
            self._clear()
            self._stream.flush()


def format_rate(rate: float) -> str:
    """Decisions per second with thousands separators: ``1,234,567``."""
    return f"{rate:,.0f}"


def format_fraction(fraction: float) -> str:
    """A share as a percentage; never shows 100.0% or 0.0% unless it is exact."""
    percent = 100.0 * fraction
    text = f"{percent:.1f}%"
    if text == "100.0%" and fraction < 1.0:
        return ">99.9%"
    if text == "0.0%" and fraction > 0.0:
        return "<0.1%"
    return text


def format_bytes(value: float) -> str:
    return f"{value:,.0f}"


def ms(us: float) -> str:
    """Microseconds as milliseconds with two decimals."""
    return f"{us / 1000:.2f}"


def verdict(met: bool | None) -> str:
    """A target's verdict: met, not met (in bold) or not measured (``None``)."""
    return "not measured" if met is None else ("met" if met else "**not met**")


def format_machine_load(before: tuple[float, float, float], after: tuple[float, float, float]) -> str:
    """The load averages before and after a run, as one sentence of a report."""
    return (
        f"Machine load (1/5/15-minute load average): {before[0]:.2f} / {before[1]:.2f} / {before[2]:.2f} before, "
        f"{after[0]:.2f} / {after[1]:.2f} / {after[2]:.2f} after."
    )


def render_calls(calls: dict[tuple[str, str], str], skipped: dict[str, str], *, code: bool) -> list[str]:
    """The lines of "What each row calls": each (library, algorithm)'s call, shown as code
    when ``code`` (else it is Markdown already), then the libraries not measured and why."""
    out = ["What each row calls:", ""]
    out += [f"- {library} `{algorithm}`: {f'`{how}`' if code else how}" for (library, algorithm), how in calls.items()]
    out += [f"- {library}: not measured ({reason})" for library, reason in skipped.items()]
    return out


def median_by(items: Sequence[T], key: Callable[[T], float]) -> T:
    """The item with the median ``key`` (the lower middle one of an even count)."""
    ordered = sorted(items, key=key)
    return ordered[(len(ordered) - 1) // 2]


def _ratio(value: tuple[float, str] | None, *, unit: str = "×") -> str:
    if value is None:
        return "n/a"
    ratio, algorithm = value
    return f"{ratio:.2f}{unit} {algorithm}"


def render_markdown(result: BenchResult) -> str:
    """The whole report: settings, one throughput table per scenario, the memory table, notes."""
    from ratekeeper_bench.memory import MEMORY_SPEC, SCENARIOS

    out: list[str] = []
    versions = ", ".join(f"{lib} {result.versions[lib]}" for lib in result.libraries if lib in result.versions)
    out += [
        "## Memory store: ratekeeper and its in-memory peers",
        "",
        f"One process, one thread, one run: {result.python}; {versions}.",
        f"Each cell makes synchronous calls back to back for {result.duration:g} s, reading "
        "`time.perf_counter` every 1000 calls, with gc enabled. Before the clock starts every key "
        "is used once (in the denied scenarios, until its limit is spent), so the cells measure a "
        "warm store. *decisions/s* counts allowed and denied calls alike; *allowed* shows that the "
        "scenario behaved as intended; *vs ratekeeper* is the peer's rate divided by the rate of "
        "ratekeeper's fastest comparable algorithm (named) in the same scenario: above 1 the peer "
        "is faster.",
        "",
    ]
    contended = [c for c in result.cells if c.cpu_share < 0.9]
    if contended:
        lowest = min(c.cpu_share for c in contended)
        out += [
            f"> **Other load competed for the CPU**: in {len(contended)} of {len(result.cells)} cells this "
            f"process ran less than 90% of the wall time (lowest {lowest:.0%}), so those rates are low and the "
            "ratios noisy. Run again on an idle machine before publishing these numbers.",
            "",
        ]
    for name in result.scenarios:
        scenario = SCENARIOS[name]
        keys = f"{result.keys:,} keys round robin" if scenario.many_keys else "one key"
        out += [
            f"### `{name}`: {keys}, {scenario.spec} per key, {scenario.description}",
            "",
            "| library | algorithm | decisions/s | allowed | vs ratekeeper |",
            "| --- | --- | ---: | ---: | --- |",
        ]
        for cell in result.rows(name):
            versus = "(reference)" if cell.library == "ratekeeper" else _ratio(result.ratio(cell))
            out.append(
                f"| {cell.library} | {cell.algorithm} | {format_rate(cell.rate)} | "
                f"{format_fraction(cell.allowed_fraction)} | {versus} |"
            )
        for failure in result.failures:
            if failure.scenario == name:
                out.append(f"| {failure.library} | {failure.algorithm} | failed | | {failure.error} |")
        out.append("")
    if result.memory or any(f.scenario == "memory" for f in result.failures):
        out += [
            "### Memory per idle key",
            "",
            f"{result.memory_keys:,} distinct keys, each used once under a {MEMORY_SPEC} limit; the growth of "
            "`tracemalloc`'s traced memory (after `gc.collect()`) divided by the key count. The key "
            "strings are made before the baseline and are not counted (the caller holds them anyway); "
            "keys a library derives from them are. *vs ratekeeper* divides by the smallest comparable "
            "ratekeeper algorithm.",
            "",
            "| library | algorithm | bytes/key | vs ratekeeper |",
            "| --- | --- | ---: | --- |",
        ]
        for mem in result.memory:
            versus = "(reference)" if mem.library == "ratekeeper" else _ratio(result.memory_ratio(mem))
            out.append(f"| {mem.library} | {mem.algorithm} | {format_bytes(mem.bytes_per_key)} | {versus} |")
        for failure in result.failures:
            if failure.scenario == "memory":
                out.append(f"| {failure.library} | {failure.algorithm} | failed | {failure.error} |")
        out.append("")
    out += render_calls(result.calls, result.skipped, code=True)
    if result.thread_errors:
        out += ["", "Exceptions raised in the libraries' own background threads (each run went on):", ""]
        counts: dict[str, int] = {}
        for error in result.thread_errors:
            counts[error] = counts.get(error, 0) + 1
        out += [f"- {error}" + (f" ({n} times)" if n > 1 else "") for error, n in counts.items()]
    out.append("")
    return "\n".join(out)
