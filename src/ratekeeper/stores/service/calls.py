"""What the blocking service store sends and how: one ``POST /v1/store`` per call, errors.

Generated from ``calls_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ratekeeper.errors import StoreError, StoreTimeout
from ratekeeper.stores.bounds import check_op
from ratekeeper.stores.service.sansio import (
    STORE_PATH,
    ServiceOptions,
    decode_reply,
    encode_call,
    read_response,
    reset_op,
)

if TYPE_CHECKING:
    from ratekeeper.algorithms.base import Plan
    from ratekeeper.decision import Decision
    from ratekeeper.op import Op

__all__ = ["ServiceCalls"]


class ServiceCalls:
    """The calls of the service store: ``_run`` (a coalesced call), ``decide_many``,
    ``reset``. httpx keeps the connections (HTTP/1.1 keep-alive, one per call in flight)."""

    def __init__(self, url: str, **options: Any) -> None:
        import httpx

        self.options = ServiceOptions(url, options)
        self._httpx = httpx
        self.client = httpx.Client(
            base_url=self.options.base_url,
            timeout=self.options.timeout,
            verify=self.options.verify,
            limits=httpx.Limits(max_connections=self.options.max_in_flight + 2),
        )
        self.calls = 0

    def _post(self, body: bytes, what: str) -> list[Any]:
        httpx = self._httpx
        self.calls += 1
        try:
            response = self.client.post(STORE_PATH, content=body, headers=self.options.headers)
        except httpx.TimeoutException as exc:
            raise StoreTimeout(
                f"the ratekeeper service at {self.options.base_url} did not answer {what} "
                f"within {self.options.timeout:g} s"
            ) from exc
        except httpx.HTTPError as exc:
            error = StoreError(f"the ratekeeper service at {self.options.base_url} is unreachable ({what}): {exc}")
            cause = exc.__context__ if isinstance(exc.__context__, OSError) else OSError(str(exc))
            raise error from cause
        return read_response(response.status_code, response.content)

    def _run(self, ops: Sequence[Op], now: int | None) -> list[Decision | StoreError | bool | None]:
        """One call deciding ``ops`` in order, one result each (see ``stores/coalescing.py``)."""
        results = decode_reply(ops, self._post(encode_call(ops, now, False), "a decision"))
        if len(ops) == 1 and isinstance(results[0], StoreError):
            raise results[0]  # a lone caller's path does not check its result
        return results

    def decide_many(self, ops: Sequence[Op], now: int | None = None) -> tuple[Decision, ...]:
        for op in ops:
            check_op(op, now)
        results = decode_reply(ops, self._post(encode_call(ops, now, True), "a batch"))
        decisions: list[Decision] = []
        for result in results:
            if isinstance(result, StoreError):
                raise result
            assert result is not None and not isinstance(result, bool)
            decisions.append(result)
        return tuple(decisions)

    def reset(self, plan: Plan, key: str) -> None:
        op = reset_op(plan, key)
        result = decode_reply([op], self._post(encode_call([op], None, False), "a reset"))[0]
        if isinstance(result, StoreError):
            raise result
