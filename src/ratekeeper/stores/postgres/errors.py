"""psycopg's and psycopg_pool's exceptions, named: what the PostgreSQL store raises for
them (``translate``, ``refusal``), and what they say about the server (``store_down``,
``applied_nothing``, ``connection_lost``, ``Connects``)."""

from __future__ import annotations

from ratekeeper.errors import StoreError, StoreTimeout

__all__ = [
    "FIRST_CONNECT_SLICE",
    "Connects",
    "applied_nothing",
    "connection_lost",
    "refusal",
    "store_down",
    "translate",
]


def connection_lost(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection (or the server) went away: the pool's idle
    connections are then suspect and are checked."""
    import psycopg

    return isinstance(exc, psycopg.OperationalError) and not isinstance(exc, psycopg.errors.QueryCanceled)


def translate(exc: BaseException, what: str) -> StoreError:
    """Our exception for a psycopg / psycopg_pool one (the caller chains it with ``from exc``)."""
    import psycopg
    import psycopg_pool

    if isinstance(exc, psycopg.errors.QueryCanceled):
        return StoreTimeout(f"PostgreSQL did not finish {what} within the statement timeout: {exc}")
    if isinstance(exc, psycopg_pool.PoolTimeout | psycopg.errors.ConnectionTimeout | TimeoutError):
        return StoreTimeout(f"PostgreSQL did not answer {what} in time: {exc}")
    if isinstance(exc, psycopg.OperationalError | psycopg_pool.PoolClosed | OSError):
        return StoreError(f"PostgreSQL is unreachable for {what}: {exc}")
    return StoreError(f"PostgreSQL failed {what}: {exc}")


FIRST_CONNECT_SLICE = 0.02
"""Seconds a call waits at a time for the pool's first connection, between looks at what
the connection attempts found (``Connects``)."""

# What a server's refusal says when retrying cannot change it: a missing role or database,
# a failed authentication, no pg_hba.conf entry, no right to connect.
_FINAL_REFUSALS = (
    "does not exist",
    "authentication failed",
    "pg_hba.conf",
    "permission denied",
    "no password supplied",
    "password is required",
)


class Connects:
    """What the pool's connection attempts found: the shells' connection class records
    each attempt (``failed`` / ``succeeded``), from the pool's worker threads or tasks.

    Until a first connection succeeds, a call that needs one does not wait the whole
    timeout for it: the error of the last attempt is raised at once as a ``StoreError``
    with the server's own reason (``refusal``), and when retrying cannot fix it
    (``final``) the shell closes the pool, so its background retries stop instead of
    logging the same refusal again and again.
    """

    __slots__ = ("connected", "error")

    def __init__(self) -> None:
        self.connected = False
        self.error: BaseException | None = None

    def failed(self, exc: BaseException) -> None:
        self.error = exc

    def succeeded(self) -> None:
        self.connected = True
        self.error = None

    def final(self) -> bool:
        """Whether no connection was ever made and the last attempt failed for a reason that
        retrying cannot fix (the server refused this role, database or password; or the
        client refused the connection options)."""
        import psycopg

        error = self.error
        if self.connected or error is None:
            return False
        if not isinstance(error, psycopg.OperationalError):
            return True  # the client refused the options: no retry changes them
        text = str(error)
        return "FATAL" in text and any(reason in text for reason in _FINAL_REFUSALS)


def refusal(exc: BaseException, what: str) -> StoreError:
    """The ``StoreError`` of a connection attempt that failed, with its own reason (the caller
    chains it with ``from exc``)."""
    reason = " ".join(str(exc).split())
    reason = reason.removeprefix("connection failed: ")
    return StoreError(f"could not connect to PostgreSQL for {what}: {reason}")


def applied_nothing(exc: BaseException) -> bool:
    """Whether a failed statement (``exc``, translated, its psycopg error chained) applied
    nothing because of the data it was given: the server refused it with a data, integrity
    or PL/pgSQL error (an autocommit statement that fails is rolled back whole), so its
    ops may be decided again apart. Not a lost connection, a timeout or a cancel (whether
    it committed is unknown), nor a missing function (every part would fail alike)."""
    import psycopg

    cause = exc.__cause__
    return (
        isinstance(exc, StoreError)
        and not isinstance(exc, StoreTimeout)
        and isinstance(
            cause, psycopg.DataError | psycopg.IntegrityError | psycopg.InternalError | psycopg.NotSupportedError
        )
        and getattr(cause, "sqlstate", None) is not None
    )


def store_down(exc: BaseException) -> bool:
    """Whether ``exc`` (translated, its psycopg error chained) says PostgreSQL is unreachable
    or timed out: a connection lost, refused or severed by the client-side deadline, a
    statement past its timeout, the server shutting down (psycopg's ``OperationalError``).
    The calls queued behind the failed one then get the same error instead of waiting
    their turn. Not when one statement was wrong, nor when this process's pool had no
    connection free in time (``PoolTimeout``)."""
    import psycopg
    import psycopg_pool

    cause = exc.__cause__
    if not isinstance(exc, StoreError) or cause is None or isinstance(cause, psycopg_pool.PoolTimeout):
        return False
    return isinstance(exc, StoreTimeout) or isinstance(cause, psycopg.OperationalError | OSError)
