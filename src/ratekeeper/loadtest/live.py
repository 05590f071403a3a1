"""The live display while a run goes: per profile the rate achieved over the last second,
what was sent, allowed and denied so far, and the p99 of the last few seconds."""

from __future__ import annotations

from rich.live import Live
from rich.table import Table

from ratekeeper.loadtest.stats import ProfileStats

__all__ = ["LiveView"]


class LiveView:
    def __init__(self, live: Live, seconds: float) -> None:
        self.live = live
        self.seconds = seconds

    def __call__(self, now: float, stats: dict[str, ProfileStats]) -> None:
        self.live.update(self.table(now, stats))

    def table(self, now: float, stats: dict[str, ProfileStats]) -> Table:
        t = Table(title=f"{min(now, self.seconds):.0f} / {self.seconds:.0f} s")
        for column in ("profile", "rate/s", "sent", "allowed", "denied", "errors", "p99 ms"):
            t.add_column(column, justify="left" if column == "profile" else "right")
        index = int(now)
        for name, s in stats.items():
            totals = s.totals()
            last = s.seconds.get(index - 1)
            rate = last.sent if last is not None else 0
            t.add_row(
                name, str(rate), str(totals["sent"]), str(totals["allowed"]), str(totals["denied"]),
                str(totals["errors"]), f"{s.recent_p99_ms(3, index):.1f}",
            )  # fmt: skip
        return t
