"""The app's models, one module per concept; Django loads the app's models by importing this package.

- queue.py: Queue, QueueItem, Reservation, DeadLetter, DedupClaim, IdMark (and the item states)
- history.py: ItemHistory, ReservationHistory (finished items moved out of the hot tables)
- workers.py: Worker, Leader (who does a duty that spans transactions)
- schedules.py: Schedule, ScheduleFire
- received.py: ReceivedWebhook (the inbound webhooks' replay guard, queue_app/receiver.py)

The datasets, Spark, probes, webhooks and workflows models live with their packages (datasets/models.py,
spark/models.py, probes/models.py, webhooks/models.py, workflows/models.py) and are imported last, so Django
registers them with the app; each of those modules imports only Django. Their names are re-exported here as
well, so `from queue_app.models import SparkRun` keeps working; new code imports them from their own package.
"""

from .history import ItemHistory, ReservationHistory
from .queue import (
    HISTORY_STATES,
    HISTORY_STATES_SQL,
    OPEN_STATES,
    DeadLetter,
    DedupClaim,
    IdMark,
    ItemState,
    Outcome,
    Queue,
    QueueItem,
    Reservation,
    TransactionNow,
)
from .received import ReceivedWebhook
from .schedules import CatchUp, Schedule, ScheduleFire, TargetKind
from .workers import Leader, Worker, WorkerState

# isort: split
# The models of the app's packages (imported after the core ones: importing a package runs its __init__, which may
# import the core models back).
from ..datasets.models import Dataset, DatasetCheckResult, DynamicPartitionKey, Materialization, OpenLineageCounter
from ..probes.models import ExecutionLog, ProbeEffect
from ..spark.models import (
    SPARK_FINAL_STATES,
    SPARK_OPEN_STATES,
    QueueStatsHourly,
    SparkConnectServer,
    SparkRun,
    SparkRunState,
    SparkScript,
    SparkTrigger,
    SparkWatermark,
)
from ..webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from ..workflows.models import StepDependency, Workflow, WorkflowStep

__all__ = [
    "HISTORY_STATES",
    "HISTORY_STATES_SQL",
    "OPEN_STATES",
    "SPARK_FINAL_STATES",
    "SPARK_OPEN_STATES",
    "CatchUp",
    "Dataset",
    "DatasetCheckResult",
    "DynamicPartitionKey",
    "DeadLetter",
    "DedupClaim",
    "ExecutionLog",
    "IdMark",
    "ItemHistory",
    "ItemState",
    "Materialization",
    "OpenLineageCounter",
    "Outcome",
    "ProbeEffect",
    "Queue",
    "QueueItem",
    "QueueStatsHourly",
    "ReceivedWebhook",
    "Reservation",
    "ReservationHistory",
    "Schedule",
    "ScheduleFire",
    "SparkConnectServer",
    "SparkRun",
    "SparkRunState",
    "SparkScript",
    "SparkTrigger",
    "SparkWatermark",
    "StepDependency",
    "TargetKind",
    "TransactionNow",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "Leader",
    "Worker",
    "WorkerState",
    "Workflow",
    "WorkflowStep",
]
