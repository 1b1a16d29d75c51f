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


class Leader(models.Model):
    """Which process does a duty that spans transactions, until when (engine/leaders.py): the wake-up leader of a
    queue set, the one VACUUM or ANALYZE of the hot tables at a time. A row rather than a session advisory lock,
    which a transaction pooler would leave held by an idle server connection after its client is gone. The
    holder renews it with its heartbeat; past `expires_at` another process may take it over."""

    duty = models.CharField(primary_key=True, max_length=200)
    holder = models.CharField(max_length=200)
    taken_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        db_table = "queue_app_leader"
        ordering = ["duty"]

    def __str__(self) -> str:
        return f"{self.duty} ({self.holder})"


class HandoffOffer(models.Model):
    """One slot an idle worker offers to the next plain enqueue of its queues (engine/handoff.py): the enqueue
    takes it (deletes the row), writes its item reserved for `worker_id` and notifies `channel`, the worker's own.
    Valid while the session that inserted it holds the advisory lock (sql.HANDOFF_LOCK_NAMESPACE, `lock_key`): a
    worker gone leaves a row no enqueue takes, cleared by the next offer."""

    id = models.BigAutoField(primary_key=True)
    worker_id = models.CharField(max_length=200)
    channel = models.CharField(max_length=63)
    lock_key = models.IntegerField()
    queues = models.JSONField(null=True)  # the worker's queues; null: every queue
    terms = models.JSONField(default=dict)  # {task: [lease seconds or null, floor seconds]}
    offered_at = models.DateTimeField()

    class Meta:
        db_table = "queue_app_handoff"

    def __str__(self) -> str:
        return f"offer {self.id} of {self.worker_id}"
