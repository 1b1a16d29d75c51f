#!/usr/bin/env python3
"""Django's command-line utility for administrative tasks.

Runs under any python3: jobsite.bootstrap first re-runs the command inside the project's .venv (Python 3.12+),
creating and installing it on first use.
"""

import os
import sys


def main():
    from jobsite.bootstrap import ensure_venv

    ensure_venv()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
    try:
        from django.core.management import execute_from_command_line
    except ImportError as exc:
        raise ImportError(
            "Couldn't import Django. Run `python3 manage.py ...` without JOBSITE_NO_BOOTSTRAP, or install "
            "the project into your environment (`pip install -e '.[dev]'`)."
        ) from exc
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    try:
        settings.INSTALLED_APPS  # noqa: B018  (loads the settings: SECRET_KEY, ALLOWED_HOSTS... are checked there)
    except ImproperlyConfigured as exc:
        # A configuration refusal (e.g. DEBUG off without SECRET_KEY) is a message for the operator, not a traceback.
        sys.exit(f"jobsite: {exc}")
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
