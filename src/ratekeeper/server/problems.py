"""The service's error answers: ``application/problem+json`` (RFC 9457) saying what is
wrong and what would be accepted.

Bad input never reaches the limiter: it is refused with a 4xx before anything is
charged. (A refusal by a limit is not an error: ``/v1/check`` answers it with 429 and
the decision.)
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from ratekeeper.web.problem import PROBLEM_CONTENT_TYPE

__all__ = ["BadInput", "problem_document"]


class BadInput(Exception):
    """A request the service refuses: ``status`` (4xx, or 503 when the store is down),
    ``detail`` (what is wrong), ``accepted`` (what would be right). ``headers`` are added
    to the answer (``Allow`` on a 405)."""

    def __init__(
        self,
        status: int,
        detail: str,
        accepted: str | None = None,
        *,
        headers: tuple[tuple[str, str], ...] = (),
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.accepted = accepted
        self.headers = headers
        self.extra = extra

    def document(self) -> dict[str, Any]:
        return problem_document(self.status, self.detail, self.accepted, **self.extra)

    def body(self) -> bytes:
        return json.dumps(self.document(), separators=(",", ":")).encode()

    @property
    def content_type(self) -> str:
        return PROBLEM_CONTENT_TYPE


def problem_document(status: int, detail: str, accepted: str | None = None, **extra: Any) -> dict[str, Any]:
    """A problem of type ``about:blank``: its title is the status's reason phrase."""
    doc: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if accepted is not None:
        doc["accepted"] = accepted
    doc.update(extra)
    return doc
