"""The service's structured logs: one JSON object a line on stderr, one line per event.

Events: ``start``, ``stop``, ``reload``, ``store`` (reachable or not: logged on each
change, not on each request), ``breaker`` (a circuit-breaker transition). Requests are
never logged one by one (the metrics count them).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

__all__ = ["LOGGER", "configure", "log"]

LOGGER = logging.getLogger("ratekeeper.server")

_REPLACED = {("watcher", "_load"), ("failure", "_log_transition")}
"""Library log records the service writes itself as structured events (``reload``,
``breaker``): left out so each event is one line."""


def _not_replaced(record: logging.LogRecord) -> bool:
    return (record.module, record.funcName) not in _REPLACED


class _JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        line = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            **fields,
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, separators=(",", ":"))


def configure(stream: Any = None) -> None:
    """Send the logs of ratekeeper (the service's and the library's, e.g. the failure
    policy's) to ``stream`` (stderr) as JSON lines; idempotent."""
    root = logging.getLogger("ratekeeper")
    if any(getattr(h, "_ratekeeper", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(_JsonLines())
    handler.addFilter(_not_replaced)
    handler._ratekeeper = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False


def log(event: str, level: str = "info", **fields: Any) -> None:
    """One line: ``{"ts": ..., "level": ..., "event": event, **fields}``."""
    LOGGER.log(logging.getLevelName(level.upper()), event, extra={"fields": fields})
