"""The engine's exceptions: each says what went wrong in the queue's own words."""


class QueueError(Exception):
    """Base class of every jobsite queue error."""


class InvalidEnqueue(QueueError, ValueError):
    """enqueue() was given arguments it cannot store; nothing was written."""


class InvalidResult(InvalidEnqueue):
    """complete() was given a result it cannot store (not JSON, NaN, too big or deep); nothing was written.
    An InvalidEnqueue too, for callers written before it had its own name."""


class StaleReservation(QueueError):
    """A settle named a reservation that is no longer the item's current one; nothing changed.

    The item was leased again after this lease expired, rescued, cancelled, or already settled.
    """

    def __init__(self, reservation_id: int, item_id: int, action: str) -> None:
        self.reservation_id = reservation_id
        self.item_id = item_id
        self.action = action
        super().__init__(
            f"cannot {action} item {item_id}: reservation {reservation_id} is no longer current "
            "(lease expired and taken again, item cancelled, or already settled); nothing changed"
        )


class CrossDatabaseEnqueue(InvalidEnqueue):
    """enqueue() was called inside a transaction on another database alias than the queue's (JOBSITE["DATABASE"])
    and none on the queue's: the item could not commit or roll back with that transaction; nothing was written."""
