"""The datasets' tables: one row per known dataset (a snapshot of its declaration) and one per materialization.

The models of the datasets app (queue_app.datasets, label jobsite_datasets); imports only Django. Their tables were
made by the core's migrations (queue_app 0022_datasets and later) when these models were the core's, and keep
those names (`db_table`, queue_app_*): queue_app 0047 and this app's 0001 moved the models' state only
(SeparateDatabaseAndState; content types relabelled, so granted permissions stay).

A materialization names its dataset, run, step and item by plain value, not by foreign key (like the history
tables and ExecutionLog): it is written in the transaction that settles a run or step, where a foreign key would
take a share lock on the dataset row and its run for every write, and it must outlive pruned runs and items.
"""

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

APP_LABEL = "jobsite_datasets"


class DeclaredIn(models.TextChoices):
    CODE = "code"
    SETTINGS = "settings"
    ADMIN = "admin"


class MaterializationSource(models.TextChoices):
    SPARK_RUN = "spark_run"
    WORKFLOW_STEP = "workflow_step"
    ITEM = "item"
    OBSERVED = "observed"  # data written outside jobsite (`dataset observe`)
    CODE = "code"  # record_materialization() called with no run, step or item


class CheckState(models.TextChoices):
    """A materialization's checks (datasets/checks_run.py). Usable (its consumers may run): none, passed, warned,
    overridden; pending (blocking checks not yet all run) and failed (a blocking check failed) hold them."""

    NONE = "none"  # no checks, or only non-blocking ones not yet all run
    PENDING = "pending"
    PASSED = "passed"
    WARNED = "warned"  # every blocking check passed; a non-blocking one failed
    FAILED = "failed"
    OVERRIDDEN = "overridden"  # failed, then overridden by someone with the permission (a LogEntry says who)


USABLE_CHECK_STATES = (CheckState.NONE, CheckState.PASSED, CheckState.WARNED, CheckState.OVERRIDDEN)


class Dataset(models.Model):
    """A dataset jobsite knows, with the declaration it was last synced from (sync.py)."""

    name = models.CharField(primary_key=True, max_length=200)
    config = models.JSONField(default=dict, help_text="the declaration: location, partitioning, owner, ...")
    declared_in = models.CharField(max_length=10, choices=DeclaredIn.choices)
    synced_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_dataset"
        permissions = [("observe_dataset", "Can observe a dataset's partition (record files written elsewhere)")]

    def __str__(self) -> str:
        return self.name


