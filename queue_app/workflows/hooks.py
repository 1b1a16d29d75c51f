"""The hooks a workflow publishes for the layers built on it (the datasets today: datasets/workflow_triggers.py
registers on them in the datasets app's ready()). workflows/services.py calls them; it names no layer, and with
nothing registered a workflow starts as a plain workflow. Each is a queue_app.hooks.Hook (registered again by
module and name: replaces itself).

- `start_checks(definition, params)`: when a registered workflow is started (services.start), with its dumped
  parameters, first in the transaction that writes it (so what a check reads with a lock is held until the
  workflow is written); raises WorkflowParamError to refuse it, nothing written (the datasets: a partition
  parameter naming a dynamic key not in its set).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..hooks import Hook

start_checks: Hook[Callable[[Any, dict[str, Any]], None]] = Hook("workflow start checks")
