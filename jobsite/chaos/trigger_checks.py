"""The checks of `queue_chaos --triggers` (triggers.py), judged from the rows the run left: callable on any
database alias (the run's private cluster, or a test database with planted rows:
tests/project/in_process/test_chaos_checkers.py). Here too the names the run's datasets and tasks go by
(trigger_tasks.py declares them; importing this module declares nothing).

- no item stuck: no item ready or reserved;
- every upstream recorded once (a bad partition recorded again good: chaos_a twice);
- bad records failed their blocking check: each chaos_a's checks state per partition is what its plan says
  (overridden; failed then passed; passed);
- each consumer queued once per usable set: the `all` consumer once per partition with the usable upstream ids,
  the `any` consumer twice (once per usable upstream), none of a blocked partition queued before the second phase;
- each consumer item ran exactly once: one output row per consumer item;
- no consumer before its upstreams: every consumer item's first lease after the upstreams it names were recorded;
- each mapped consumer queued once per set (datasets/mappings.py): the weekly one (chaos_b's days, TimeWindow to
  weekly) once per week whose seven days were all recorded, with their ids, none for another week; the fan-in
  (chaos_region by day and a dynamic source, AllOf the source) once per day whose every source was recorded;
  each item run once, after every upstream partition it names;
- dynamic keys removed and added again while their runs start (jobsite.chaos_churn items toggling the keys of
  chaos_customers, racing the producer task's items that `dataset materialize` queues and the trigger task they
  fire): no item or materialization of a key started while it was removed (its id after the watermark the removal
  read holding the key's row, and not after the re-add's; an id is taken after the start validated the key), none
  open at a removal (created before it, settled after its removed_at), a refusal names only runs of the key, and
  the key rows' removals are the churn items' (a removal that did not commit removed nothing);
- workers behaved: no worker died unasked.
"""

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from queue_app.datasets.models import Materialization, TriggerFire
from queue_app.models import ItemHistory, QueueItem

from .checks import Check
from .history import first_leases

UPSTREAMS = ("chaos_a", "chaos_b")
CONSUMERS = {"jobsite.chaos_consume_all": "chaos_all_out", "jobsite.chaos_consume_any": "chaos_any_out"}
CHECKED = "chaos_a"  # its blocking check fails a materialization recorded with "bad"
REGION, SOURCES_SET = "chaos_region", "chaos_sources"  # by day and a source of the dynamic set chaos_sources
MAPPED = {"jobsite.chaos_consume_week": "chaos_week_out", "jobsite.chaos_consume_fanin": "chaos_fanin_out"}
# Dynamic keys removed and added again during the run: the set, its dataset, the task producing it (its items are
# runs of a key), the trigger task it fires (its items too), the task asking for partitions and the one toggling keys.
CHURN_SET, CHURN_DATASET = "chaos_customers", "chaos_cust"
CHURN_PRODUCER, CHURN_CONSUMER = "jobsite.chaos_produce_cust", "jobsite.chaos_consume_cust"
CHURN_REQUEST, CHURN_TASK = "jobsite.chaos_request_cust", "jobsite.chaos_churn"
WATERMARKS = """
SELECT (SELECT last_value FROM queue_app_queueitem_id_seq), (SELECT last_value FROM queue_app_materialization_id_seq)
"""


def watermark(cursor) -> dict[str, int]:
    """The item and materialization sequences' last values (a churn item's result keeps them): every id taken
    before is at most these, every id taken after is above."""
    cursor.execute(WATERMARKS)
    item, materialization = cursor.fetchone()
    return {"item": item, "materialization": materialization}


@dataclass(frozen=True)
class TriggerRun:
    """What the run planted and did: its partitions, the bad ones (overridden in the second phase, or recorded
    again good), the first item id the second phase could have queued, its workers' crashes, its kills."""

    days: list[str]
    overridden: list[str]
    rewritten: list[str]
    second_phase_from: int
    crashes: list[str] = field(default_factory=list)
    kills: int = 0
    sources: list[str] = field(default_factory=list)  # the dynamic set's keys (the fan-in reads all of them)


