"""The PostgreSQL store's URL and options, checked (``PostgresOptions``)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ratekeeper.errors import ConfigurationError
from ratekeeper.stores.options import bool_option, number_option, prefix_option

__all__ = ["POSTGRES_SCHEMES", "PostgresOptions", "identifier", "statement_ms"]

POSTGRES_SCHEMES = ("postgresql", "postgres")
OPTIONS = (
    "schema",
    "table",
    "unlogged",
    "timeout",
    "min_size",
    "max_size",
    "prefix",
    "batching",
    "max_in_flight",
    "synchronous_commit",
)
LIBPQ_OPTIONS = (
    "application_name",
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslpassword",
    "passfile",
    "target_session_attrs",
    "options",
    "user",
    "password",
    "host",
    "port",
    "dbname",
)
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,47}")


def identifier(name: str, value: Any) -> str:
    """``value`` when it is a plain lower-case SQL identifier; ``ConfigurationError`` otherwise."""
    if not isinstance(value, str) or not _IDENTIFIER.fullmatch(value):
        raise ConfigurationError(
            f"store option {name} must be a plain lower-case SQL identifier (letters, digits, _; "
            f"at most 48 characters, not starting with a digit), got {value!r}"
        )
    return value


class PostgresOptions:
    """A ``postgresql://`` URL with its options; keywords override the URL's query.

    ``schema`` (default ``ratekeeper``) and ``table`` (default ``state``) name where the
    state lives; ``unlogged`` creates the table UNLOGGED (faster, emptied by a crash);
    ``timeout`` (seconds, default 1.0) bounds connecting, waiting for a pooled connection
    and each statement (``statement_timeout``); ``min_size`` / ``max_size`` size the pool;
    ``prefix`` is put before every storage key; ``batching`` (default true) coalesces
    concurrent calls into one statement while ``max_in_flight`` statements are out
    (default ``max_size``: a caller queues only while every connection is busy or its row
    has a statement out);
    ``synchronous_commit`` (default false) makes each decision wait for its WAL flush
    (off, a crash of the server may forget the last few milliseconds of charges, never
    corrupt a state).
    libpq's own query parameters (``sslmode``, ``application_name``, ...) pass through.
    """

    def __init__(self, url: str, **options: Any) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in POSTGRES_SCHEMES:
            raise ConfigurationError(f"not a PostgreSQL URL: {url!r}; expected postgresql://user@host:port/dbname")
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {k: v for k, v in query.items() if k in OPTIONS}
        libpq = {k: v for k, v in query.items() if k not in OPTIONS}
        unknown = (set(libpq) - set(LIBPQ_OPTIONS)) | (set(options) - set(OPTIONS))
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {sorted(unknown)} for postgresql://; accepted: {', '.join(OPTIONS)} "
                f"(in the URL or as keywords) and libpq's {', '.join(LIBPQ_OPTIONS)} (in the URL)"
            )
        ours.update(options)
        self.schema: str = identifier("schema", ours.get("schema", "ratekeeper"))
        self.table: str = identifier("table", ours.get("table", "state"))
        self.unlogged: bool = bool_option("unlogged", ours.get("unlogged", False))
        self.timeout: float = number_option("timeout", ours.get("timeout", 1.0), float, 0.001)
        self.min_size: int = number_option("min_size", ours.get("min_size", 1), int, 0)
        self.max_size: int = number_option("max_size", ours.get("max_size", 10), int, 1)
        if self.max_size < self.min_size:
            raise ConfigurationError(f"store option max_size ({self.max_size}) must be >= min_size ({self.min_size})")
        self.prefix: str = prefix_option(ours.get("prefix", ""))
        self.batching: bool = bool_option("batching", ours.get("batching", True))
        # Default: one statement per pooled connection, so a caller with a connection free
        # (and its row idle) never waits for another's statement.
        self.max_in_flight: int = number_option("max_in_flight", ours.get("max_in_flight", self.max_size), int, 1)
        self.synchronous_commit: bool = bool_option("synchronous_commit", ours.get("synchronous_commit", False))
        self.conninfo: str = urlunsplit(parts._replace(query=urlencode(libpq)))

    def connection_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of every pooled connection (libpq rounds a connect timeout up to 2 s)."""
        return {
            "autocommit": True,
            "connect_timeout": max(1, round(self.timeout + 0.499)),
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "prepare_threshold": 0,
        }

    @property
    def statement_timeout_ms(self) -> int:
        """The server's ``statement_timeout``: a little under ``timeout``, so the server
        cancels a slow statement (and keeps the connection) before the client-side deadline
        severs it."""
        return statement_ms(self.timeout)


def statement_ms(seconds: float) -> int:
    """A server-side statement timeout for a call with ``seconds`` to finish, in ms."""
    return max(1, round(seconds * 800))
