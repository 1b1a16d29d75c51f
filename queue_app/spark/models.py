"""The Spark control plane's tables: runs, the Connect servers' health, the scripts registered from the admin,
the analytics pipeline's output and the incremental pipelines' watermarks.

The models of the Spark app (queue_app.spark, label jobsite_spark); imports only Django. Their tables were made by
the core's migrations when these models were the core's, and keep those names (`db_table`, queue_app_*):
queue_app 0047 and this app's 0001 moved the models' state only (SeparateDatabaseAndState).
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

APP_LABEL = "jobsite_spark"


class SparkRunState(models.TextChoices):
    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    CANCELLING = "cancelling"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"


SPARK_FINAL_STATES = (SparkRunState.SUCCEEDED, SparkRunState.FAILED, SparkRunState.CANCELLED, SparkRunState.TIMED_OUT)
SPARK_OPEN_STATES = tuple(s for s in SparkRunState if s not in SPARK_FINAL_STATES)


class SparkTrigger(models.TextChoices):
    DASHBOARD = "dashboard", "Dashboard"
    SCHEDULE = "schedule", "Schedule"
    ORM = "orm", "ORM"
    CLI = "cli", "CLI"
    WORKFLOW = "workflow", "Workflow"
    DATASET = "dataset", "Dataset update"  # a data-aware trigger (datasets/triggers.py) or `dataset materialize`


class SparkConnectServer(models.Model):
    """The health of one jobsite-supervised Spark Connect server (`manage.py spark_connect_server`), written by
    its supervisor: the Spark pages show it, and runs use the server only while it answers."""

    id = models.CharField(primary_key=True, max_length=300, help_text="host:port")
    url = models.CharField(max_length=200)
    master = models.CharField(max_length=200, blank=True, default="")
    host = models.CharField(max_length=255)
    pid = models.IntegerField(null=True, blank=True, help_text="The server's JVM (spark-submit) process.")
    healthy = models.BooleanField(default=False)
    restarts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_sparkconnectserver"
        verbose_name = "Spark Connect server"

    def __str__(self) -> str:
        return self.url


class SparkRun(models.Model):
    """One run of a registered Spark job, carried by one queue item on the `spark` queue."""

    id = models.BigAutoField(primary_key=True)
    job = models.CharField(max_length=100)
    params = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=12, choices=SparkRunState.choices, default=SparkRunState.QUEUED)
    trigger = models.CharField(max_length=12, choices=SparkTrigger.choices, default=SparkTrigger.ORM)
    requested_by = models.CharField(max_length=150, blank=True, default="")
    item_id = models.BigIntegerField(null=True, blank=True, help_text="The queue item that carries the run.")
    attempt = models.PositiveIntegerField(default=0)
    app_id = models.CharField(max_length=100, blank=True, default="")
    ui_url = models.CharField(max_length=200, blank=True, default="")
    # Where the current attempt's spark-submit process group lives: a re-delivered run kills it first.
    driver_host = models.CharField(max_length=255, blank=True, default="")
    driver_pgid = models.IntegerField(null=True, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    log_tail = models.TextField(blank=True, default="")
    metrics = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    timeout = models.FloatField(null=True, blank=True, help_text="Seconds before the run is stopped (timed_out).")
    queued_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    # When each step of the last attempt happened, epoch seconds (spark/runs.py, TIMING_STEPS): leased, launched,
    # driver_up, first_task, last_task, ended, recorded.
    timings = models.JSONField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_sparkrun"
        ordering = ["-id"]
        permissions = [
            ("trigger_sparkrun", "Can trigger Spark runs"),
            ("cancel_sparkrun", "Can cancel Spark runs"),
        ]
        indexes = [
            models.Index("job", models.F("id").desc(), name="sparkrun_job"),
            models.Index("state", name="sparkrun_state"),
            # Cancelling queue items finds their open runs (services.cancel_items).
            models.Index(fields=["item_id"], name="sparkrun_open_item", condition=Q(state__in=SPARK_OPEN_STATES)),
        ]

    def __str__(self) -> str:
        return f"{self.job} run #{self.id} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in SPARK_FINAL_STATES


class QueueStatsHourly(models.Model):
    """Per queue, task and hour: what the queue-analytics Spark pipeline computed (seconds for times)."""

    pk = models.CompositePrimaryKey("queue", "task", "hour")
    queue = models.CharField(max_length=100)
    task = models.CharField(max_length=200)
    hour = models.DateTimeField()
    processed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    dead = models.BigIntegerField(default=0)
    retries = models.BigIntegerField(default=0)
    wait_p50 = models.FloatField(null=True)
    wait_p95 = models.FloatField(null=True)
    wait_p99 = models.FloatField(null=True)
    run_p50 = models.FloatField(null=True)
    run_p95 = models.FloatField(null=True)
    run_p99 = models.FloatField(null=True)
    computed_at = models.DateTimeField(db_default=Now())
    run_id = models.BigIntegerField(null=True)
    # The as-of time of an incremental run (attempts settled before it); NULL for a fixed-window run.
    as_of = models.DateTimeField(null=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_queuestats_hourly"
        ordering = ["-hour"]
        indexes = [models.Index("hour", name="queuestats_hourly_hour")]

    def __str__(self) -> str:
        return f"{self.queue}/{self.task} {self.hour:%Y-%m-%d %H}:00"


class SparkScript(models.Model):
    """An existing PySpark application registered from the admin (queue_app/spark/scripts.py): spark-submit runs
    the file at `path` unmodified, with `args` rendered from the run's params. Paths must lie under the allowed
    script roots; that is checked when saved and again when a run is triggered and launched."""

    name = models.SlugField(max_length=100, unique=True, help_text="The job name runs are triggered by.")
    description = models.CharField(max_length=300, blank=True, default="")
    enabled = models.BooleanField(default=True)
    path = models.CharField(max_length=1000, help_text="A .py file, or a dotted module name, under an allowed root.")
    py_files = models.JSONField(default=list, blank=True, help_text='--py-files, a JSON list: ["/srv/jobs/lib.zip"].')
    args = models.JSONField(default=list, blank=True, help_text='Argument template: a JSON list; "{name}" = a param.')
    params = models.JSONField(
        default=list, blank=True, help_text='Declared params: [{"name": "input", "type": "path", "required": true}].'
    )
    conf = models.JSONField(default=dict, blank=True, help_text='Spark conf: {"spark.sql.shuffle.partitions": "8"}.')
    env = models.JSONField(default=dict, blank=True, help_text="Environment variables for the run.")
    driver_memory = models.CharField(max_length=12, blank=True, default="", help_text="e.g. 1g")
    executor_memory = models.CharField(max_length=12, blank=True, default="", help_text="e.g. 2g")
    driver_cores = models.PositiveSmallIntegerField(null=True, blank=True)
    executor_cores = models.PositiveSmallIntegerField(null=True, blank=True)
    policy = models.JSONField(
        default=dict,
        blank=True,
        help_text='Run policy: {"max_concurrent": 1, "attempts": 3, "retry_on": ["failed"], "timeout": 600, '
        '"resource_profile": "small", "priority": 0, "keep_days": 30}.',
    )
    produces = models.JSONField(
        default=dict,
        blank=True,
        help_text='Datasets it writes: {"daily_revenue": "day"} (the param naming the partition) or ["rollup"].',
    )
    consumes = models.JSONField(
        default=dict, blank=True, help_text='Datasets it reads: ["events"] or {"events": "day"}.'
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_sparkscript"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class SparkWatermark(models.Model):
    """How far an incremental Spark pipeline got: advanced in the transaction that marks its run succeeded, never
    moved back (a re-run of an older window leaves it). `value` is the pipeline's own position (queue_analytics:
    the lowest reservation id not settled as of `as_of`; everything before it is counted)."""

    name = models.CharField(max_length=200, primary_key=True)
    value = models.BigIntegerField()
    as_of = models.DateTimeField()
    run_id = models.BigIntegerField(null=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_sparkwatermark"

    def __str__(self) -> str:
        return f"{self.name} @ {self.value} ({self.as_of:%Y-%m-%d %H:%M:%S})"
