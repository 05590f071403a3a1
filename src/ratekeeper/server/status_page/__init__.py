"""The live status page of ``ratekeeper serve``, on the admin surface.

- ``GET /`` (with ``/status/page.js`` and ``/status/page.css``): a page for a person,
  plain HTML, CSS and JavaScript from this package (``assets.py``).
- ``GET /status.json``: what the page shows (``snapshot.py``): the rules, native and
  Envoy; decisions per rule over the last five minutes (``history.py``, sampled every
  2 s from the metrics the service keeps); store health, breaker state and reloads.
- ``POST /status/try``: the page's "try a check" form; exactly ``POST /v1/peek``, which
  charges nothing, so the page lets a visitor change nothing.

The admin surface's tokens apply to every one of these routes.
"""

from ratekeeper.server.status_page.assets import ASSETS, CONTENT_SECURITY_POLICY, asset
from ratekeeper.server.status_page.history import DecisionHistory
from ratekeeper.server.status_page.snapshot import history_of, status_doc

__all__ = ["ASSETS", "CONTENT_SECURITY_POLICY", "DecisionHistory", "asset", "history_of", "status_doc"]
