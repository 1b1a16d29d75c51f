"""Tasks of tests/core/processes/test_json_logs.py, loaded by its worker with `run_worker --import
tests.tasks.json_log_tasks`: a handler that logs (a line with a newline in it among them) and fails its first
attempt."""

import logging

from queue_app.registry import Context, Retry, job

logger = logging.getLogger("tests.json_logs")


class FirstAttemptFails(Exception):
    pass


@job("tests.logs_then_fails_once", queue="json_logs", retry=Retry(times=2, delay=0))
def logs_then_fails_once(payload: dict, ctx: Context) -> None:
    logger.info("handling %s\nsecond line of the same record", payload["n"])
    if ctx.attempt == 1:
        raise FirstAttemptFails(f"attempt {ctx.attempt} of item {ctx.item_id} fails")
    logger.warning("done on attempt %s", ctx.attempt)
