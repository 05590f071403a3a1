"""When each request of a profile is meant to leave: ``t0 + i/rate`` stage after stage,
or Poisson arrivals at the same mean rate (seeded, so a run can be repeated)."""

from __future__ import annotations

import random
from collections.abc import Iterator

from ratekeeper.loadtest.profiles import Profile

__all__ = ["send_offsets"]


def send_offsets(profile: Profile, seed: int = 0) -> Iterator[float]:
    """Seconds after the start at which each request is due, in order; all below
    ``profile.seconds``, so every run ends on time whatever the rates."""
    rng = random.Random(f"{seed}:{profile.name}")
    start = 0.0
    for stage in profile.stages:
        end = start + stage.seconds
        if profile.poisson:
            t = start + rng.expovariate(stage.rate)
            while t < end:
                yield t
                t += rng.expovariate(stage.rate)
        else:
            for i in range(round(stage.rate * stage.seconds)):
                t = start + i / stage.rate
                if t >= end:
                    break
                yield t
        start = end
