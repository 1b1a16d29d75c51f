"""What an autoscaler (KEDA, an HPA on external metrics, a script) needs to size a queue's workers: the recent
throughput per worker and a suggested worker count. Computed from figures the monitoring snapshot already has
(monitoring.snapshot: ready, in flight, completions in the window, live workers serving the queue), so /metrics and
`queue_stats --json` add no statement for them and agree with each other.

The formula (docs/how-to/autoscaling.md):

    work       = ready + in_flight                 (in_flight only while the queue is paused)
    per_worker = completed in the window / window seconds / live workers serving the queue   (items/s)
    suggested  = 0                                  when work = 0
               = max(live workers, 1)               when per_worker is unknown (no completion or no live worker)
               = ceil(work / (per_worker * AUTOSCALE_TARGET_DRAIN_SECONDS))
    then bounded to [1, AUTOSCALE_MAX_WORKERS] while there is work.
"""

import math
from dataclasses import dataclass

from .conf import queue_settings


@dataclass(frozen=True, slots=True)
class Signals:
    throughput_per_worker: float | None  # items/s each live worker completed over the window; None: unknown
    suggested_workers: int


def signals(
    *, ready: int, in_flight: int, paused: bool, completed: int, window_seconds: float, workers: int
) -> Signals:
    """A queue's throughput per worker and suggested worker count (the formula above)."""
    per_worker = completed / window_seconds / workers if completed > 0 and workers > 0 else None
    work = in_flight + (0 if paused else ready)
    if work == 0:
        return Signals(per_worker, 0)
    if per_worker is None:  # nothing measured yet: start (or keep) the workers there are, at least one
        wanted = max(workers, 1)
    else:
        wanted = math.ceil(work / (per_worker * float(queue_settings.AUTOSCALE_TARGET_DRAIN_SECONDS)))
    return Signals(per_worker, min(max(wanted, 1), int(queue_settings.AUTOSCALE_MAX_WORKERS)))
