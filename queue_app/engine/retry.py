"""The retry policy: exponential backoff with jitter, a small pure function (River's default policy)."""

import random

from ..conf import queue_settings


def backoff_seconds(attempt: int, *, base: float | None = None, cap: float | None = None) -> float:
    """Seconds to wait before attempt `attempt + 1`, after `attempt` failures: base * 2^(attempt-1) with
    +-jitter so retries of a burst of failures spread out, never more than `cap` (the cap holds after the
    jitter: retries at the cap spread below it, not above). A draw past the cap is drawn again in
    [cap * (1 - jitter), cap], not clipped to the cap: clipping would put half of a burst's retries at the cap on
    one instant."""
    base = queue_settings.BACKOFF_BASE if base is None else base
    cap = queue_settings.BACKOFF_MAX if cap is None else cap
    # The exponent is bounded so a queue with a very large max_attempts cannot overflow float (2**1024).
    delay = min(cap, base * (2 ** min(max(0, attempt - 1), 64)))
    jitter = queue_settings.BACKOFF_JITTER
    jittered = delay * random.uniform(1 - jitter, 1 + jitter)
    if jittered > cap:
        jittered = cap * random.uniform(1 - jitter, 1)
    return max(0.0, jittered)
