"""The rules ``ratekeeper serve`` runs when no rules file is given, printed at start.

Two documents, read by the same loaders as any rules file: the native form (the rules of
``/v1/*``) and the Envoy form (domain ``example``, for gRPC and ``POST /json``).
"""

from __future__ import annotations

from ratekeeper.config.envoy import parse_envoy
from ratekeeper.config.native import parse_rules
from ratekeeper.server.catalog import Catalog, build_catalog

__all__ = ["EXAMPLE_ENVOY", "EXAMPLE_RULES", "example_catalog"]

EXAMPLE_RULES = """\
rules:
  - name: items.list
    key: "{path.user}"
    match: {methods: [GET], path: "/items/{user}"}
    limits: ["1/2s"]
    algorithm: gcra
  - name: auth.create_token
    key: "{client_ip}"
    match: {methods: [POST], path: /auth/token}
    limits: ["20/minute", "5/3s"]
    algorithm: sliding_window_log
"""

EXAMPLE_ENVOY = """\
domain: example
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: message_type
    value: marketing
    rate_limit: {unit: day, requests_per_unit: 5}
"""


def example_catalog() -> Catalog:
    """The catalog of the two example documents."""
    return build_catalog(
        [
            ("<example rules>", parse_rules(EXAMPLE_RULES, "<example rules>")),
            ("<example envoy rules>", parse_envoy(EXAMPLE_ENVOY, "<example envoy rules>")),
        ]
    )
