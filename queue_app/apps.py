from django.apps import AppConfig


class QueueAppConfig(AppConfig):
    name = "queue_app"
    verbose_name = "Queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from . import registry  # noqa: F401  installs the tasks' item defaults in the engine
        from .engine.db import tune_connection
        from .spark import checks  # noqa: F401  registers jobsite.W010 (Java for Spark runs)

        connection_created.connect(tune_connection, dispatch_uid="jobsite-engine-session")
