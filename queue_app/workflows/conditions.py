"""Conditions: what a branch step chooses (the built-in task `queue_app.workflow_branch` calls `choose` in the
worker, with the result of the step it reads). The run-if rules themselves are decided by the settle trigger
(workflows/sql.py, queue_app_wf_decide) from the names stored in each step's spec.
"""

from __future__ import annotations

import operator
from typing import Any


class BranchError(Exception):
    """The branch cannot decide: its path is missing from the result, or the values do not compare."""


_OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "in": lambda got, value: got in value,
}


def at_path(result: Any, path: str) -> Any:
    """`result` at `path`: keys (and list indexes) joined by dots; "" is the whole result."""
    got = result
    for part in path.split(".") if path else ():
        if isinstance(got, dict) and part in got:
            got = got[part]
        elif isinstance(got, list) and part.lstrip("-").isdigit() and -len(got) <= int(part) < len(got):
            got = got[int(part)]
        else:
            raise BranchError(f"no {path!r} in the result {result!r} (stopped at {part!r})")
    return got


def choose(args: dict[str, Any], upstream: dict[str, Any]) -> dict[str, Any]:
    """The branch's decision: {"chosen": the steps to run, "value": what it read, "matched": whether it held}."""
    got = at_path(upstream.get(args["on"]), args["path"])
    op = args["op"]
    if op == "truthy":
        matched = bool(got)
    else:
        try:
            matched = bool(_OPS[op](got, args["value"]))
        except TypeError as exc:
            raise BranchError(f"cannot compare {got!r} {op} {args['value']!r}: {exc}") from None
    return {"chosen": args["then"] if matched else args["otherwise"], "value": got, "matched": matched}
