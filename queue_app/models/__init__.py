"""The app's models, one module per concept; Django loads the app's models by importing this package.

- queue.py: Queue, QueueItem, Reservation, DeadLetter, DedupClaim, IdMark (and the item states)
- history.py: ItemHistory, ReservationHistory (finished items moved out of the hot tables)
- workers.py: Worker, Leader (who does a duty that spans transactions), HandoffOffer (an idle worker's slot)
- schedules.py: Schedule, ScheduleFire
- received.py: ReceivedWebhook (the inbound webhooks' replay guard, queue_app/receiver.py)

The probes' models (probes/models.py: ExecutionLog, ProbeEffect) are the core's too and are imported last. The
layer apps' models (Spark runs, workflows, datasets, webhooks) belong to their own apps (jobsite_spark,
jobsite_workflows, jobsite_datasets, jobsite_webhooks) and are imported from their `models` modules
(`from queue_app.spark.models import SparkRun`): the core imports no layer.
"""

from .history import ItemHistory, ReservationHistory
from .queue import (
    HISTORY_STATES,
    HISTORY_STATES_SQL,
    NOT_DONE_STATES,
    NOT_DONE_STATES_SQL,
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
from .workers import HandoffOffer, Leader, Worker, WorkerState

# isort: split
# The probes' models (imported after the core ones: importing the package runs its __init__).
from ..probes.models import ExecutionLog, ProbeEffect

__all__ = [
    "HISTORY_STATES",
    "HISTORY_STATES_SQL",
    "NOT_DONE_STATES",
    "NOT_DONE_STATES_SQL",
    "OPEN_STATES",
    "CatchUp",
    "DeadLetter",
    "DedupClaim",
    "ExecutionLog",
    "IdMark",
    "ItemHistory",
    "ItemState",
    "Outcome",
    "ProbeEffect",
    "Queue",
    "QueueItem",
    "ReceivedWebhook",
    "Reservation",
    "ReservationHistory",
    "Schedule",
    "ScheduleFire",
    "TargetKind",
    "TransactionNow",
    "HandoffOffer",
    "Leader",
    "Worker",
    "WorkerState",
]
