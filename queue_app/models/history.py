"""Finished items and their attempts, moved out of the hot tables (engine/history.py)."""

from django.db import models

from .queue import ItemState, Outcome


class ItemHistory(models.Model):
    """A finished item moved out of the hot table (engine/history.py): the same columns, in a table partitioned
    by day of `finished_at` (migration 0017; its primary key is (id, finished_at) in PostgreSQL, and ids stay
    unique: they come from the hot table's sequence and are kept by the move). Read-only but for the move back
    of a requeue (services.requeue_items)."""

    id = models.BigIntegerField(primary_key=True)
    queue_id = models.CharField(max_length=100)
    task = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=ItemState.choices)
    priority = models.SmallIntegerField(default=0)
    run_at = models.DateTimeField()
    visible_at = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    lease_timeout = models.FloatField(null=True, blank=True)
    dedup_key = models.CharField(max_length=200, null=True, blank=True)
    ordering_key = models.CharField(max_length=200, null=True, blank=True)
    group_key = models.CharField(max_length=200, null=True, blank=True)
    reservation_id = models.BigIntegerField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    workflow_step_id = models.BigIntegerField(null=True, blank=True)
    debounce_key = models.CharField(max_length=200, null=True, blank=True)
    debounce_until = models.DateTimeField(null=True, blank=True)
    absorbed = models.PositiveIntegerField(db_default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    trace_context = models.TextField(null=True, blank=True)  # as on the item (engine/tracing.py)

    class Meta:
        db_table = "queue_app_itemhistory"  # created by migration 0017 (partitioned), not from this model
        ordering = ["-id"]
        verbose_name = "archived item"
        verbose_name_plural = "item history"

    def __str__(self) -> str:
        return f"#{self.id} {self.task} ({self.state}, archived)"


class ReservationHistory(models.Model):
    """The reservations of an archived item, moved with it; partitioned by the item's finished time
    (`item_finished_at`), so a day's items and their attempts are dropped together."""

    id = models.BigIntegerField(primary_key=True)
    item_id = models.BigIntegerField()
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    reserved_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, null=True, blank=True)
    not_done_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    item_finished_at = models.DateTimeField()

    class Meta:
        db_table = "queue_app_reservationhistory"  # created by migration 0017 (partitioned)
        ordering = ["-id"]
        verbose_name = "archived reservation"
        verbose_name_plural = "reservation history"

    def __str__(self) -> str:
        return f"reservation {self.id} of archived item {self.item_id} (attempt {self.attempt})"
