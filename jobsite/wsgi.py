"""WSGI entry point (gunicorn jobsite.wsgi)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
application = get_wsgi_application()

from jobsite.serving import settle  # noqa: E402  (after the apps are loaded)

settle()
