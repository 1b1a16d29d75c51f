"""Workflow tables: a Workflow (one run of a registered graph), its steps (one row per step and attempt of the
workflow) and the edges between steps.

These rows are the whole of a workflow's state; no process holds any of it. A step's `pending` counts its
dependencies that have not finished; the triggers on queue items (queue_app/workflows/sql.py) decrement it in the
transaction that settles a dependency's item, and enqueue the step's item when it reaches zero. A repair is a
new attempt: new step rows, the earlier attempt's rows are left as they were.
"""

from django.db import models
from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Now

from ..conf import queue_settings

# The models of the workflows app (label jobsite_workflows); their tables keep the names the core's migrations gave
# them (queue_app_*, `db_table`): queue_app 0047 and this app's 0001 moved the models' state only.
APP_LABEL = "jobsite_workflows"


class WorkflowState(models.TextChoices):
    RUNNING = "running"
    FAILING = "failing"  # a step failed: what had not started is cancelled, running steps finish
    COMPENSATING = "compensating"  # the compensations of the completed steps run
    CANCELLING = "cancelling"  # cancel asked: running steps are being stopped
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


WORKFLOW_FINAL_STATES = (WorkflowState.SUCCEEDED, WorkflowState.FAILED, WorkflowState.CANCELLED)
WORKFLOW_OPEN_STATES = tuple(s for s in WorkflowState if s not in WORKFLOW_FINAL_STATES)


class WorkflowKind(models.TextChoices):
    WORKFLOW = "workflow"
    BACKFILL = "backfill"
    BATCH = "batch"


def default_max_attempts() -> int:
    """The JOBSITE DEFAULT_MAX_ATTEMPTS setting now (a workflow's copy of it, taken when it starts)."""
    return int(queue_settings.DEFAULT_MAX_ATTEMPTS)


class Workflow(models.Model):
    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=10, choices=WorkflowKind.choices, default=WorkflowKind.WORKFLOW)
    params = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=12, choices=WorkflowState.choices, default=WorkflowState.RUNNING)
    attempt = models.PositiveIntegerField(default=1)
    started_by = models.CharField(max_length=150, blank=True, default="")
    # Of the current attempt, kept by the trigger under this row's lock (the workflow's mutex).
    steps_total = models.PositiveIntegerField(default=0)
    steps_open = models.PositiveIntegerField(default=0)
    steps_failed = models.PositiveIntegerField(default=0)
    # Item specs ({"task", "queue", "max_attempts", "payload"}) the trigger enqueues: "finished" always when the
    # workflow ends, "dead" when its first step fails, "done" when it succeeds.
    callbacks = models.JSONField(default=dict, blank=True)
    channel = models.CharField(max_length=63, default="jobsite_queue")  # NOTIFY channel of the step items
    # The attempts of an item it makes whose task and queue name none (workflows/sql.py, _items_from_specs): the
    # setting as it was when the workflow started or was last repaired. The settle trigger, which enqueues most
    # steps, cannot read Django's settings; it reads this, as it reads `channel`.
    default_max_attempts = models.PositiveIntegerField(default=default_max_attempts)
    # The traceparent of the workflow's start span when tracing is on (engine/tracing.py): every step item the
    # workflow's SQL writes carries it, so a workflow is one trace. NULL with tracing off.
    trace_context = models.TextField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    finished_at = models.DateTimeField(null=True, blank=True)
    # The version of its definition the current attempt runs (declared, else its graph's fingerprint: a
    # WorkflowVersion row of this name holds that graph's shape). Empty for backfills and batches.
    version = models.CharField(max_length=100, blank=True, default="")
    # A fork (services.fork): the finished workflow it was forked from, and the step it re-ran from.
    forked_from = models.BigIntegerField(null=True, blank=True)
    fork_step = models.CharField(max_length=200, blank=True, default="")
    # Its deadline as declared ({"seconds": S} from its start, or {"at": ISO time}) and as armed for the current
    # attempt (workflows/deadlines.py): a delayed item of queue_app.workflow_deadline is due then.
    deadline = models.JSONField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_workflow"
        ordering = ["-id"]
        permissions = [
            ("start_workflow", "Can start workflows and backfills"),
            ("cancel_workflow", "Can cancel workflows"),
            ("repair_workflow", "Can repair workflows"),
        ]
        indexes = [
            models.Index("name", models.F("id").desc(), name="workflow_name"),
            models.Index("state", name="workflow_state"),
        ]

    def __str__(self) -> str:
        return f"{self.name} #{self.id} ({self.state})"

    @property
    def is_final(self) -> bool:
        return self.state in WORKFLOW_FINAL_STATES


