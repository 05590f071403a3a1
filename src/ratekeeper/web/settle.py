"""Charging what a response really cost: the ``response_cost`` option, the ``Usage`` meter
of a streamed response, and the settlement of an admitted request once its response ended.

A request is charged its estimated cost when it is decided (``cost``, 1 by default). When
the real cost is known only from the response (the tokens a model streamed, the rows an
export wrote), ``response_cost`` says where to read it, and the integration settles the
difference once the response ended (``BaseRateLimitCore.settlement``)::

    response_cost="x-tokens-used"                       # a response header (or trailer)
    response_cost=lambda view, status, headers: ...      # int | None (None: keep the charge)
    response_cost={"llm.tokens": "x-tokens-used"}        # only the rules named

and, for a body streamed as it is produced::

    meter = ratekeeper.web.usage(request)    # ASGI scope / Starlette Request, WSGI environ /
    meter.add(len(tokens))                   # Flask request, Django HttpRequest

The real cost is, in order: the callable's answer; else the header (a trailer of that
name wins over it); else the ``Usage`` total when the app added anything; else nothing
changes. Per settled rule, ``delta = real - charged``: a positive delta is charged
(``Limiter.charge``: the key may go into debt), a negative one refunded. Concurrency
rules are never settled: they hold leases, not counts.

Everything here is pure (what to charge, what to refund); the cores run it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import ConfigurationError
from ratekeeper.limit import MAX_COUNT
from ratekeeper.web.options import HEADER_NAME

if TYPE_CHECKING:
    from ratekeeper.web.request import Charge, RequestView, Verdict

__all__ = [
    "USAGE",
    "CostSource",
    "ResponseCost",
    "ResponseRecord",
    "Usage",
    "response_cost_option",
    "settled_cost",
    "settlement",
    "usage",
]

log = logging.getLogger("ratekeeper.web")

ResponseCost = str | Callable[["RequestView", int, Mapping[str, str]], int | None] | bool
"""One ``response_cost``: a response header name, ``callable(view, status, headers)``, or
True: the app's ``usage()`` meter alone."""

USAGE = "ratekeeper.usage"
"""Where a request's ``Usage`` is kept: a key of the ASGI scope, the WSGI environ or
Django's ``request.META`` (never one a client can set: those hold headers as ``HTTP_*``)."""

_MAX_DIGITS = len(str(MAX_COUNT))


class Usage:
    """What a streamed response cost so far, added by the app as it streams (``add``).

    Thread-safe: a WSGI app may stream from another thread than the one that settles."""

    __slots__ = ("_added", "_lock", "_total")

    def __init__(self) -> None:
        self._total = 0
        self._added = False
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        """Add ``n`` (an int >= 0) to the total."""
        if type(n) is not int or n < 0:
            raise ValueError(f"Usage.add() takes an int >= 0 (what this part of the response cost), got {n!r:.80}")
        with self._lock:
            # a total beyond every limit is one no limit admits: capped where stores stop
            self._total = min(self._total + n, MAX_COUNT)
            self._added = True

    @property
    def total(self) -> int:
        """The sum of what was added."""
        return self._total

    @property
    def added(self) -> bool:
        """Whether the app added anything (then the total is the request's real cost)."""
        return self._added

    def __repr__(self) -> str:
        return f"Usage(total={self._total})"


def usage(native: Any) -> Usage:
    """The ``Usage`` of the request ``native`` (the ASGI scope or a Starlette/FastAPI
    ``Request``, the WSGI environ or a Flask/werkzeug request, a Django ``HttpRequest``):
    the same object for every call of one request. On a request that no rule limited (or
    with no ``response_cost`` configured: ``response_cost=True`` settles by the meter
    alone) it is a meter that is simply never settled."""
    holder = _holder(native)
    found = holder.get(USAGE)
    if isinstance(found, Usage):
        return found
    meter = Usage()
    holder[USAGE] = meter
    return meter


def usage_of(holder: Mapping[str, Any] | None) -> Usage | None:
    """The ``Usage`` the app made for the request whose scope/environ/META is ``holder``."""
    found = None if holder is None else holder.get(USAGE)
    return found if isinstance(found, Usage) else None


def _holder(native: Any) -> MutableMapping[str, Any]:
    # Django first: its ASGI request also has a ``scope``, but the middleware keeps the meter in META.
    for attribute in ("META", "scope", "environ"):
        value = getattr(native, attribute, None)
        if isinstance(value, MutableMapping):
            return value
    if isinstance(native, MutableMapping):
        return native
    raise TypeError(
        "usage() takes the request: an ASGI scope or a Starlette/FastAPI Request, a WSGI environ or a "
        f"Flask/werkzeug request, or a Django HttpRequest; got {type(native).__name__}"
    )


class CostSource:
    """Where one rule's real cost is read: a response header (``header``), a callable, or
    (neither) the app's ``usage()`` meter alone; the meter backs the other two."""

    __slots__ = ("call", "header", "warned")

    def __init__(self, value: Any, where: str) -> None:
        self.warned = False
        """Whether a bad value from this source was logged (once: it repeats on every request)."""
        self.header: str | None = None
        self.call: Callable[[RequestView, int, Mapping[str, str]], Any] | None = None
        if value is True:
            return  # the app's ``usage()`` meter alone
        if isinstance(value, str):
            name = value.strip().lower()
            if not HEADER_NAME.fullmatch(name):
                raise ConfigurationError(
                    f"{where} must be a response header name such as 'x-tokens-used', got {value!r:.80}"
                )
            self.header = name
        elif callable(value):
            self.call = value
        else:
            raise ConfigurationError(
                f"{where} must be a response header name such as 'x-tokens-used', a "
                f"callable(view, status, headers) -> int | None, or True (the app's usage() meter "
                f"alone), got {value!r:.80}"
            )


