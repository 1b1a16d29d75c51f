"""`manage.py workflow`: list, start, follow, repair and backfill workflows (the same services as the admin).

    python manage.py workflow list [--json]
    python manage.py workflow start demo_pipeline [--param day=2026-11-24] [--key K [--key-window S]] [--wait] [--json]
    python manage.py workflow status 42 [--json]
    python manage.py workflow repair 42 [--onto-current] [--wait] [--json]
    python manage.py workflow fork 42 --from STEP [--onto-current] [--wait] [--json]
    python manage.py workflow cancel 42 [--json]
    python manage.py workflow send-event partner.callback --key order-7 [--payload '{"amount": 120}'] [--id ID] [--json]
    python manage.py workflow approve 42 --step approve [--comment TEXT] [--user NAME] [--json]
    python manage.py workflow reject 42 --step approve [--comment TEXT] [--user NAME] [--json]
    python manage.py workflow backfill file_rollup --from 2026-11-01 --to 2026-11-07 [--param k=v] \
        [--concurrency 2] [--as-children] [--force] [--wait] [--json]

`--json` prints {"id", "name", "state", "attempt", "steps": [{"name", "state", ...}]} (a step `skipped` when its
run_if was not met or a branch chose another, docs/how-to/workflows.md "Conditions"); `start` adds "created"
(false when --key named a workflow already started, which is then what it prints and follows). Sub-workflows
(issue 48): "parent" ({"workflow_id", "name", "step", "attempt"} or null), "children" ([{"step", "workflow_id",
"name", "state"}]), and a sub-workflow step's "child_workflow_id". `backfill --as-children` runs a workflow's
days as one parent with a child workflow per day (a sub-workflow step each, at most --concurrency at a time).
With --wait the command follows the workflow to its end and exits 0 only when it succeeded (1 otherwise). Bad
input (unknown workflow or job, bad parameters, a bad range) is an error message, exit status 1, and nothing is written.

`cancel` cancels as the admin does (the same service): steps not started are cancelled, running ones asked to
stop. It exits 0 when the workflow was cancelled now or had already ended (its `--json` adds "cancelled": true
or false), 1 for an unknown id.

`repair` re-runs the graph the workflow started with; `--onto-current` rebuilds it onto the definition as the code
has it now (a step kept only when unchanged). `fork` starts a new workflow from a finished one: the step named by
`--from` and everything downstream of it run again, the other steps are copied with their results (the stored
graph, or the current definition with `--onto-current`). Its output is the new workflow's, as `start`'s; exit 1
for an unknown workflow, one not finished, or a step it does not have, with nothing written.

`send-event` sends an event (the same service as code's `waits.send_event`): it ends the oldest step waiting for
its name and key, or is kept for the lookback (JOBSITE WORKFLOW_EVENT_LOOKBACK) for a wait created later. With
`--id ID` (the sender's own id of the event) a send of an id sent before is a duplicate: nothing is sent, and it
says so. Its `--json` prints {"id", "name", "key", "matched", "step_id", "workflow_id", "sent_id", "duplicate"};
exit 0 whether or not a step was waiting (a duplicate too), 1 for bad input (a name, key or id too long, a
payload that is not JSON), with nothing written.

`approve` / `reject` decide an approval step (the same service as the admin's "Pending approvals",
workflows.approvals.decide) as a Django user: `--user NAME`, else the one whose username is the OS login name;
with neither it refuses. That user must hold the step's permission (superusers hold all), and the decision is an
admin LogEntry by them. Exit 0 when decided now; 1 for an unknown workflow or step, a step that is not an
approval or not waiting for a decision (already decided, timed out), no such user, or a user without the
permission, with nothing written. `--json` prints {"workflow_id", "step", "step_id", "approved", "by",
"comment"}.
"""

import json
import sys
import time

from django.core.management.base import CommandError

from queue_app.engine.payload import PAYLOAD_RULE
from queue_app.management.base import JobsiteCommand, acting_user, add_import_argument, import_modules, parse_params
from queue_app.workflows import WorkflowError, approvals, registered_workflows, waits
from queue_app.workflows import services as workflows
from queue_app.workflows.models import Workflow


def _default(value):
    return value() if callable(value) else value


