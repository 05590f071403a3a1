"""What the PostgreSQL store does to a connection's socket: sever it when its deadline
passes, disown it in a forked child. Both act on the socket, never on libpq's descriptor."""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

__all__ = ["disown", "sever"]


def sever(conn: Any) -> None:
    """Shut down ``conn``'s socket: a read blocked on it (a paused or vanished server, which
    no ``statement_timeout`` can end) returns at once with an error, and the pool drops
    the connection. Acts on the socket, not on a descriptor, so libpq's own stays valid."""
    with contextlib.suppress(Exception):
        fd = conn.pgconn.socket
        dup = socket.socket(fileno=os.dup(fd))
        try:
            dup.shutdown(socket.SHUT_RDWR)
        finally:
            dup.close()


def disown(conns: Any) -> None:
    """In a forked child: point each inherited connection's socket at ``/dev/null``, so that
    nothing the child does with it (closing it, or its collection sending libpq's Terminate)
    reaches the server on the parent's session. The parent's socket is untouched."""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for conn in conns:
            with contextlib.suppress(Exception):
                os.dup2(null, conn.pgconn.socket)
    finally:
        os.close(null)
