"""The queue's tables: Queue, QueueItem (an item's states), Reservation (one attempt), DeadLetter, DedupClaim,
IdMark.

Rows are written by the engine (queue_app/engine/, plain SQL on the hot path) and by services.py; the models
give the admin and the ORM a typed view, and the migrations carry the indexes the hot path needs.
"""

from datetime import timedelta

from django.db import models
from django.db.models import Case, F, Func, Q, When


class ItemState(models.TextChoices):
    READY = "ready"
    RESERVED = "reserved"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"


class Outcome(models.TextChoices):
    """How one attempt (reservation) ended."""

    DONE = "done"
    RETRY = "retry"  # failed, item went back to ready with backoff
    DEAD = "dead"  # failed for the last time, or poison
    EXPIRED = "expired"  # lease ran out (worker died or hung); the item was taken again or rescued
    RELEASED = "released"  # handed back without spending the attempt
    CANCELLED = "cancelled"  # the item was cancelled while reserved
    TIMED_OUT = "timed_out"  # handler stopped at its hard timeout, then retried or dead


class Queue(models.Model):
    name = models.CharField(primary_key=True, max_length=100)
    paused = models.BooleanField(default=False)
    concurrency_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most items in flight at once across all workers; empty = no limit."
    )
    # Flow control (queue_app/flow.py): a queue with any of these is leased under its row lock, one queue at a
    # time, so many workers on many hosts keep the limits together.
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most leases (starts) per rate period across all workers; empty = no limit."
    )
    rate_period = models.PositiveIntegerField(
        null=True, blank=True, help_text="Seconds per rate-limit window (windows are aligned to the clock)."
    )
    group_concurrency = models.PositiveIntegerField(
        null=True, blank=True, help_text="Most items of one group key in flight at once; empty = no limit."
    )
    fair = models.BooleanField(
        default=False, db_default=False, help_text="Lease the group keys in turn (implied by a group limit)."
    )
    group_weights = models.JSONField(
        null=True, blank=True, help_text='Turns per round for some group keys, e.g. {"big-customer": 3}; others 1.'
    )
    # The rate limit's current window (its start) and the leases counted in it, written by the lease under the
    # queue's row lock (sql.SPEND_RATE).
    rate_window_start = models.DateTimeField(null=True, blank=True, editable=False)
    rate_window_count = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # Priority aging (docs/how-to/flow-control.md): a ready item's effective priority rises by this many points per
    # second it has been due, so the lease orders by due time less priority / rate (sql.LEASE_AGED). Empty = off.
    aging_rate = models.FloatField(
        null=True,
        blank=True,
        help_text="Priority points per second a due item gains while it waits; empty = no aging.",
    )
    lease_timeout = models.FloatField(default=60.0, help_text="Default visibility timeout in seconds.")
    max_attempts = models.PositiveIntegerField(default=5)
    retention = models.DurationField(
        default=timedelta(days=7), help_text="How long done items are kept before pruning."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        permissions = [("pause_queue", "Can pause and resume queues")]
        constraints = [
            models.CheckConstraint(
                condition=Q(rate_limit__isnull=True, rate_period__isnull=True)
                | Q(rate_limit__gte=1, rate_period__gte=1),
                name="queue_rate_limit_and_period",
            ),
            models.CheckConstraint(
                condition=Q(group_concurrency__isnull=True) | Q(group_concurrency__gte=1),
                name="queue_group_concurrency_positive",
            ),
            models.CheckConstraint(
                condition=Q(aging_rate__isnull=True) | Q(aging_rate__gt=0), name="queue_aging_rate_positive"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class TransactionNow(Func):
    """now(): the start of the current transaction, the clock every engine statement stamps items with (Django's
    Now() is the statement's). Rows of one enqueue share it, and an item queued in a transaction is due to a
    lease in the same transaction."""

    template = "now()"
    output_field = models.DateTimeField()


# Where an item is finished: the states the history indexes cover. Every enqueue writes a ready row and every
# lease a reserved one, so an index on open rows costs each of those one more entry; history indexes are written
# once per item, when it finishes. NOT_DONE_STATES are the finished states the hot path never writes (an item is
# done by the settle of almost every lease): item_task_not_done covers those only, so a done settle writes one
# history entry (item_history), not two.
OPEN_STATES = ("ready", "reserved")
HISTORY_STATES = ("done", "dead", "cancelled")
HISTORY_STATES_SQL = ", ".join(f"'{state}'" for state in HISTORY_STATES)  # for raw SQL: state IN (...)
NOT_DONE_STATES = ("dead", "cancelled")
NOT_DONE_STATES_SQL = ", ".join(f"'{state}'" for state in NOT_DONE_STATES)


class QueueItem(models.Model):
    id = models.BigAutoField(primary_key=True)
    # No foreign-key constraint in the database: its deferred check (a trigger event per inserted row) was ~30% of
    # a bulk enqueue. The triggers of migration 0008 keep the same rule once per statement: an item names an
    # existing queue (locked FOR KEY SHARE until commit, as the constraint did), and a queue with items cannot be
    # deleted or renamed. No index of its own: item_fetch and item_history serve every lookup by queue.
    queue = models.ForeignKey(
        Queue, on_delete=models.DO_NOTHING, related_name="items", db_constraint=False, db_index=False
    )
    task = models.CharField(max_length=200)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=ItemState.choices, default=ItemState.READY)
    priority = models.SmallIntegerField(default=0, help_text="-100..100, higher first.")
    run_at = models.DateTimeField(
        db_default=TransactionNow(), help_text="When the item is due (as enqueued, or after backoff)."
    )
    # SQS's visibility: when a worker may take the item. Equals run_at while ready and the lease deadline
    # while reserved, so one ordered partial index serves both "due" and "lease expired".
    visible_at = models.DateTimeField(db_default=TransactionNow())
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=5)
    lease_timeout = models.FloatField(null=True, blank=True, help_text="Per-item lease, seconds.")
    dedup_key = models.CharField(max_length=200, null=True, blank=True)
    ordering_key = models.CharField(max_length=200, null=True, blank=True)
    # A tenant or customer id: a fair queue leases its keys in turn, a group limit caps each key's items in flight.
    # '' is the group of the items queued without a key in such a queue (see flow.py).
    group_key = models.CharField(max_length=200, null=True, blank=True)
    # The fencing token (the current or last reservation). Not indexed: nothing looks an item up by it, and an
    # index here was one more write on every lease and settle.
    reservation = models.ForeignKey(
        "Reservation",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        related_name="+",
        db_constraint=False,
        db_index=False,
    )
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="", help_text="Summary of the last error.")
    # The workflow step this item carries (queue_app.workflows); NULL for every other item. The settle trigger's
    # WHEN tests it, so a plain item's settle never calls the trigger's function. Not indexed (steps name items).
    workflow_step_id = models.BigIntegerField(null=True, blank=True)
    # Debounce (sql.ENQUEUE_DEBOUNCE): the key whose enqueues collapse into this item while it is ready, the latest
    # due time they may push it to (the maximum wait; NULL: none), and how many enqueues it absorbed.
    debounce_key = models.CharField(max_length=200, null=True, blank=True)
    debounce_until = models.DateTimeField(null=True, blank=True)
    absorbed = models.PositiveIntegerField(
        db_default=0, help_text="Enqueues of its debounce key this item absorbed (their payloads replaced its own)."
    )
    created_at = models.DateTimeField(db_default=TransactionNow())
    updated_at = models.DateTimeField(db_default=TransactionNow())
    finished_at = models.DateTimeField(null=True, blank=True)
    # The W3C trace context (a `traceparent`) of the span that enqueued the item, when tracing is on
    # (engine/tracing.py): each attempt's consumer span is its child. NULL with tracing off (nothing written).
    trace_context = models.TextField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        permissions = [
            ("requeue_queueitem", "Can requeue items and dead letters"),
            ("cancel_queueitem", "Can cancel items"),
        ]
        indexes = [
            # The fetch: only rows a worker may take, in the order it takes them.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "visible_at",
                "id",
                name="item_fetch",
                condition=Q(state__in=list(OPEN_STATES)),
            ),
            # Ordering keys: "is an older item of my key still open?"
            models.Index(
                "queue",
                "ordering_key",
                "id",
                name="item_ordering_open",
                condition=Q(state__in=list(OPEN_STATES), ordering_key__isnull=False),
            ),
            # Finished items: depth of done/dead/cancelled per queue, pruning by age, the dead-letter purge, the
            # admin's state filter. Open items are counted and listed through item_fetch and the primary key.
            models.Index(
                "state", "queue", "finished_at", name="item_history", condition=Q(state__in=list(HISTORY_STATES))
            ),
            # Task names for the admin's filter (a skip scan) and dead or cancelled items of one task. Not done ones:
            # each would cost the done settle one more entry (one of the eight an item's lease and settle write;
            # migration 0053 says what it cost), and done items leave this table for itemhistory_task a minute
            # after they finish (engine/history.py).
            models.Index("task", "state", name="item_task_not_done", condition=Q(state__in=list(NOT_DONE_STATES))),
            models.Index("dedup_key", name="item_dedup_key", condition=Q(dedup_key__isnull=False)),
            # The fair lease: one lane per group key, each read in the fetch order. Only items with a key are in
            # it, so a queue without groups pays nothing for it.
            models.Index(
                "queue",
                "group_key",
                models.F("priority").desc(),
                "visible_at",
                "id",
                name="item_group",
                condition=Q(state__in=list(OPEN_STATES), group_key__isnull=False),
            ),
            # Admin search by ordering key.
            models.Index("ordering_key", name="item_ordering_key", condition=Q(ordering_key__isnull=False)),
            # ... and by group key (items queued without one are not in it).
            models.Index("group_key", name="item_group_key", condition=Q(group_key__isnull=False)),
            # Items in flight: per-queue counts (overview, concurrency limits) and the rescue of expired leases.
            models.Index("queue", "visible_at", name="item_in_flight", condition=Q(state="reserved")),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(priority__gte=-100, priority__lte=100), name="item_priority_range"),
            # The one ready, never leased item of a debounce key per queue: the enqueue's upsert (ON CONFLICT) finds
            # it by this index, and two enqueuers of a key at once meet on it. An item once leased keeps its
            # reservation id (a retry or a release puts it back to ready, never into this index again).
            models.UniqueConstraint(
                "queue",
                "debounce_key",
                name="item_debounce_ready",
                condition=Q(state="ready", debounce_key__isnull=False, reservation__isnull=True),
            ),
            models.CheckConstraint(condition=Q(state__in=[s.value for s in ItemState]), name="item_state_valid"),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.task} ({self.state})"

    def save(self, *args, **kwargs) -> None:
        # A row created through the ORM becomes visible when it is due, like one from engine.enqueue().
        if self._state.adding and self.run_at is not None and not isinstance(self.run_at, models.Expression):
            self.visible_at = self.run_at
        super().save(*args, **kwargs)