class WorkflowStartKey(models.Model):
    """The idempotency key of a start (`services.start(name, key=...)`): its primary key (name, key) is the claim,
    taken by one INSERT .. ON CONFLICT in the transaction that writes the workflow (workflows/sql.py,
    WORKFLOW_CLAIM_KEY), so of concurrent starters with one key exactly one writes a workflow and the others get
    it. The key is held for the workflow's lifetime (while its row exists), or until `expires_at` when the start
    named a window; then the next start with it takes it over."""

    pk = models.CompositePrimaryKey("name", "key")
    name = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    workflow_id = models.BigIntegerField()
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_workflowstartkey"
        indexes = [models.Index("workflow_id", name="workflowstartkey_workflow")]  # freed with its workflow

    def __str__(self) -> str:
        return f"{self.name} {self.key!r} -> {self.workflow_id}"


class WorkflowVersion(models.Model):
    """The shape of one version of a definition (workflows/versions.py): per step its kind, target, dependencies,
    failure policy and compensation, as the first run of that version built it. Written once per (name,
    version) by INSERT .. ON CONFLICT DO NOTHING when a run starts; what the admin's version difference reads."""

    pk = models.CompositePrimaryKey("name", "version")
    name = models.CharField(max_length=200)
    version = models.CharField(max_length=100)
    fingerprint = models.CharField(max_length=64)
    shape = models.JSONField(default=dict)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_workflowversion"
        ordering = ["name", "created_at"]

    def __str__(self) -> str:
        return f"{self.name} {self.version}"


class StepKind(models.TextChoices):
    TASK = "task"
    SPARK = "spark"
    COMPENSATION = "compensation"
    SLEEP = "sleep"  # its item is a delayed no-op item: the step ends when a worker leases it, once due
    EVENT = "event"  # waits for an event (workflows/waits.py); its item is the delayed timeout
    APPROVAL = "approval"  # waits for a human decision (workflows/approvals.py); its item is the delayed timeout
    WORKFLOW = "workflow"  # a sub-workflow (workflows/children.py): waits for its child; its item is the wait


class StepState(models.TextChoices):
    WAITING = "waiting"  # dependencies not finished
    QUEUED = "queued"  # its item (or Spark run) is enqueued or running
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"  # its run_if was not met, or a branch did not choose it (workflows/sql.py, decide)


STEP_OPEN_STATES = (StepState.WAITING, StepState.QUEUED)


class OnFailure(models.TextChoices):
    FAIL = "fail", "Fail the workflow and cancel what has not started"
    CONTINUE = "continue", "Continue: its dependents run anyway"


def _step_link() -> models.ForeignKey:
    """A link to another step of the same workflow, written by the statement that writes the step, never looked
    up by (no index) and never dangling (steps go only with their workflow): no constraint, whose check at
    commit cost more than a quarter of a fan-out's time (queue_bench's workflow part)."""
    return models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )


