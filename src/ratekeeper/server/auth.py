"""Bearer tokens of one surface (decision or admin): where they come from and how a
request's ``Authorization`` is checked.

Tokens come from a file (``--decision-token-file`` / ``--admin-token-file``) or an
environment variable (``RATEKEEPER_DECISION_TOKENS`` / ``RATEKEEPER_ADMIN_TOKENS``),
never from the command line, where any user of the machine could read them in the
process list. One token a line: ``name:secret``, or a bare ``secret`` named
``token-<line number>``; blank lines and ``#`` comments are skipped. A file is read again
on SIGHUP, so a token can be rotated without a restart.

A presented secret is compared with every known secret in constant time (``hmac``), and
with all of them, so the time an answer takes says nothing about which prefix matched.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from ratekeeper.errors import ConfigurationError

__all__ = ["MIN_SECRET", "TokenSource", "Tokens", "bearer_secret", "parse_tokens"]

MIN_SECRET = 16
"""Fewest characters a secret may have: a short one is guessed by trying."""


@dataclass(frozen=True, slots=True)
class Tokens:
    """The tokens a surface accepts: name -> secret (empty: the surface takes no token)."""

    secrets: tuple[tuple[str, bytes], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.secrets)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.secrets]

    def match(self, presented: str | None) -> str | None:
        """The name of the token ``presented`` is, else None; every secret is compared."""
        if presented is None:
            return None
        given = presented.encode("utf-8", "surrogateescape")
        found = None
        for name, secret in self.secrets:
            if hmac.compare_digest(given, secret) and found is None:
                found = name
        return found


def parse_tokens(text: str, origin: str) -> Tokens:
    """``text`` (one token a line) as ``Tokens``; ``ConfigurationError`` naming ``origin``
    and the line when a line is not a usable token."""
    secrets: list[tuple[str, bytes]] = []
    names: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, secret = line.partition(":")
        if not sep:
            name, secret = f"token-{number}", line
        name, secret = name.strip(), secret.strip()
        where = f"{origin} line {number}"
        if not name or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ConfigurationError(
                f"{where}: the token name {name!r} is not usable; expected name:secret with a name of "
                "letters, digits, '-', '_' or '.'"
            )
        if len(secret) < MIN_SECRET or any(c.isspace() for c in secret):
            raise ConfigurationError(
                f"{where}: the secret of {name!r} has {len(secret)} characters or contains spaces; "
                f"expected at least {MIN_SECRET} characters without spaces (e.g. from: openssl rand -hex 32)"
            )
        if name in names:
            raise ConfigurationError(f"{where}: the token name {name!r} is used twice; each name once")
        names.add(name)
        secrets.append((name, secret.encode("utf-8", "surrogateescape")))
    return Tokens(tuple(secrets))


@dataclass(slots=True)
class TokenSource:
    """Where a surface's tokens come from, and the tokens read last.

    ``file`` is read again by ``reload()``; ``text`` (an environment variable's value) is
    fixed for the life of the process. Neither: the surface takes no token.
    """

    origin: str = ""
    file: Path | None = None
    text: str | None = None
    tokens: Tokens = Tokens()

    @classmethod
    def load(cls, file: str | None, text: str | None, env_name: str) -> TokenSource:
        if file:
            source = cls(origin=f"token file {file}", file=Path(file))
        elif text:
            source = cls(origin=f"${env_name}", text=text)
        else:
            return cls()
        source.tokens = source._read()
        if not source.tokens:
            raise ConfigurationError(
                f"{source.origin} has no token; expected one name:secret a line (or leave the option out "
                "for a surface without tokens)"
            )
        return source

    def _read(self) -> Tokens:
        if self.file is None:
            return parse_tokens(self.text or "", self.origin)
        try:
            text = self.file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"cannot read the {self.origin}: {exc.strerror}") from exc
        return parse_tokens(text, self.origin)

    def reload(self) -> bool:
        """Read the file again; True when the tokens changed. A file that became
        unreadable or empty keeps the tokens in force (and raises, for the log)."""
        if self.file is None:
            return False
        tokens = self._read()
        if not tokens:
            raise ConfigurationError(f"{self.origin} has no token now; the previous tokens stay in force")
        changed = tokens != self.tokens
        self.tokens = tokens
        return changed


def bearer_secret(authorization: str | None) -> str | None:
    """The secret of an ``Authorization: Bearer <secret>`` value, else None."""
    if not authorization:
        return None
    scheme, _, secret = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        return None
    return secret.strip()
