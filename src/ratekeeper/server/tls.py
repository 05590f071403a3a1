"""TLS for every listener (both HTTP surfaces and gRPC): the certificate, its key and,
optionally, the CA client certificates must be signed by; read again on SIGHUP.

HTTP serves from one ``ssl.SSLContext`` shared by both surfaces: a reload loads the new
chain into that same context, so the next handshake uses it and open connections keep
theirs. gRPC asks ``grpc.dynamic_ssl_server_credentials`` for its configuration on each
handshake; it gets the new one once after each reload.

A reload that fails (a missing file, a key that does not match) leaves the certificate
in force and says why in the log: a typo during a rotation does not take the service down.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratekeeper.errors import ConfigurationError

__all__ = ["TlsFiles", "TlsState"]


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """``--tls-cert``, ``--tls-key`` and ``--tls-client-ca`` (None: no client certificates)."""

    cert: str
    key: str
    client_ca: str | None = None


@dataclass(frozen=True, slots=True)
class _Loaded:
    cert: bytes
    key: bytes
    client_ca: bytes | None


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the {what} {path}: {exc.strerror}") from exc


class TlsState:
    """The TLS material in force and the contexts/credentials built from it."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()  # gRPC's fetcher runs on a gRPC thread
        self._loaded = self._load()
        self._version = 0
        self._served_version = 0
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._apply(self.context)

    def _load(self) -> _Loaded:
        """Read the files and check them by building a context from them."""
        f = self.files
        loaded = _Loaded(
            _read(f.cert, "TLS certificate"),
            _read(f.key, "TLS key"),
            _read(f.client_ca, "TLS client CA") if f.client_ca else None,
        )
        probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            probe.load_cert_chain(f.cert, f.key)
        except ssl.SSLError as exc:
            raise ConfigurationError(
                f"the TLS certificate {f.cert} and key {f.key} are not a usable pair ({exc.reason or exc}); "
                "expected a PEM certificate chain and the PEM private key of its first certificate"
            ) from exc
        if f.client_ca:
            try:
                probe.load_verify_locations(cafile=f.client_ca)
            except ssl.SSLError as exc:
                raise ConfigurationError(
                    f"the TLS client CA {f.client_ca} is not usable ({exc.reason or exc}); expected PEM certificates"
                ) from exc
        return loaded

    def _apply(self, context: ssl.SSLContext) -> None:
        context.load_cert_chain(self.files.cert, self.files.key)
        if self.files.client_ca:
            context.load_verify_locations(cafile=self.files.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED

    def reload(self) -> bool:
        """Read the files again; True when they changed (then new handshakes use them).
        ``ConfigurationError`` when they are not usable: the old material stays."""
        loaded = self._load()
        with self._lock:
            if loaded == self._loaded:
                return False
            self._loaded = loaded
            self._version += 1
        self._apply(self.context)
        return True

    # -- gRPC -------------------------------------------------------------------------

    def grpc_credentials(self) -> Any:
        import grpc  # type: ignore[import-untyped]

        return grpc.dynamic_ssl_server_credentials(
            self._grpc_config(self._loaded),
            self._grpc_fetch,
            require_client_authentication=self._loaded.client_ca is not None,
        )

    @staticmethod
    def _grpc_config(loaded: _Loaded) -> Any:
        import grpc

        return grpc.ssl_server_certificate_configuration([(loaded.key, loaded.cert)], loaded.client_ca)

    def _grpc_fetch(self) -> Any:
        """Called by gRPC before each handshake: the new configuration once after a reload, else None."""
        with self._lock:
            if self._served_version == self._version:
                return None
            self._served_version = self._version
            loaded = self._loaded
        return self._grpc_config(loaded)
