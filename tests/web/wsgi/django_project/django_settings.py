"""Settings of the Django project the tests serve (gunicorn: ``web.wsgi.django_project.django_wsgi``,
uvicorn: ``web.wsgi.django_project.django_asgi``); ``RATEKEEPER`` comes from ``RK_WEB_CONFIG``."""

from __future__ import annotations

from web.wsgi import config

SECRET_KEY = "ratekeeper-tests-only"  # a test project, never deployed
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "web.wsgi.django_project.django_urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
MIDDLEWARE = [
    "web.wsgi.django_project.django_views.HeaderUserMiddleware",
    "ratekeeper.web.django.RateLimitMiddleware",
]
DATABASES: dict[str, object] = {}
USE_TZ = True
LOGGING = {"version": 1, "disable_existing_loggers": False}

_config = config.load()
if "base_dir" in _config:  # a relative rules path is read from here
    BASE_DIR = _config["base_dir"]
RATEKEEPER = config.middleware_kwargs(_config)
if "denied_view" in _config:  # the @ratelimit views' denial view
    RATEKEEPER_DENIED_VIEW = _config["denied_view"]
