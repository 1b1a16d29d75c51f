"""Schedules (cron expressions that enqueue a target) and their fires (scheduling.py)."""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class CatchUp(models.TextChoices):
    SKIP = "skip", "Skip missed fire times"
    ONCE = "once", "Latest only: fire once, for the latest missed fire time"
    ALL = "all", "All: fire every missed fire time (at most the latest 100)"


class TargetKind(models.TextChoices):
    TASK = "task", "Registered task"
    SPARK = "spark", "Spark job"
    WORKFLOW = "workflow", "Workflow"


class Schedule(models.Model):
    """A cron expression that enqueues a target (a task with a payload, or a Spark job with params)."""

    name = models.CharField(max_length=100, unique=True)
    cron = models.CharField(max_length=100, help_text="Five fields: minute hour day-of-month month day-of-week.")
    timezone = models.CharField(max_length=64, default="UTC")
    target_kind = models.CharField(max_length=10, choices=TargetKind.choices, default=TargetKind.TASK)
    target = models.CharField(max_length=200, help_text="Task name or Spark job name.")
    payload = models.JSONField(default=dict, blank=True, help_text="Task payload, or Spark job params.")
    enabled = models.BooleanField(default=True)
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.SKIP)
    dedup_window = models.FloatField(
        null=True, blank=True, help_text="Seconds; while an earlier fire's item holds the key, skip the fire."
    )
    last_fire_at = models.DateTimeField(null=True, blank=True)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]
        indexes = [models.Index("next_fire_at", name="schedule_due", condition=Q(enabled=True))]

    def __str__(self) -> str:
        return self.name


class ScheduleFire(models.Model):
    """One row per (schedule, fire time) that fired; its unique constraint is the exactly-once guarantee."""

    schedule = models.ForeignKey(Schedule, on_delete=models.DB_CASCADE, related_name="fires")
    fire_at = models.DateTimeField()
    manual = models.BooleanField(default=False)
    item_id = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["-fire_at"]
        constraints = [models.UniqueConstraint("schedule", "fire_at", name="schedulefire_once")]

    def __str__(self) -> str:
        return f"{self.schedule_id} @ {self.fire_at:%Y-%m-%d %H:%M}"