class WorkflowStep(models.Model):
    id = models.BigAutoField(primary_key=True)
    # Looked up by workflow through the unique index workflowstep_name (workflow, attempt, name). Written only
    # under the workflow's row lock (start, fan-out, repair), so never dangling: no constraint, whose check of each
    # row at commit was a third of a 10,000-step fan-out's time. The steps and their edges go with their workflow
    # through the statement trigger workflow_deleted (queue_app/workflows/sql.py), as the constraint's cascade did.
    workflow = models.ForeignKey(
        Workflow, on_delete=models.DO_NOTHING, related_name="steps", db_constraint=False, db_index=False
    )
    attempt = models.PositiveIntegerField()
    name = models.CharField(max_length=200)
    group = models.CharField(max_length=200, help_text="Sibling name: the steps of one fan-out share it.")
    kind = models.CharField(max_length=12, choices=StepKind.choices)
    target = models.CharField(max_length=200, help_text="Task name or Spark job name.")
    args = models.JSONField(null=True, blank=True)
    # The item to enqueue when ready: {"task", "queue", "max_attempts", "priority", "lease_timeout", "payload"};
    # for a Spark step {"job", "params", "timeout", ...} and the item of its run.
    spec = models.JSONField(default=dict)
    on_failure = models.CharField(max_length=10, choices=OnFailure.choices, default=OnFailure.FAIL)
    compensate = models.JSONField(null=True, blank=True, help_text="Item spec of the compensation task.")
    compensates = _step_link()
    parent = _step_link()  # the step whose fan-out added this one
    kept = models.BooleanField(default=False, help_text="Succeeded in an earlier attempt; kept by a repair.")
    state = models.CharField(max_length=10, choices=StepState.choices, default=StepState.WAITING)
    pending = models.PositiveIntegerField(default=0, help_text="Dependencies not finished yet.")
    item_id = models.BigIntegerField(null=True, blank=True)
    spark_run_id = models.BigIntegerField(null=True, blank=True)
    # A sub-workflow step's child (workflows/children.py): set by its start, in the transaction that starts (or
    # finds) the child; the child's end settles the item of every open step naming it (workflows/sql.py).
    child_workflow_id = models.BigIntegerField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    ready_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_workflowstep"
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint("workflow", "attempt", "name", name="workflowstep_name"),
        ]
        indexes = [
            models.Index(fields=["item_id"], name="workflowstep_item", condition=Q(item_id__isnull=False)),
            models.Index(
                fields=["child_workflow_id"], name="workflowstep_child", condition=Q(child_workflow_id__isnull=False)
            ),
            # The event waits open now, by event name and key: what an event sent looks up (workflows/sql.py).
            models.Index(
                KT("spec__event"), KT("spec__key"), name="workflowstep_event", condition=Q(kind="event", state="queued")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class StepDependency(models.Model):
    """`downstream` waits for `upstream`."""

    # Both ends are steps of one workflow, written with the edge: no constraints (each would add a check per edge
    # at commit); the trigger workflow_deleted removes the edges with their workflow's steps. The primary key
    # serves lookups by upstream, the index stepdependency_downstream those by downstream.
    pk = models.CompositePrimaryKey("upstream_id", "downstream_id")
    upstream = models.ForeignKey(
        WorkflowStep, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False, db_index=False
    )
    downstream = models.ForeignKey(
        WorkflowStep, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False, db_index=False
    )
    # Ordering only (a backfill's lanes keep at most K partitions running): counted for readiness like any
    # edge, but a repair does not treat the later partitions as downstream of a failed one.
    order_only = models.BooleanField(default=False, db_default=False)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_stepdependency"
        indexes = [models.Index("downstream", name="stepdependency_downstream")]

    def __str__(self) -> str:
        return f"{self.upstream_id} -> {self.downstream_id}"


class WorkflowEvent(models.Model):
    """An event sent to workflows (workflows/waits.py, send_event): matched to at most one event wait, in the
    statement that stores it (a step waiting for its name and key now) or in the one that creates the wait (an
    event kept from before, until `expires_at`: its lookback). `step_id` is the claim: unique, set once."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200)
    key = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    expires_at = models.DateTimeField(help_text="End of its lookback: not matched to a wait created after it.")
    step_id = models.BigIntegerField(null=True, blank=True, help_text="The event wait it ended.")
    claimed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = APP_LABEL
        db_table = "queue_app_workflowevent"
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(fields=["step_id"], name="workflowevent_step", condition=Q(step_id__isnull=False))
        ]
        indexes = [models.Index("name", "key", "id", name="workflowevent_open", condition=Q(step_id__isnull=True))]

    def __str__(self) -> str:
        return f"{self.name} {self.key!r} #{self.id}"
