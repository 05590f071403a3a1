"""``AsyncLane``: one connection of the store's pool, held for the decision calls.

A call that holds an in-flight slot sends its command on a connection of its own,
skipping the client's pool checkout (a lock and a health check per call) and its command
dispatch. It is redis-py's own ``Connection`` underneath, so the parser, the error
replies (``ResponseError``, ``NoScriptError``), timeouts, authentication, TLS and
Sentinel's master lookup are redis-py's, and so is what happens after a failure: any
failure but an error reply (a timeout, a lost connection, a cancelled send or read) drops
the connection, and the command is sent again as the client's ``execute_command`` would
(the connection's ``retry``: a failover behind Sentinel is ridden out on the new master).

The source of ``lane.py`` (``Lane``, for the blocking store): ``tools/unasync.py`` writes it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncLane"]


class AsyncLane:
    """A held connection that the shell sends its commands on (the role of a client)."""

    __slots__ = ("connection",)

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    async def execute_command(self, *args: Any) -> Any:
        conn = self.connection
        return await conn.retry.call_with_retry(lambda: self._send(conn, args), self._failed)

    @staticmethod
    async def _send(conn: Any, args: tuple[Any, ...]) -> Any:
        await conn.send_packed_command(conn.pack_command(*args), check_health=False)
        return await conn.read_response()

    async def _failed(self, error: BaseException) -> None:
        await self.connection.disconnect()

    async def script_load(self, source: str) -> Any:
        return await self.execute_command("SCRIPT", "LOAD", source)
