"""The child workflow of `queue_chaos --workflow`'s sub-workflow steps (workflow.py), imported by its workers
(`run_worker --import jobsite.chaos.workflow_tasks`), by the harness and by
tests/project/in_process/test_chaos_checkers.py."""

from queue_app.workflows import workflow

CHILD = "chaos_child"
TRANSACTIONAL = "queue_app.probe_transactional"
AT_LEAST_ONCE = "queue_app.probe"


@workflow(CHILD)
def chaos_child(wf, params):
    """Two probes, at least once then transactional: what the checks count as the child having run once."""
    first = wf.task(AT_LEAST_ONCE, name="first")
    wf.task(TRANSACTIONAL, name="second", after=[first])