def check_triggers(db: str, run: TriggerRun) -> list[Check]:
    """Every check of the run, in the order the report prints them."""
    days = run.days
    rows = defaultdict(list)
    for m in Materialization.objects.using(db).order_by("id"):
        rows[m.dataset, m.partition].append(m)
    items: dict[int, object] = {}
    for model in (QueueItem, ItemHistory):  # hot and archived: the workers archive finished items
        for item in model.objects.using(db).filter(task__in=list(CONSUMERS)):
            items.setdefault(item.id, item)
    overridden, rewritten = set(run.overridden), set(run.rewritten)
    queued = defaultdict(list)
    for item in items.values():
        queued[item.task, item.payload.get("partition")].append(item)
    checks = []

    open_items = QueueItem.objects.using(db).filter(state__in=["ready", "reserved"]).count()
    checks.append(Check("no item stuck", open_items == 0, {"open": open_items}, []))

    def times(name: str, day: str) -> int:  # a re-recorded bad partition's chaos_a: twice
        return 2 if name == CHECKED and day in rewritten else 1

    problems = [f"{name}[{day}] recorded {len(rows[name, day])} times" for day in days
                for name in UPSTREAMS if len(rows[name, day]) != times(name, day)]  # fmt: skip
    checks.append(Check("every upstream recorded once", not problems, {"partitions": len(days)}, problems[:20]))

    problems = []
    for day in days:
        wanted = ["overridden"] if day in overridden else ["failed", "passed"] if day in rewritten else ["passed"]
        if [m.checks for m in rows[CHECKED, day]] != wanted:
            problems.append(f"chaos_a[{day}] checks {[m.checks for m in rows['chaos_a', day]]}, not {wanted}")
    bad = len(overridden) + len(rewritten)
    checks.append(Check("bad records failed their blocking check", not problems, {"bad": bad}, problems[:20]))

    problems = []
    all_task, any_task = list(CONSUMERS)
    for day in days:
        a, b = rows["chaos_a", day], rows["chaos_b", day]
        if len(a) != times("chaos_a", day) or len(b) != 1:
            continue
        usable_a = a[-1]  # a good record, the override of a bad one, or the good record after a bad one
        all_items, any_items = queued[all_task, day], queued[any_task, day]
        if day in overridden or day in rewritten:
            # Blocked until the second phase: a consumer item naming the bad record, or the all consumer's,
            # queued before it began ran on a blocked partition.
            early = [i.id for i in all_items + any_items if i.id < run.second_phase_from
                     and (i.task == all_task or i.payload["upstream"].get("chaos_a") == a[0].id)]  # fmt: skip
            if early:
                problems.append(f"consumer items {early} of blocked {day} queued before the second phase")
        if len(all_items) != 1:
            problems.append(f"all consumer of {day} queued {len(all_items)} times")
        elif all_items[0].payload["upstream"] != {"chaos_a": usable_a.id, "chaos_b": b[0].id}:
            problems.append(f"all consumer of {day} got {all_items[0].payload['upstream']}")
        if len(any_items) != 2:
            problems.append(f"any consumer of {day} queued {len(any_items)} times")
    fires = Counter(TriggerFire.objects.using(db).values_list("consumer", flat=True))
    checks.append(Check("each consumer queued once per usable set", not problems, dict(fires), problems[:20]))

    problems = []
    for task, output in CONSUMERS.items():
        for day in days:
            expected = len(queued[task, day])
            if len(rows[output, day]) != expected:
                problems.append(f"{output}[{day}]: {len(rows[output, day])} runs for {expected} items")
    checks.append(Check("each consumer item ran exactly once", not problems, {}, problems[:20]))

    problems = []
    first_lease = first_leases(db, list(items))
    for (task, day), found in queued.items():
        ups = rows["chaos_a", day] + rows["chaos_b", day]
        for item in found:
            # Its lease began after the transaction that queued it committed, so after every upstream it names
            # had committed (the recorder waited for the other's row lock): a lease before an upstream's
            # recording transaction even began is a consumer run before its upstreams.
            named = item.payload.get("upstream", {})
            recorded = [m.at for m in ups if m.id in named.values()]
            leased = first_lease.get(item.id)
            if len(recorded) != len(named) or leased is None or any(leased < at for at in recorded):
                problems.append(f"{task}[{day}] leased at {leased} before its upstreams {named}")
    checks.append(Check("no consumer before its upstreams", not problems, {"items": len(items)}, problems[:20]))
    checks.append(mapped_check(db, run, rows))
    checks.append(churn_check(db))
    checks.append(Check("workers behaved", not run.crashes, {"kills": run.kills}, run.crashes))
    return checks


