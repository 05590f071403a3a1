"""The page's files (``page.html``, ``page.js``, ``page.css``), shipped in this package
(the wheel takes every file of ``src/ratekeeper``), read once and served as they are: no
build step, nothing fetched from elsewhere, so the page works offline."""

from __future__ import annotations

import functools
from importlib import resources

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "asset"]

ASSETS = {
    "/": ("page.html", "text/html; charset=utf-8"),
    "/status/page.js": ("page.js", "text/javascript; charset=utf-8"),
    "/status/page.css": ("page.css", "text/css; charset=utf-8"),
}
"""Route -> (file, content type)."""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
)
"""The page runs only its own script and talks only to its own origin; no frame can hold
it (no click-jacking of the admin surface)."""


@functools.cache
def asset(path: str) -> tuple[bytes, str]:
    """The body and content type of the file served at ``path`` (one of ``ASSETS``)."""
    name, content_type = ASSETS[path]
    return resources.files(__package__).joinpath(name).read_bytes(), content_type
