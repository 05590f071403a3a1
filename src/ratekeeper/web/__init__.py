"""HTTP integrations: ASGI and WSGI middleware, Django, FastAPI, over one
request-to-decision core. See docs/architecture.md for what may import what.
"""
