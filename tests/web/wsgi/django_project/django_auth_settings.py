"""The test project with Django's real sessions and authentication (SQLite in the test's
directory, ``RK_WEB_CONFIG["db"]``): ``{user}`` must come from ``request.auser()`` on the
event loop, never from a database query made there."""

from __future__ import annotations

from web.wsgi.django_project.django_settings import *  # noqa: F403 - the base project, extended
from web.wsgi.django_project.django_settings import _config

INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django.contrib.sessions"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "ratekeeper.web.django.RateLimitMiddleware",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": _config.get("db", ":memory:")}}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast: a test project