class Reservation(models.Model):
    """One attempt at one item; its id is the fencing token a settle must name."""

    id = models.BigAutoField(primary_key=True)
    # No foreign-key constraint in the database: its check cost every lease a deferred trigger event and a
    # KEY SHARE lock on the item (~15% of end-to-end throughput). Only the lease statement writes reservations,
    # for an item row it holds locked, and the hand-off's enqueue (sql.ENQUEUE_HANDOFF), for the item it inserts
    # in the same statement; the trigger reservation_cascade (migration 0007) deletes an item's reservations with
    # the item, using reservation_item (item, id).
    item = models.ForeignKey(
        QueueItem, on_delete=models.DO_NOTHING, db_constraint=False, related_name="reservations", db_index=False
    )
    attempt = models.PositiveIntegerField()
    worker_id = models.CharField(max_length=200)
    reserved_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    # When an at-most-once run's handler was about to start (committed durably before it did): from then on the
    # item is never delivered again, and a lease that lapses (the worker died mid-handler) makes it a dead
    # letter saying so. NULL for the other delivery modes and for an at-most-once lease that never started.
    started_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, null=True, blank=True)
    # When an attempt ended other than done (its finished_at), computed by the database. "Failed in the last
    # minutes" (overview, /metrics) reads this column's index; done attempts are counted from their items
    # (item_history). No index names finished_at or outcome, which the done settle writes, and this column stays
    # NULL through it: the settle's update changes no indexed value and is a HOT update (a new row version on the
    # same page and no index entries; the table's fillfactor leaves the room, migration 0010).
    not_done_at = models.GeneratedField(
        expression=Case(When(~Q(outcome=Outcome.DONE), then=F("finished_at"))),
        output_field=models.DateTimeField(null=True, blank=True),
        db_persist=True,
    )
    error = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index("item", "id", name="reservation_item"),
            models.Index("not_done_at", name="reservation_not_done", condition=Q(not_done_at__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"reservation {self.id} of item {self.item_id} (attempt {self.attempt})"


class DeadLetter(models.Model):
    id = models.BigAutoField(primary_key=True)
    item = models.ForeignKey(QueueItem, on_delete=models.DB_CASCADE, related_name="dead_letters")
    reason = models.CharField(max_length=200)
    last_error = models.TextField(blank=True, default="")
    died_at = models.DateTimeField()
    requeued_at = models.DateTimeField(null=True, blank=True)
    requeued_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index("died_at", name="deadletter_died"),
            models.Index("item", name="deadletter_open_item", condition=Q(requeued_at__isnull=True)),
        ]

    def __str__(self) -> str:
        return f"dead letter of item {self.item_id}: {self.reason}"


class DedupClaim(models.Model):
    """(queue, dedup key) -> the item that holds the key until `expires_at`.

    The primary key makes concurrent enqueuers of one key agree on one item; a claim past its window is taken
    over by the next enqueue (INSERT ... ON CONFLICT DO UPDATE ... WHERE expired).
    """

    pk = models.CompositePrimaryKey("queue_id", "key")
    queue_id = models.CharField(max_length=100)
    key = models.CharField(max_length=200)
    item_id = models.BigIntegerField()
    expires_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index("expires_at", name="dedup_expires")]

    def __str__(self) -> str:
        return f"{self.queue_id}/{self.key} -> item {self.item_id}"


class IdMark(models.Model):
    """The item and reservation sequences' last values, taken every few seconds by the worker's `id_marks` unit
    (engine/marks.py). A row stamped at or after `taken_at` got its id after the mark was read, so its id is
    above the mark's: the admin's "created / reserved in the last hour" filters bound their walk of the primary
    key by the newest mark before the window (created_at and reserved_at have no index: one on every open item
    would cost every enqueue and lease)."""

    taken_at = models.DateTimeField()
    item_id = models.BigIntegerField()
    reservation_id = models.BigIntegerField()

    class Meta:
        indexes = [models.Index("taken_at", name="idmark_taken")]

    def __str__(self) -> str:
        return f"ids at {self.taken_at:%Y-%m-%d %H:%M:%S}: item {self.item_id}, reservation {self.reservation_id}"
