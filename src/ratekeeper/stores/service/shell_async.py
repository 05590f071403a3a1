"""How the asyncio service store sends what ``ServicePlanner`` plans: one ``POST /v1/store``
per call on httpx's ``AsyncClient`` (HTTP/1.1 keep-alive, a connection per call in flight).

The source of ``shell.py``: ``tools/unasync.py`` writes the blocking shell from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ratekeeper.stores.service.errors import reason, unreachable
from ratekeeper.stores.service.protocol import STORE_PATH

if TYPE_CHECKING:
    from ratekeeper.stores.service.options import ServiceOptions

__all__ = ["AsyncServiceShell"]


class AsyncServiceShell:
    """Posts call bodies to the service and hands back each reply's status and body;
    ``calls`` counts the requests sent."""

    def __init__(self, options: ServiceOptions) -> None:
        import httpx

        self.options = options
        self._httpx = httpx
        self.client = httpx.AsyncClient(
            base_url=options.base_url,
            timeout=options.timeout,
            verify=options.verify,
            limits=httpx.Limits(max_connections=options.max_in_flight + 2),
        )
        self.calls = 0

    async def post(self, body: bytes, what: str) -> tuple[int, bytes]:
        """The status and body of the service's reply to ``body``; ``StoreError`` (or
        ``StoreTimeout``) when no reply came."""
        self.calls += 1
        options = self.options
        try:
            response = await self.client.post(STORE_PATH, content=body, headers=options.headers)
        except self._httpx.HTTPError as exc:
            raise unreachable(exc, options.base_url, options.timeout, what) from reason(exc)
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self.client.aclose()
