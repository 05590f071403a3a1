"""Which descriptors of one Envoy request are charged, and the request's overall code.

A request names several descriptors; when one of them is over its limit, the others may
be charged or not. Three ways are offered, chosen per domain (the Envoy file's top-level
``charging``) or for the whole service (``serve --envoy-charging``, the environment
variable ``RATEKEEPER_ENVOY_CHARGING``, or Envoy's own ``STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true``);
the file's choice wins over the service's, and ``envoy`` applies when neither says:

- ``envoy``: as Envoy's service by default: each descriptor is decided on its own, and
  every one that fits is charged, even when another one of the request is over its limit.
- ``stop_over_limit``: as Envoy's service with ``STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT``:
  when any limited descriptor (shadow and quota ones too, as there) is over its limit, no
  descriptor is charged; otherwise every one is. The descriptors go to the store as one
  atomic batch, so two requests racing cannot both slip through.
- ``transaction``: ratekeeper's own: the request is one decision. Refused, nothing is
  charged (shadow ones included); admitted, the enforced descriptors are charged as one
  atomic batch, then the quota and shadow ones that fit.

In every way a descriptor over its limit is not charged itself: its count never passes
the limit, so a smaller request later in the same window can still fit (Envoy's counter
keeps growing past the limit). A descriptor with ``hits_addend: 0`` only looks: it is
never charged and never over its limit.

The overall code is Envoy's: ``OVER_LIMIT`` when an enforced descriptor that is neither
shadow nor quota is over its limit, or when the request has quota descriptors and every
one of them is over (a shadow one is never over).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ratekeeper.errors import RateKeeperError
from ratekeeper.limiter.acompat import agather

if TYPE_CHECKING:
    from ratekeeper.decision import Decision
    from ratekeeper.limiter.limiter_async import AsyncLimiter
    from ratekeeper.rule import Rule
    from ratekeeper.server.service import Service

__all__ = [
    "CHARGING",
    "DEFAULT_CHARGING",
    "Slot",
    "Verdict",
    "charge",
    "charging_for",
    "overall_ok",
    "service_charging",
    "set_service_charging",
]

CHARGING = ("envoy", "stop_over_limit", "transaction")
"""The ways to charge the descriptors of a request (see the module docstring)."""

DEFAULT_CHARGING = "envoy"
"""What an Envoy file is charged by when neither it nor the service says otherwise."""

ENV_NAME = "RATEKEEPER_ENVOY_CHARGING"
ENVOY_STOP_ENV = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"


@dataclass(frozen=True, slots=True)
class Slot:
    """One limited descriptor of a request: its rule, the key it counts under, its hits."""

    rule: Rule
    key: str
    hits: int
    shadow: bool = False
    quota: bool = False

    @property
    def looks(self) -> bool:
        """``hits_addend: 0``: report what is left, charge nothing."""
        return self.hits == 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one slot got: the store's ``decision``, whether the slot is ``over`` its limit,
    and ``unspent``: hits the decision's ``remaining_each`` counts as taken though they were
    not charged (a fitting descriptor of a request that charged nothing), to add back."""

    decision: Decision
    over: bool
    unspent: int = 0


async def charge(limiter: AsyncLimiter, slots: Sequence[Slot], charging: str) -> list[Verdict]:
    """Decide and charge ``slots`` the ``charging`` way; one verdict per slot, in order."""
    if not slots:
        return []
    if charging == "stop_over_limit":
        return await _stop_over_limit(limiter, slots)
    if charging == "transaction":
        return await _transaction(limiter, slots)
    return await _each(limiter, slots)


def overall_ok(outcomes: Iterable[tuple[bool, bool, bool]]) -> bool:
    """Envoy's overall code from each limited descriptor's ``(shadow, quota, over)``: no
    plain descriptor over, and not every quota one over (a shadow one is never over)."""
    quota_failed: list[bool] = []
    for shadow, quota, over in outcomes:
        failed = over and not shadow
        if quota:
            quota_failed.append(failed)
        elif failed:
            return False
    return not (quota_failed and all(quota_failed))


async def _look(limiter: AsyncLimiter, slot: Slot) -> Verdict:
    return Verdict(await limiter.peek(slot.rule, slot.key, 0), over=False)


async def _alone(limiter: AsyncLimiter, slot: Slot) -> Verdict:
    if slot.looks:
        return await _look(limiter, slot)
    decision = await limiter.try_acquire(slot.rule, slot.key, slot.hits)
    return Verdict(decision, over=not decision.allowed)