class Materialization(models.Model):
    """One partition of a dataset written (or observed) once, with the figures known about it. Partition keys
    are canonical text (partitions.py): "" for an unpartitioned dataset."""

    id = models.BigAutoField(primary_key=True)
    dataset = models.CharField(max_length=200)
    partition = models.CharField(max_length=200, blank=True, default="")
    at = models.DateTimeField(db_default=Now())
    rows = models.BigIntegerField(null=True, blank=True)
    bytes = models.BigIntegerField(null=True, blank=True)
    files = models.BigIntegerField(null=True, blank=True)
    schema_fingerprint = models.CharField(max_length=64, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    source = models.CharField(max_length=20, choices=MaterializationSource.choices)
    spark_run_id = models.BigIntegerField(null=True, blank=True)
    workflow_step_id = models.BigIntegerField(null=True, blank=True)
    item_id = models.BigIntegerField(null=True, blank=True)
    checks = models.CharField(
        max_length=10, choices=CheckState.choices, default=CheckState.NONE, db_default=CheckState.NONE
    )

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_materialization"
        ordering = ["-at", "-id"]
        indexes = [
            # The latest materialization of a (dataset, partition), and a dataset's partitions in a key range.
            models.Index("dataset", "partition", models.F("at").desc(), name="materialization_partition"),
            # A dataset's newest materializations (last materialized, history newest first).
            models.Index("dataset", models.F("at").desc(), models.F("id").desc(), name="materialization_latest"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(rows__gte=0) & Q(bytes__gte=0) & Q(files__gte=0), name="materialization_figures"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.dataset}[{self.partition}] at {self.at}"


class DatasetCheckResult(models.Model):
    """One check of one materialization: written `pending` (passed null) with the materialization, settled once by
    the check's item (datasets/checks_run.py). Named by value, like the materialization."""

    id = models.BigAutoField(primary_key=True)
    materialization_id = models.BigIntegerField()
    dataset = models.CharField(max_length=200)
    partition = models.CharField(max_length=200, blank=True, default="")
    check_name = models.CharField(max_length=200)
    severity = models.CharField(max_length=5, choices=[("warn", "warn"), ("error", "error")])
    blocking = models.BooleanField()
    passed = models.BooleanField(null=True, blank=True, help_text="empty while the check has not run")
    figures = models.JSONField(default=dict, blank=True)
    message = models.TextField(blank=True, default="")
    at = models.DateTimeField(null=True, blank=True, help_text="when the result was stored")

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_datasetcheckresult"
        ordering = ["-id"]
        constraints = [models.UniqueConstraint(fields=["materialization_id", "check_name"], name="check_result_once")]
        indexes = [models.Index("dataset", models.F("id").desc(), name="check_result_dataset")]
        permissions = [("override_dataset_check", "Can override a dataset's failed blocking checks")]

    def __str__(self) -> str:
        state = "pending" if self.passed is None else ("passed" if self.passed else "failed")
        return f"{self.dataset}[{self.partition}] {self.check_name}: {state}"


class DatasetBlock(models.Model):
    """A queue item (a Spark run's, a workflow's Spark step's) parked because a partition it reads is not usable:
    its latest materialization's blocking checks failed or still run. Written with the item's release (the
    attempt not spent) by the run's handler; deleted, and the item made due, by the transaction that makes a
    materialization of the partition usable (datasets/checks_run.py)."""

    id = models.BigAutoField(primary_key=True)
    item_id = models.BigIntegerField()
    spark_run_id = models.BigIntegerField(null=True, blank=True)
    dataset = models.CharField(max_length=200)
    partition = models.CharField(max_length=200, blank=True, default="")
    materialization_id = models.BigIntegerField()
    reason = models.TextField()
    since = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_datasetblock"
        constraints = [models.UniqueConstraint(fields=["item_id", "dataset", "partition"], name="dataset_block_once")]
        indexes = [models.Index("dataset", "partition", name="dataset_block_partition")]

    def __str__(self) -> str:
        return f"item {self.item_id} blocked by {self.dataset}[{self.partition}]"


class StaleEpisode(models.Model):
    """One staleness episode of a dataset: it went past its freshness policy at `overdue_since` (freshness.py's
    overdue_since, the same instant for as long as the episode lasts). Written once, by the check that publishes
    the `dataset.stale` event in the same transaction (stale.py): the unique key makes it once per episode."""

    id = models.BigAutoField(primary_key=True)
    dataset = models.CharField(max_length=200)
    overdue_since = models.DateTimeField()
    detected_at = models.DateTimeField(db_default=Now())
    # trigger_producer_when_stale: the partition the episode started its producer for, what it started, an error
    partition = models.CharField(max_length=200, null=True, blank=True, help_text="empty: no producer started")
    started = models.JSONField(default=list, blank=True, help_text='what it started: ["spark_run:12"]')
    error = models.TextField(blank=True, default="")

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_staleepisode"
        constraints = [models.UniqueConstraint(fields=["dataset", "overdue_since"], name="stale_episode_once")]

    def __str__(self) -> str:
        return f"{self.dataset} stale since {self.overdue_since}"


class OpenLineageCounter(models.Model):
    """A monotonic counter of the OpenLineage emitter (datasets/openlineage.py), shared by every process: the
    events dropped because the transport failed or the emitter's queue was full. /metrics exports it
    (jobsite_openlineage_events_dropped_total). Written only when an event is dropped."""

    name = models.CharField(primary_key=True, max_length=50)
    value = models.BigIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_openlineagecounter"

    def __str__(self) -> str:
        return f"{self.name} {self.value}"


class TriggerState(models.Model):
    """Where a data-aware trigger stands for one (consumer, partition) (triggers.py): the upstream
    materializations seen and those pending since its last run, and its debounce timer. Every recorder of an
    upstream of the pair upserts this row first, so its row lock orders concurrent recorders: the second committer
    waits for the first and then sees its pending upstreams."""

    id = models.BigAutoField(primary_key=True)
    consumer = models.CharField(max_length=250, help_text="kind:name, e.g. spark:daily_report")
    partition = models.CharField(max_length=200, blank=True, default="")
    pending = models.JSONField(default=dict, blank=True, help_text="{dataset: materialization id} since its last run")
    seen = models.JSONField(default=dict, blank=True, help_text="{dataset: newest materialization id counted}")
    due_at = models.DateTimeField(null=True, blank=True, help_text="debounced: when the pending run starts")
    timer_item_id = models.BigIntegerField(null=True, blank=True, help_text="debounced: the delayed queue item")
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_triggerstate"
        constraints = [models.UniqueConstraint(fields=["consumer", "partition"], name="trigger_state_once")]

    def __str__(self) -> str:
        return f"{self.consumer}[{self.partition}]"


class TriggerFire(models.Model):
    """One run of a consumer started by its upstreams' materializations: unique per (consumer, partition, set of
    upstream materialization ids), so a set starts its consumer once whoever records it."""

    id = models.BigAutoField(primary_key=True)
    consumer = models.CharField(max_length=250)
    partition = models.CharField(max_length=200, blank=True, default="")
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the upstream materialization ids")
    upstream = models.JSONField(default=dict, help_text="{dataset: materialization id}")
    started = models.JSONField(default=list, blank=True, help_text='what it started: ["spark_run:12"]')
    error = models.TextField(blank=True, default="")
    at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_triggerfire"
        ordering = ["-at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["consumer", "partition", "fingerprint"], name="trigger_fire_once")
        ]

    def __str__(self) -> str:
        return f"{self.consumer}[{self.partition}] at {self.at}"


class DynamicPartitionKey(models.Model):
    """One key of a dynamic partition set (partitions.DynamicPartitions), from its addition to its removal
    (datasets/dynamic.py). A removed key keeps its row (removed_at set) and its materializations; adding it again
    writes a new row. At most one current row per (set, key)."""

    id = models.BigAutoField(primary_key=True)
    partition_set = models.CharField(max_length=100)
    key = models.CharField(max_length=100)
    added_at = models.DateTimeField(db_default=Now())
    added_by = models.CharField(
        max_length=150, blank=True, default="", help_text="code, cli:USER, watch:NAME, admin:USER"
    )
    removed_at = models.DateTimeField(null=True, blank=True)
    removed_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_dynamicpartitionkey"
        ordering = ["partition_set", "key", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["partition_set", "key"], condition=Q(removed_at__isnull=True), name="dynamic_key_current"
            )
        ]
        permissions = [("change_dynamic_partitions", "Can add and remove a dynamic partition set's keys")]

    def __str__(self) -> str:
        return f"{self.partition_set}[{self.key}]"
