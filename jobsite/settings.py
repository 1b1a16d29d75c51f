"""Django settings for jobsite, read from the environment (django-environ, 12-factor).

`DATABASE_URL` unset means the project's embedded PostgreSQL (started on first connection, see
jobsite/embedded_pg/). SQLite is never a fallback: the queue needs SKIP LOCKED and LISTEN/NOTIFY.
"""

from pathlib import Path

import environ

from queue_app.conf import from_env
from queue_app.logconfig import logging_config

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(environ.Env().str("JOBSITE_VAR_DIR", default=str(BASE_DIR / "var")))

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)


def _secret_key() -> str:
    """Production must set SECRET_KEY; a development checkout keeps a generated one under var/."""
    if env.str("SECRET_KEY", default=""):  # set and not empty
        return env.str("SECRET_KEY")
    from django.core.exceptions import ImproperlyConfigured

    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    from django.core.management.utils import get_random_secret_key

    path = VAR_DIR / "secret_key"
    if not path.exists():
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(get_random_secret_key())
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off.")
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "queue_app",
    "queue_app.spark",  # the layers, each an app with its models (labels jobsite_spark, ...)
    "queue_app.workflows",
    "queue_app.datasets",
    "queue_app.webhooks",
    # This project's own app (up, test, embedded_db, the bench and chaos commands, the admin's titles) and the
    # demo's jobs, datasets and workflows: what an adopter's project does not install.
    "jobsite",
    "jobsite.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "jobsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "jobsite.wsgi.application"

if "DATABASE_URL" in env:
    DATABASES = {"default": env.db("DATABASE_URL")}
else:
    # The embedded backend starts the project's private cluster on first connection.
    DATABASES = {
        "default": {
            "ENGINE": "jobsite.embedded_backend",
            "NAME": env.str("JOBSITE_DB_NAME", default="jobsite"),
            "USER": "postgres",
        }
    }
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)

# QUEUE_DATABASE_URL: the queue on a database of its own, alias "queue" (JOBSITE["DATABASE"]), every table of
# queue_app there and none on "default" (queue_app.routers.JobsiteRouter). Unset: all on "default".
DATABASE_ROUTERS: list[str] = []
if "QUEUE_DATABASE_URL" in env:
    DATABASES["queue"] = env.db("QUEUE_DATABASE_URL")
    for alias in ("default", "queue"):
        DATABASES[alias].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
        DATABASES[alias].setdefault("CONN_HEALTH_CHECKS", True)
    DATABASE_ROUTERS = ["queue_app.routers.JobsiteRouter"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = env.str("TIME_ZONE", default="UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
if DEBUG:
    STORAGES["staticfiles"] = {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}

if not DEBUG:
    SECURE_CONTENT_TYPE_NOSNIFF = True
    SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=True)
    CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=True)
    SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=True)
    SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=31536000)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=False)
    if not SECURE_HSTS_PRELOAD:
        # Preloading is a one-way commitment for the domain and all its subdomains, made by the operator with
        # SECURE_HSTS_PRELOAD=true; without it, `check --deploy` would warn on every deployment that chose not to.
        SILENCED_SYSTEM_CHECKS = ["security.W021"]
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# jobsite's settings: every JOBSITE_<KEY> environment variable read as its setting's type (queue_app/conf.py has
# each key and its default; an adopter's settings may call the same helper or write the dict).
JOBSITE = {**from_env(), "VAR_DIR": VAR_DIR}
if "queue" in DATABASES:
    JOBSITE.setdefault("DATABASE", "queue")

# Django's task framework runs on jobsite's queue: any `@task` is an item a `run_worker` runs (QUEUES empty: any
# queue name). See queue_app/tasks_backend.py.
TASKS = {"default": {"BACKEND": "queue_app.tasks_backend.QueueBackend", "QUEUES": []}}

# LOG_FORMAT=json: every line one JSON object (python-json-logger) with the ids of what it is about (item, task,
# attempt, queue, worker, workflow, Spark run: queue_app/logcontext.py); plain, the default, is for people.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
LOGGING = logging_config(LOG_FORMAT, env.str("LOG_LEVEL", default="INFO"))
JOBSITE["LOG_FORMAT"] = LOG_FORMAT