class Command(JobsiteCommand):
    help = "Workflows: list, start, status, repair, fork, cancel, send-event, approve, reject, backfill."

    def add_arguments(self, parser):
        add_import_argument(parser, "workflows (besides every installed app's tasks.py)")
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="the registered workflows and their parameters")
        listing.add_argument("--json", action="store_true")
        start = sub.add_parser("start", help="start a registered workflow")
        start.add_argument("name")
        start.add_argument("--param", action="append", default=[], metavar="K=V")
        start.add_argument("--key", help="idempotency key: a second start with it prints the first workflow")
        start.add_argument(
            "--key-window", type=float, metavar="SECONDS", help="hold the key this long (default: the workflow's life)"
        )
        start.add_argument("--wait", action="store_true")
        start.add_argument("--json", action="store_true")
        status = sub.add_parser(
            "status",
            help="a workflow's state and its steps (each waiting, queued, running, sleeping, waiting_event, "
            "waiting_approval, succeeded, failed, cancelled or skipped)",
        )
        status.add_argument("id", type=int)
        status.add_argument("--json", action="store_true")
        repair = sub.add_parser("repair", help="re-run the failed or cancelled steps and what depends on them")
        repair.add_argument("id", type=int)
        repair.add_argument(
            "--onto-current", action="store_true", help="rebuild onto the current definition (not the stored graph)"
        )
        repair.add_argument("--wait", action="store_true")
        repair.add_argument("--json", action="store_true")
        fork = sub.add_parser("fork", help="a new workflow from a finished one, re-run from a step")
        fork.add_argument("id", type=int, help="the finished workflow")
        fork.add_argument("--from", dest="step", required=True, metavar="STEP", help="the step to re-run from")
        fork.add_argument(
            "--onto-current", action="store_true", help="run the current definition (default: the stored graph)"
        )
        fork.add_argument("--wait", action="store_true")
        fork.add_argument("--json", action="store_true")
        cancel = sub.add_parser("cancel", help="cancel a workflow: what has not started never runs (as the admin)")
        cancel.add_argument("id", type=int)
        cancel.add_argument("--json", action="store_true")
        send = sub.add_parser("send-event", help="send an event to the step waiting for its name and key")
        send.add_argument("name")
        send.add_argument("--key", required=True)
        send.add_argument(
            "--payload", metavar="JSON", help="the event's payload, any JSON value: the waiting step's result"
        )
        send.add_argument(
            "--id", dest="event_id", metavar="ID", help="the event's own id: a send of an id sent before is a duplicate"
        )
        send.add_argument("--json", action="store_true")
        for verb, what in (("approve", "approve (the step succeeds)"), ("reject", "reject (the step fails)")):
            decide = sub.add_parser(verb, help=f"{what} an approval step waiting for a decision")
            decide.add_argument("id", type=int, help="the workflow")
            decide.add_argument("--step", required=True, help="the approval step's name")
            decide.add_argument("--comment", default="", help="why (kept in the step's result and the LogEntry)")
            decide.add_argument("--user", help="the Django user deciding (default: the one named as the OS login)")
            decide.add_argument("--json", action="store_true")
        backfill = sub.add_parser("backfill", help="run a Spark job, task or workflow once per day of a range")
        backfill.add_argument("job")
        backfill.add_argument("--from", dest="start", required=True, metavar="DATE")
        backfill.add_argument("--to", dest="end", required=True, metavar="DATE")
        backfill.add_argument("--param", action="append", default=[], metavar="K=V")
        backfill.add_argument("--concurrency", type=int, default=1, metavar="K")
        backfill.add_argument(
            "--as-children", action="store_true", help="a workflow's days as child workflows of one parent"
        )
        backfill.add_argument("--force", action="store_true", help="allow more partitions than the limit")
        backfill.add_argument("--wait", action="store_true")
        backfill.add_argument("--json", action="store_true")
        for p in (start, status, repair, fork, backfill):
            p.add_argument("--poll", type=float, default=0.5, help=__import__("argparse").SUPPRESS)

    def handle(self, *args, action, imports, **options):
        import_modules(imports)
        try:
            getattr(self, f"do_{action.replace('-', '_')}")(**options)
        except WorkflowError as exc:
            raise CommandError(f"{exc}; nothing was written" if action != "status" else str(exc)) from None

    def do_list(self, *, json: bool, **_):
        definitions = registered_workflows()
        if json:
            self.stdout.write(
                _dumps(
                    [
                        {
                            "name": d.name,
                            "description": d.description,
                            "params": [
                                {"name": p.name, "type": p.type, "required": p.required, "default": _default(p.default)}
                                for p in d.params
                            ],
                        }
                        for d in definitions
                    ]
                )
            )
            return
        for d in definitions:
            self.stdout.write(self.style.MIGRATE_HEADING(d.name) + f"  {d.description}")
            for p in d.params:
                need = "required" if p.required else f"default {_dumps(_default(p.default))}"
                self.stdout.write(f"  --param {p.name}=…  {p.type}, {need}" + (f"  {p.help}" if p.help else ""))

    def do_start(self, *, name, param, key, key_window, wait, json, poll, **_):
        workflow = workflows.start(name, parse_params(param), started_by="cli", key=key, key_window=key_window)
        if not workflow.created and not json:
            self.stdout.write(f"workflow {workflow.id} was already started with key {key!r}: not started again")
        self.report(workflow.id, wait=wait, as_json=json, poll=poll, extra={"created": workflow.created})

    def do_status(self, *, id, json, **_):
        self.report(id, wait=False, as_json=json, poll=0)

    def do_repair(self, *, id, onto_current, wait, json, poll, **_):
        workflow = workflows.repair(id, actor="cli", onto_current=onto_current)
        self.report(workflow.id, wait=wait, as_json=json, poll=poll)

    def do_fork(self, *, id, step, onto_current, wait, json, poll, **_):
        workflow = workflows.fork(id, step, onto_current=onto_current, actor="cli")
        if not json:
            self.stdout.write(f"workflow {workflow.id} forked from {id} at step {step!r}")
        self.report(workflow.id, wait=wait, as_json=json, poll=poll)

    def do_cancel(self, *, id, json, **_):
        cancelled = workflows.cancel(id, actor="cli")
        status = workflows.status(id)
        if json:
            self.stdout.write(_dumps({**status, "cancelled": cancelled}))
        elif cancelled:
            self.stdout.write(f"workflow {id} {status['name']} cancelled: now {status['state']}")
        else:
            self.stdout.write(f"workflow {id} {status['name']} was not cancelled: it is {status['state']} already")

    def do_send_event(self, *, name, key, payload, event_id, json, **_):
        try:
            value = None if payload is None else _loads(payload)
        except ValueError as exc:
            raise CommandError(f"--payload is not valid JSON ({PAYLOAD_RULE}): {exc}; nothing was written") from None
        sent = waits.send_event(name, key, value, id=event_id)
        if json:
            self.stdout.write(
                _dumps(
                    {
                        "id": sent.id,
                        "name": sent.name,
                        "key": sent.key,
                        "matched": sent.matched,
                        "step_id": sent.step_id,
                        "workflow_id": sent.workflow_id,
                        "sent_id": sent.sent_id,
                        "duplicate": sent.duplicate,
                    }
                )
            )
        elif sent.duplicate:
            self.stdout.write(f"event id {event_id!r} was sent before: a duplicate, nothing sent (no step woken)")
        elif sent.matched:
            self.stdout.write(f"event {sent.id} {name} {key!r} woke step {sent.step_id} of workflow {sent.workflow_id}")
        else:
            self.stdout.write(f"event {sent.id} {name} {key!r}: no step waits for it now; kept for the lookback")

    def do_approve(self, **options):
        self._decide(approve=True, **options)

    def do_reject(self, **options):
        self._decide(approve=False, **options)

    def _decide(self, *, id, step, comment, user, json, approve, **_):
        found = approvals.find(id, step)
        deciding = acting_user(user, approvals.permission_of(found))
        decision = approvals.decide(found.id, deciding, approve, comment)
        if json:
            self.stdout.write(
                _dumps(
                    {
                        "workflow_id": decision.workflow_id,
                        "step": decision.step,
                        "step_id": decision.step_id,
                        "approved": decision.approved,
                        "by": decision.by,
                        "comment": decision.comment,
                    }
                )
            )
        else:
            verb = "approved" if approve else "rejected"
            self.stdout.write(f"step {decision.step!r} of workflow {decision.workflow_id} {verb} by {decision.by}")

    def do_backfill(self, *, job, start, end, param, concurrency, force, wait, json, poll, as_children=False, **_):
        workflow = workflows.backfill(
            job,
            start,
            end,
            params=parse_params(param),
            concurrency=concurrency,
            force=force,
            started_by="cli",
            as_children=as_children,
        )
        self.report(workflow.id, wait=wait, as_json=json, poll=poll)

    def report(self, workflow_id: int, *, wait: bool, as_json: bool, poll: float, extra: dict | None = None) -> None:
        if wait:
            last = None
            while True:
                workflow = Workflow.objects.get(id=workflow_id)
                done = workflow.steps_total - workflow.steps_open
                line = f"workflow {workflow.id} {workflow.state}  steps {done}/{workflow.steps_total}"
                if line != last and not as_json:
                    self.stdout.write(line)
                    last = line
                if workflow.is_final:
                    break
                time.sleep(poll)
        status = workflows.status(workflow_id)
        if as_json:
            self.stdout.write(_dumps({**status, **(extra or {})}))
        elif not wait:
            self.stdout.write(
                f"workflow {status['id']} {status['name']} {status['state']} (attempt {status['attempt']})"
            )
            if status.get("error"):
                self.stdout.write(f"  error: {_short(status['error'])}")
            if parent := status.get("parent"):
                self.stdout.write(
                    f"  parent: workflow {parent['workflow_id']} {parent['name']} step {parent['step']!r}"
                )
            for step in status["steps"]:
                why = f"  ({step['blocked_by']})" if "blocked_by" in step else ""
                said = f"  error: {_short(step['error'])}" if step.get("error") else ""
                if not said and step.get("result") is not None:
                    said = f"  result: {_short(_dumps(step['result']))}"
                if step.get("child_workflow_id"):
                    why += f"  (child workflow {step['child_workflow_id']})"
                self.stdout.write(f"  {step['state']:<10} {step['name']}{why}{said}")
        if wait and status["state"] != "succeeded":
            sys.stdout.flush()
            raise SystemExit(1)


def _short(text: str, limit: int = 160) -> str:
    """One line of at most `limit` characters (the full text: --json)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _loads(text: str):
    return json.loads(text)


def _dumps(value) -> str:
    return json.dumps(value, default=str)
