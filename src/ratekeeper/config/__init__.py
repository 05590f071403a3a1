"""Rules files (YAML, the native and the Envoy form): loading, validation, reload.

The one loader that the middleware (``ratekeeper.web``), the service
(``ratekeeper.server``) and ``ratekeeper config check`` share. See docs/architecture.md.
"""
