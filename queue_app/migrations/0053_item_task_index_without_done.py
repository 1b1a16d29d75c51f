"""The admin's task index on the item table covers dead and cancelled items, not done ones: item_task_not_done
(task, state) WHERE state IN (dead, cancelled) replaces item_task_history (task, state) WHERE state IN (done,
dead, cancelled).

Almost every item ends done, by its lease's settle: item_task_history cost that settle one of the eight index
entries an item's lease and settle write, and the widest (the task's name). Measured on one process leasing and
settling 100,000 items in batches of 500, three rounds alternated (2-core VM, load under 1): the settle 15.6 ->
14.7 us an item, the WAL of the lease and settle 1,691 -> 1,593 bytes an item.

The index's readers keep their index: the admin's task filter reads dead and cancelled items' names here, done
items' names in the history's itemhistory_task (the archiver moves done items there a minute after they finish)
and registered tasks' from the registry (admin/filters.py); the dead letters' task filter reads dead items.
A list of one task's done items in the hot table (at most a minute's worth plus the archiver's lag) reads
item_history (state, queue, finished_at) or the primary key.

Built before the old one is dropped, both CONCURRENTLY, so a deployed table takes writes and the filter keeps
an index while this migrates; hence atomic = False.
"""

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("queue_app", "0052_handoff_offer"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="queueitem",
            index=models.Index(
                "task", "state", condition=models.Q(("state__in", ["dead", "cancelled"])), name="item_task_not_done"
            ),
        ),
        RemoveIndexConcurrently(model_name="queueitem", name="item_task_history"),
    ]
