"""The test Django project as a WSGI app (gunicorn)."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.wsgi.django_project.django_settings")

from django.core.wsgi import get_wsgi_application

application = get_wsgi_application()
