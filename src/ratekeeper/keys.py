"""Keys built from what a client sent, bounded to what a store accepts.

A key rendered from request data (a header, a path segment, an Envoy descriptor's
values) can be as long as the client likes, and a store refuses keys over
``MAX_KEY_LENGTH`` characters. Refusing the request for that would let any client turn a
long ``Authorization`` header into an error page; cutting the key short would let two
clients whose keys share a long prefix share a budget. So a key over the bound keeps a
readable prefix and replaces the rest by a SHA-256 digest of the whole key: distinct
keys stay distinct (up to a digest collision), the same key always gives the same
bounded key, and what an operator reads in a store or a log still says where it came from.
"""

from __future__ import annotations

import hashlib

__all__ = ["DIGEST_MARK", "MAX_KEY_LENGTH", "bounded_key"]

MAX_KEY_LENGTH = 512
"""The longest key (in characters) a call may pass; longer keys are refused (also
``ratekeeper.rule.MAX_KEY_LENGTH``)."""

DIGEST_MARK = "~sha256:"
"""What separates a bounded key's kept prefix from the digest of the whole key."""

_DIGEST_CHARS = 64
_KEPT = MAX_KEY_LENGTH - len(DIGEST_MARK) - _DIGEST_CHARS


def bounded_key(key: str) -> str:
    """``key`` itself when a store accepts its length, else its first characters followed
    by ``~sha256:`` and the hex digest of the whole key (exactly ``MAX_KEY_LENGTH`` long)."""
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{key[:_KEPT]}{DIGEST_MARK}{digest}"
