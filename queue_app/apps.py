from django.apps import AppConfig


class QueueAppConfig(AppConfig):
    name = "queue_app"
    verbose_name = "Queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from . import checks as settings_checks  # noqa: F401  registers jobsite.E020-E023 (the JOBSITE dict)
        from . import registry  # installs the tasks' item defaults in the engine
        from .engine import tracing
        from .engine.db import tune_connection

        # OpenTelemetry traces, when OTEL_TRACES_EXPORTER=otlp says so: once per process (web, worker, commands).
        tracing.configure()
        connection_created.connect(tune_connection, dispatch_uid="jobsite-engine-session")
        post_migrate.connect(registry.publish_declarations, sender=self, dispatch_uid="jobsite-sql-api-publish")