async def _peeked(limiter: AsyncLimiter, slot: Slot) -> Verdict:
    """A slot of a request that charges nothing: whether it would fit, what is left now."""
    if slot.looks:
        return await _look(limiter, slot)
    decision = await limiter.peek(slot.rule, slot.key, slot.hits)
    return Verdict(decision, over=not decision.allowed, unspent=slot.hits if decision.allowed else 0)


async def _each(limiter: AsyncLimiter, slots: Sequence[Slot]) -> list[Verdict]:
    # agather awaits a lone descriptor (most requests) without a task of its own.
    return await agather(*(_alone(limiter, slot) for slot in slots))


async def _batch(limiter: AsyncLimiter, slots: Sequence[Slot], indexes: Sequence[int]) -> dict[int, Verdict]:
    """Charge the slots at ``indexes`` (none of them a look) all or none; their verdicts."""
    batch = await limiter.try_acquire_many([(slots[i].rule, slots[i].key, slots[i].hits) for i in indexes])
    out: dict[int, Verdict] = {}
    for i, decision in zip(indexes, batch.decisions, strict=True):
        if batch.allowed:
            out[i] = Verdict(decision, over=False)
        else:
            out[i] = Verdict(decision, over=not decision.allowed, unspent=slots[i].hits if decision.allowed else 0)
    return out


async def _stop_over_limit(limiter: AsyncLimiter, slots: Sequence[Slot]) -> list[Verdict]:
    charged = [i for i, slot in enumerate(slots) if not slot.looks]
    verdicts: dict[int, Verdict] = await _batch(limiter, slots, charged) if charged else {}
    for i, slot in enumerate(slots):
        if slot.looks:
            verdicts[i] = await _look(limiter, slot)
    return [verdicts[i] for i in range(len(slots))]


async def _transaction(limiter: AsyncLimiter, slots: Sequence[Slot]) -> list[Verdict]:
    verdicts: dict[int, Verdict] = {}
    plain = [i for i, s in enumerate(slots) if not s.shadow and not s.quota and not s.looks]
    quota = [i for i, s in enumerate(slots) if s.quota and not s.shadow]
    for i in quota:  # the quota descriptors refuse only all together: look at them first
        verdicts[i] = await _peeked(limiter, slots[i])
    admitted = overall_ok((slots[i].shadow, True, verdicts[i].over) for i in quota)
    if plain:
        if admitted:
            verdicts.update(await _batch(limiter, slots, plain))
            admitted = all(not verdicts[i].over for i in plain)
        else:
            for i in plain:
                verdicts[i] = await _peeked(limiter, slots[i])
    for i, slot in enumerate(slots):
        if i in plain:
            continue
        if not admitted or slot.looks:
            if i not in verdicts:
                verdicts[i] = await _peeked(limiter, slot)
        else:
            verdicts[i] = await _alone(limiter, slot)  # quota and shadow ones that fit are charged
    return [verdicts[i] for i in range(len(slots))]


_SERVICE_CHARGING: weakref.WeakKeyDictionary[Service, str] = weakref.WeakKeyDictionary()


def set_service_charging(service: Service, charging: str | None) -> None:
    """The service-wide way (None: each file's own, else ``envoy``)."""
    if charging is None:
        _SERVICE_CHARGING.pop(service, None)
    else:
        _SERVICE_CHARGING[service] = _checked(charging, "the service's Envoy charging")


def charging_for(service: Service, config: object | None) -> str:
    """The way to charge a request to the domain of ``config`` (an ``EnvoyConfig``): the
    file's ``charging``, else the service's, else ``envoy``."""
    own = getattr(config, "charging", None)
    if isinstance(own, str) and own in CHARGING:
        return own
    return _SERVICE_CHARGING.get(service, DEFAULT_CHARGING)


def service_charging(option: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The service-wide way from ``--envoy-charging``, else ``RATEKEEPER_ENVOY_CHARGING``,
    else Envoy's ``STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true`` (``stop_over_limit``);
    None when none is given. ``RateKeeperError`` for a value that is none of the ways."""
    env = os.environ if env is None else env
    if option:
        return _checked(option, "--envoy-charging")
    named = env.get(ENV_NAME)
    if named:
        return _checked(named, ENV_NAME)
    stop = env.get(ENVOY_STOP_ENV, "").strip().lower()
    if stop in ("true", "1"):
        return "stop_over_limit"
    if stop not in ("", "false", "0"):
        raise RateKeeperError(f"{ENVOY_STOP_ENV} must be true or false, got {env[ENVOY_STOP_ENV]!r}")
    return None


def _checked(value: str, where: str) -> str:
    if value not in CHARGING:
        raise RateKeeperError(f"{where} must be one of {', '.join(CHARGING)}, got {value!r}")
    return value
