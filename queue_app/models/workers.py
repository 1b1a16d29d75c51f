"""The workers (run_worker processes), as each writes its own row and heartbeat."""

from django.db import models


class WorkerState(models.TextChoices):
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Worker(models.Model):
    id = models.CharField(primary_key=True, max_length=200)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    state = models.CharField(max_length=10, choices=WorkerState.choices, default=WorkerState.RUNNING)
    stats = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-last_heartbeat"]

    def __str__(self) -> str:
        return self.id
