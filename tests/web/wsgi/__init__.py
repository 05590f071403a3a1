"""The WSGI and Django middleware served by real gunicorn and uvicorn processes; the apps
are in this package, the Django project in ``django_project``."""
