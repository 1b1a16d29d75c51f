"""Whether and how a worker stops (worker/supervisor.py acts on it): asked by a signal (hand back the items held
and not started, finish the rest within the grace period), by --burst or --max-items (finish what is in hand), or
because a handler thread is stuck past its hard timeout (stop leasing, let the rest settle, then have run_worker
replace the process: worker/replace.py)."""

import time


class Shutdown:
    def __init__(self) -> None:
        self.stopping = False  # no more leases; the loop ends once what is in flight has settled
        self.replacing = False  # ... and run_worker then replaces the process
        self.release_held = False  # hand back held items that have not started (a signal, a replacement)
        self.grace_deadline = float("inf")  # a signal's: what still runs then is stopped

    def asked(self, grace_period: float) -> None:
        """A signal: the process ends rather than being replaced; what is held goes back."""
        self.stopping, self.replacing, self.release_held = True, False, True
        self.grace_deadline = time.monotonic() + grace_period

    def replace(self) -> bool:
        """A stuck handler thread: stop and be replaced, unless the process is ending anyway (then False)."""
        if self.stopping:
            return False
        self.stopping = self.replacing = self.release_held = True
        return True

    def finish_in_hand(self) -> None:
        """--burst found nothing more, or --max-items was reached: the items in hand run to their end."""
        self.stopping = True

    def out_of_grace(self, now: float) -> bool:
        return self.stopping and now >= self.grace_deadline
