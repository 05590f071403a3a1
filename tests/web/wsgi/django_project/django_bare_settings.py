"""The test project with nothing before ratekeeper's middleware: no middleware can set
``request.user`` before it decides, so a rule keyed by ``{user}`` alone is refused at start."""

from __future__ import annotations

from web.wsgi.django_project.django_settings import *  # noqa: F403 - the base project, with another MIDDLEWARE

MIDDLEWARE = ["ratekeeper.web.django.RateLimitMiddleware"]