def response_cost_option(value: Any) -> CostSource | dict[str, CostSource] | None:
    """The ``response_cost`` option as the core keeps it (checked at start-up)."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        out: dict[str, CostSource] = {}
        for name, item in value.items():
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"response_cost: a mapping's keys are rule names, got {name!r}")
            out[name] = CostSource(item, f"response_cost[{name!r}]")
        return out
    return CostSource(value, "response_cost")


class ResponseRecord:
    """What an integration saw of one admitted request's response (its status, headers
    and trailers) and whether it was settled (``claim``: exactly once)."""

    __slots__ = ("_done", "_headers", "_lock", "_trailers", "expects_trailers", "holder", "status", "view")

    def __init__(self, view: RequestView, holder: Mapping[str, Any] | None) -> None:
        self.view = view
        self.holder = holder
        self.status = 500
        self.expects_trailers = False
        self._headers: list[tuple[Any, Any]] = []
        self._trailers: list[tuple[Any, Any]] = []
        self._done = False
        self._lock = threading.Lock()

    def started(self, status: int, headers: Iterable[tuple[Any, Any]]) -> None:
        """The response's status and headers (names and values ``str`` or ``bytes``)."""
        self.status = status
        self._headers = list(headers)

    def trailed(self, trailers: Iterable[tuple[Any, Any]]) -> None:
        """Trailers the app sent after the body."""
        self._trailers.extend(trailers)

    @property
    def claimed(self) -> bool:
        """Whether it was settled (or is being settled) already."""
        return self._done

    def claim(self) -> bool:
        """True the first time only: the caller settles, no one else will."""
        with self._lock:
            done, self._done = self._done, True
        return not done

    def fields(self) -> tuple[dict[str, str], dict[str, str]]:
        """The headers and the trailers, each by lower-case name (a repeated field joined)."""
        return _by_name(self._headers), _by_name(self._trailers)

    def usage(self) -> Usage | None:
        return usage_of(self.holder)


def _by_name(pairs: Iterable[tuple[Any, Any]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in pairs:
        n = (name.decode("latin-1") if isinstance(name, bytes | bytearray) else str(name)).lower()
        v = value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)
        out[n] = f"{out[n]}, {v}" if n in out else v
    return out


def settled_cost(value: object) -> int | None:
    """A real cost from a header's text or a callable's answer: ASCII digits (or an int)
    from 0 to the stores' bound; None for anything else (the charge then stays)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, str):
        text = value.strip(" \t")
        if text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS:
            number = int(text)
            return number if number <= MAX_COUNT else None
    return None


def _warn_once(source: CostSource, detail: str) -> None:
    """Log a bad response cost once per source (a response header repeats on every request)."""
    if source.warned:
        return
    source.warned = True
    log.warning("ratekeeper: %s; the request keeps what it was charged (logged once)", detail)


def real_cost(source: CostSource, record: ResponseRecord) -> int | None:
    """What the response says the request cost under ``source``; None: keep the charge."""
    headers, trailers = record.fields()
    if source.call is not None:
        try:
            answer = source.call(record.view, record.status, {**headers, **trailers})
        except Exception:  # the response is sent: a failing callable keeps the charge
            log.exception("ratekeeper: response_cost's callable raised; the request keeps what it was charged")
            answer = None
        if answer is not None:
            cost = settled_cost(answer) if isinstance(answer, int) else None  # an int, as the option says
            if cost is not None:
                return cost
            _warn_once(
                source,
                f"response_cost's callable answered {answer!r:.40}, not an int from 0 to {MAX_COUNT}",
            )
    elif source.header is not None:
        text = trailers.get(source.header, headers.get(source.header))
        if text is not None:
            cost = settled_cost(text)
            if cost is not None:
                return cost
            _warn_once(
                source,
                f"the response's {source.header} field is {text!r:.40}, not ASCII digits up to {MAX_COUNT}",
            )
    meter = record.usage()
    if meter is not None and meter.added:
        return meter.total
    return None


def settlement(
    option: CostSource | Mapping[str, CostSource] | None, verdict: Verdict, record: ResponseRecord
) -> list[tuple[Charge, int]]:
    """The (charge, delta) pairs that settle ``verdict`` after its response: ``delta``
    (never 0) is what to charge more (> 0) or give back (< 0). Concurrency rules and
    rules the option does not name are left as they are."""
    if option is None:
        return []
    found: dict[int, int | None] = {}  # one answer per source: a callable is asked once
    out: list[tuple[Charge, int]] = []
    for charge in verdict.charges:
        source = _source(option, charge)
        if source is None:
            continue
        if id(source) not in found:
            found[id(source)] = real_cost(source, record)
        real = found[id(source)]
        if real is not None and real != charge.cost:
            out.append((charge, real - charge.cost))
    return out


def settles(option: CostSource | Mapping[str, CostSource] | None, verdict: Verdict) -> bool:
    """Whether ``verdict`` has a charge that its response may settle."""
    if option is None:
        return False
    return any(_source(option, charge) is not None for charge in verdict.charges)


def _source(option: CostSource | Mapping[str, CostSource], charge: Charge) -> CostSource | None:
    """Where ``charge``'s real cost is read; None when it is not settled (a lease, a
    concurrency rule, or a rule the option does not name)."""
    if charge.lease_id is not None or charge.rule.algorithm == "concurrency":
        return None
    return option.get(charge.rule.name) if isinstance(option, Mapping) else option
