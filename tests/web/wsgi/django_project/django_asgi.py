"""The test Django project as an ASGI app (uvicorn): async views run on the event loop."""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.wsgi.django_project.django_settings")

from django.core.asgi import get_asgi_application

application = get_asgi_application()
