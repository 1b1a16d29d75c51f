"""The probe tasks' tables (probes/tasks.py): what the chaos runs, benchmarks and tests count runs and effects by.

Part of the queue_app app (app_label queue_app, tables queue_app_executionlog and queue_app_probeeffect from
migrations 0002 and 0003); queue_app.models imports this module so Django registers them."""

from django.db import models
from django.db.models.functions import Now


class ExecutionLog(models.Model):
    """One row per run of a probe task's handler, written outside the handler's transaction so it survives a
    rollback: how anyone checks the delivery guarantees from outside (count runs per item and reservation).

    Plain ids rather than foreign keys: a log line must outlive pruned items and never block a delete.
    """

    id = models.BigAutoField(primary_key=True)
    item_id = models.BigIntegerField()
    reservation_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    task = models.CharField(max_length=200)
    delivery = models.CharField(max_length=20)
    pid = models.IntegerField()
    worker_id = models.CharField(max_length=200)
    executed_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index("item_id", name="execlog_item")]

    def __str__(self) -> str:
        return f"run of item {self.item_id} (reservation {self.reservation_id}, attempt {self.attempt})"


class ProbeEffect(models.Model):
    """The database write a probe handler makes, keyed by item id. A probe upserts `applied = applied + 1`, so
    an effect applied twice shows as 2; in transactional delivery the write commits with the settle or not at
    all."""

    key = models.CharField(primary_key=True, max_length=200)
    applied = models.PositiveIntegerField(default=1)
    applied_at = models.DateTimeField(db_default=Now())

    def __str__(self) -> str:
        return f"effect {self.key} applied {self.applied}x"
