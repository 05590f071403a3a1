"""The service store's URL and options, checked (``ServiceOptions``), and its bearer secret."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from ratekeeper.errors import ConfigurationError
from ratekeeper.stores.options import bool_option, number_option
from ratekeeper.stores.service.protocol import MAX_OPS

__all__ = ["SERVICE_SCHEMES", "TOKEN_ENV", "ServiceOptions", "read_token", "tls_context"]

SERVICE_SCHEMES = ("http", "https")

TOKEN_ENV = "RATEKEEPER_SERVICE_TOKEN"
"""Where the bearer secret comes from when the URL names no ``token_file``."""


class ServiceOptions:
    """The options of an ``http://`` / ``https://`` store URL (query or keywords):
    ``timeout`` (seconds, default 1), ``max_in_flight`` (calls out at once, default 8),
    ``max_batch`` (ops per call, default 512), ``batching`` (default true),
    ``token_file`` (a file holding the bearer secret of the service's admin surface; else
    the environment's ``RATEKEEPER_SERVICE_TOKEN``, else no token); for ``https://``,
    ``ca_file`` (PEM CAs to trust instead of the system's) and ``cert_file`` / ``key_file``
    (a client certificate, for a service started with ``--tls-client-ca``)."""

    def __init__(self, url: str, options: dict[str, Any], environ: Mapping[str, str] | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme.lower() not in SERVICE_SCHEMES or not parts.netloc:
            raise ConfigurationError(f"a service store URL looks like http://host:8082, got {url!r}")
        given: dict[str, Any] = dict(parse_qsl(parts.query))
        given.update(options)
        known = {"timeout", "max_in_flight", "max_batch", "batching", "token_file", "ca_file", "cert_file", "key_file"}
        unknown = set(given) - known
        if unknown:
            raise ConfigurationError(
                f"unknown option(s) {sorted(unknown)} for {parts.scheme}://; accepted: {', '.join(sorted(known))}"
            )
        self.base_url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.timeout: float = number_option("timeout", given.get("timeout", 1.0), float, 0.001)
        self.max_in_flight: int = number_option("max_in_flight", given.get("max_in_flight", 8), int, 1)
        self.max_batch: int = min(number_option("max_batch", given.get("max_batch", 512), int, 1), MAX_OPS)
        self.batching: bool = bool_option("batching", given.get("batching", True))
        self.verify = tls_context(given.get("ca_file"), given.get("cert_file"), given.get("key_file"))
        secret = read_token(given.get("token_file"), os.environ if environ is None else environ)
        self.headers = {"content-type": "application/json"}
        if secret is not None:
            self.headers["authorization"] = f"Bearer {secret}"


def tls_context(ca_file: Any, cert_file: Any, key_file: Any) -> ssl.SSLContext | bool:
    """What the HTTP client verifies the service with: True (the system's CAs) unless a CA
    file or a client certificate is given."""
    if ca_file is None and cert_file is None and key_file is None:
        return True
    if (cert_file is None) != (key_file is None):
        raise ConfigurationError("cert_file and key_file go together (a client certificate and its key)")
    try:
        context = ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))
        if cert_file is not None:
            context.load_cert_chain(str(cert_file), str(key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"the TLS files of the service store cannot be used: {exc}") from None
    return context


def read_token(token_file: Any, environ: Mapping[str, str]) -> str | None:
    """The bearer secret: the first line of ``token_file`` that is neither blank nor a
    ``#`` comment, else ``$RATEKEEPER_SERVICE_TOKEN``, else None (no token sent)."""
    if token_file is not None:
        if not isinstance(token_file, str | os.PathLike) or not str(token_file):
            raise ConfigurationError(f"token_file is the path of a file holding the secret, got {token_file!r}")
        try:
            with open(token_file, encoding="utf-8") as f:
                lines = [line.strip() for line in f.read(64 * 1024).splitlines()]
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"token_file {str(token_file)!r} cannot be read: {exc}") from None
        secrets = [line for line in lines if line and not line.startswith("#")]
        if not secrets:
            raise ConfigurationError(f"token_file {str(token_file)!r} holds no secret; write the secret on one line")
        return _secret(secrets[0], f"token_file {str(token_file)!r}")
    value = environ.get(TOKEN_ENV, "").strip()
    return _secret(value, f"${TOKEN_ENV}") if value else None


def _secret(value: str, where: str) -> str:
    # It goes into a header line: printable ASCII without spaces, as the service's token files have it.
    if not value.isascii() or not value.isprintable() or " " in value:
        raise ConfigurationError(f"{where}: a secret is printable ASCII without spaces (one secret, one line)")
    return value
