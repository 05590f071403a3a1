"""``ratekeeper serve``: the JSON-over-HTTP API and Envoy's gRPC rate-limit service.
See docs/architecture.md for what may import what.
"""
