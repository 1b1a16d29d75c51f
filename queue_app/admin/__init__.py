"""The queue's admin: read-only screens over items, attempts, dead letters, queues and workers; every change an
Operation (a services.py call behind a custom permission, see actions.py); the queue overview as a page of its
own (overview.py), which a project may also put on the admin's home (the jobsite project's templates/admin/index.html
does). The admin's titles are the project's to set, not this app's."""

from django.contrib import admin

from ..models import (
    DeadLetter,
    ItemHistory,
    Queue,
    QueueItem,
    Reservation,
    ReservationHistory,
    Worker,
)
from .dead_letters import DeadLetterAdmin
from .history import ItemHistoryAdmin, ReservationHistoryAdmin
from .items import QueueItemAdmin
from .queues import QueueAdmin
from .reservations import ReservationAdmin
from .workers import WorkerAdmin

admin.site.register(QueueItem, QueueItemAdmin)
admin.site.register(Reservation, ReservationAdmin)
admin.site.register(DeadLetter, DeadLetterAdmin)
admin.site.register(ItemHistory, ItemHistoryAdmin)
admin.site.register(ReservationHistory, ReservationHistoryAdmin)
admin.site.register(Queue, QueueAdmin)
admin.site.register(Worker, WorkerAdmin)
from .schedules import ScheduleAdmin  # noqa: E402, F401  registers Schedule (with its fires inline)
