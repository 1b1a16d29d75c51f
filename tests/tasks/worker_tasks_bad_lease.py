"""A task no worker may run: its lease is not longer than its hard timeout plus the margin."""

from queue_app.registry import Context, job


@job("tests.bad_lease", hard_timeout=30.0, lease_timeout=30.0)
def bad_lease(payload: dict, ctx: Context) -> None:
    return None
