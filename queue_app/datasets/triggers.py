"""Data-aware triggers: what runs when a materialization becomes usable.

materialization_usable(materialization) is called in the transaction that makes a materialization usable (see
datasets/checks_run.py): at record time when it has no blocking checks, when its last blocking check passes, or
when its failed checks are overridden. Here it does nothing yet: the data-aware triggers hook in here.
"""

from __future__ import annotations

from .models import Materialization


def materialization_usable(materialization: Materialization) -> None:
    """`materialization` became usable (its checks state is none, passed, warned or overridden), in the
    transaction that made it so. A no-op hook for now."""
    return None
