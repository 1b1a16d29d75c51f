"""`workflow_finished`: sent once per workflow end (succeeded, failed, cancelled), by the worker that runs the
built-in `queue_app.workflow_finished` item the database enqueued in the transaction that ended the workflow.
So a receiver (webhooks, notifications) hears of every end exactly as reliably as any at-least-once item runs,
and never of an end that was rolled back. Receivers get `workflow` (the row) and `state`.
"""

from django.dispatch import Signal

workflow_finished = Signal()
