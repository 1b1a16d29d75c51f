"""The retry policy: exponential backoff with jitter, a small pure function (River's default policy)."""

import random

from ..conf import queue_settings


def backoff_seconds(attempt: int, *, base: float | None = None, cap: float | None = None) -> float:
    """Seconds to wait before attempt `attempt + 1`, after `attempt` failures: base * 2^(attempt-1) with
    +-jitter so retries of a burst of failures spread out, never more than `cap` (the cap holds after the
    jitter: retries at the cap spread below it, not above)."""
    base = queue_settings.BACKOFF_BASE if base is None else base
    cap = queue_settings.BACKOFF_MAX if cap is None else cap
    # The exponent is bounded so a queue with a very large max_attempts cannot overflow float (2**1024).
    delay = min(cap, base * (2 ** min(max(0, attempt - 1), 64)))
    jitter = queue_settings.BACKOFF_JITTER
    return min(cap, max(0.0, delay * random.uniform(1 - jitter, 1 + jitter)))
