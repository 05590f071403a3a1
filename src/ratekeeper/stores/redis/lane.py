"""``Lane``: one connection of the blocking Redis store's pool, held for the decision calls.

Generated from ``lane_async.py`` by ``tools/unasync.py``: do not edit; edit that file
and run ``python tools/unasync.py``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Lane"]


class Lane:
    """A held connection that the shell sends its commands on (the role of a client)."""

    __slots__ = ("connection",)

    def __init__(self, connection: Any) -> None:
        self.connection = connection

    def execute_command(self, *args: Any) -> Any:
        conn = self.connection
        return conn.retry.call_with_retry(lambda: self._send(conn, args), self._failed)

    @staticmethod
    def _send(conn: Any, args: tuple[Any, ...]) -> Any:
        conn.send_packed_command(conn.pack_command(*args), check_health=False)
        return conn.read_response()

    def _failed(self, error: BaseException) -> None:
        self.connection.disconnect()

    def script_load(self, source: str) -> Any:
        return self.execute_command("SCRIPT", "LOAD", source)
