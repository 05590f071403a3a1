"""Django configured in the test process, once, whichever test module imports it first:
bare settings (no apps, no database) that each test overrides (``override_settings``).
Configured and set up together, so a module's tests behave alike run alone or in a suite."""

from __future__ import annotations

import django
from django.conf import settings  # type: ignore[import-untyped]

__all__ = ["configure"]


def configure() -> None:
    """Configure Django for this process, unless something did already."""
    if not settings.configured:
        settings.configure(SECRET_KEY="ratekeeper-tests", ALLOWED_HOSTS=["*"], INSTALLED_APPS=[], DATABASES={})
        django.setup()