def churn_check(db: str) -> Check:
    """No run of a dynamic key started while it was removed, none open at its removal, a refusal names runs of
    the key (see the module). Each jobsite.chaos_churn item that committed left its result: {"key", "op"
    ("remove" or "add"), "removed" (a removal that committed), "named" (a refusal's runs), "watermark" {"item",
    "materialization"}: the sequences' last values read holding the key's row (a removal: after its lock; an
    addition: before its insert)}."""
    from queue_app.datasets.models import DynamicPartitionKey

    items: dict[int, object] = {}
    for model in (QueueItem, ItemHistory):
        for item in model.objects.using(db).filter(task__in=[CHURN_PRODUCER, CHURN_CONSUMER, CHURN_TASK]):
            items.setdefault(item.id, item)
    results = {
        f"chaos:{i.id}": i.result
        for i in items.values()
        if i.task == CHURN_TASK and i.state == "done" and isinstance(i.result, dict)
    }
    runs = defaultdict(list)  # key -> its runs: (kind, id, created, finished)
    for item in items.values():
        if item.task != CHURN_TASK and isinstance(item.payload, dict) and item.payload.get("partition"):
            runs[item.payload["partition"]].append(("item", item.id, item.finished_at))
    for m in Materialization.objects.using(db).filter(dataset=CHURN_DATASET).order_by("id"):
        runs[m.partition].append(("materialization", m.id, None))
    problems = []
    rows = list(DynamicPartitionKey.objects.using(db).filter(partition_set=CHURN_SET).order_by("key", "id"))
    removed_by = {r.removed_by for r in rows if r.removed_at is not None}
    said_removed = {by for by, r in results.items() if r.get("op") == "remove" and r.get("removed")}
    if removed_by != said_removed:
        unsaid, unseen = sorted(removed_by - said_removed), sorted(said_removed - removed_by)
        problems.append(f"key rows removed by {unsaid} no committed removal says; removals {unseen} not in the rows")
    for at, row in enumerate(rows):
        if row.removed_at is None:
            continue
        removal = results.get(row.removed_by, {}).get("watermark", {})
        after = rows[at + 1] if at + 1 < len(rows) and rows[at + 1].key == row.key else None
        readd = results.get(after.added_by, {}).get("watermark", {}) if after is not None else {}
        for kind, run_id, finished in runs[row.key]:
            if kind not in removal:
                continue
            if removal[kind] < run_id and (kind not in readd or run_id <= readd[kind]):
                problems.append(f"{kind} {run_id} of {row.key} started while it was removed ({row.removed_by})")
            elif kind == "item" and run_id <= removal[kind] and (finished is None or finished > row.removed_at):
                problems.append(f"item {run_id} of {row.key} open at its removal ({row.removed_by})")
    refusals = 0
    for by, result in results.items():
        if result.get("op") != "remove" or result.get("removed") or not result.get("named"):
            continue
        refusals += 1
        ours = {f"item:{run_id}" for kind, run_id, _ in runs[result["key"]] if kind == "item"}
        if strays := [n for n in result["named"] if n not in ours]:
            problems.append(f"{by}: removal of {result['key']} refused naming {', '.join(strays[:5])}, no run of it")
    figures = {
        "removed": len(said_removed),
        "refused": refusals,
        "added_again": sum(r.get("op") == "add" and r.get("added", False) for r in results.values()),
        "runs": sum(len(v) for v in runs.values()),
    }
    return Check("dynamic keys: no run after removal", not problems, figures, problems[:20])


def mapped_check(db: str, run: TriggerRun, rows: dict) -> Check:
    """Each mapped consumer queued once per complete set of the partitions its mapping names, ran once, after
    them (see the module)."""
    items: dict[int, object] = {}
    for model in (QueueItem, ItemHistory):
        for item in model.objects.using(db).filter(task__in=list(MAPPED)):
            items.setdefault(item.id, item)
    queued = defaultdict(list)
    for item in items.values():
        queued[item.task, item.payload.get("partition")].append(item)
    expected: dict[tuple[str, str], dict[str, int]] = {}
    weeks = defaultdict(list)
    for day in run.days:
        year, week, _ = dt.date.fromisoformat(day).isocalendar()
        weeks[f"{year:04d}-W{week:02d}"].append(day)
    week_task, fanin_task = list(MAPPED)
    for week in weeks:
        monday = dt.date.fromisocalendar(int(week[:4]), int(week[6:]), 1)
        days = [(monday + dt.timedelta(days=i)).isoformat() for i in range(7)]
        if all(len(rows["chaos_b", d]) == 1 for d in days):
            expected[week_task, week] = {f"chaos_b[{d}]": rows["chaos_b", d][0].id for d in days}
    for day in run.days:
        parts = [rows[REGION, f"{day}|{s}"] for s in run.sources]
        if run.sources and all(len(p) == 1 for p in parts):
            expected[fanin_task, day] = {
                f"{REGION}[{day}|{s}]": p[0].id for s, p in zip(run.sources, parts, strict=True)
            }
    problems = []
    for key in sorted(set(expected) | set(queued)):
        found = queued.get(key, [])
        if key not in expected:
            problems.append(f"{key[0]}[{key[1]}] queued {len(found)} times for an incomplete set")
        elif len(found) != 1:
            problems.append(f"{key[0]}[{key[1]}] queued {len(found)} times")
        elif found[0].payload["upstream"] != expected[key]:
            problems.append(f"{key[0]}[{key[1]}] got {found[0].payload['upstream']}")
    for (task, partition), found in queued.items():
        ran = len(rows[MAPPED[task], partition])
        if ran != len(found):
            problems.append(f"{MAPPED[task]}[{partition}]: {ran} runs for {len(found)} items")
    recorded_at = {m.id: m.at for found in rows.values() for m in found}
    first_lease = first_leases(db, list(items))
    for item in items.values():
        ats = [recorded_at.get(i) for i in item.payload.get("upstream", {}).values()]
        leased = first_lease.get(item.id)
        if leased is None or any(at is None or leased < at for at in ats):
            problems.append(f"{item.task}[{item.payload.get('partition')}] leased at {leased} before its upstreams")
    figures = {
        "weeks": sum(k[0] == week_task for k in expected),
        "fan_in_days": sum(k[0] == fanin_task for k in expected),
    }
    return Check("each mapped consumer queued once per set", not problems, figures, problems[:20])
