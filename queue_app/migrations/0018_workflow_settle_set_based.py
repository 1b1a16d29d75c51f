"""Workflow steps settle set-based (issue 20's per-step cost goal).

Before: the row trigger on queue items updated each step item's step row on its own (one plpgsql UPDATE per
item) and remembered the step for the statement trigger. Now the row trigger only remembers the item, and the
statement trigger ends all the steps of the statement's items in one UPDATE (the step row's `state = 'queued'`
is still the claim: at most once), then moves their workflows forward as before. Step rows keep a quarter of
each page free so that this update (no indexed column changes) stays HOT.

Fewer writes per step and edge: the step's parent and compensates links and an edge's upstream end lose their
foreign key constraints (checked once per row at commit) and indexes (never looked up); the edge's downstream
constraint stays for its cascade, its duplicate index (beside stepdependency_downstream) goes, and so does the
index on a step's workflow (the unique index workflowstep_name starts with it).
"""

import importlib

import django.db.models.deletion
from django.db import migrations, models

SETTLE_FUNCTIONS = r"""
-- Each step item that ended (the WHEN of the row trigger workflow_step_settled): remembered for the end of the
-- statement, where queue_app_wf_statement_settled ends the steps of all of them in one go.
CREATE OR REPLACE FUNCTION queue_app_wf_item_settled() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobsite.workflow_items_ended',
                       COALESCE(current_setting('jobsite.workflow_items_ended', true), '') || NEW.id::text || ',',
                       true);
    RETURN NULL;
END
$$;

-- Once per UPDATE statement on queue items: the steps of the step items it ended end the same way, in one
-- UPDATE, each at most once (the step row's state is the claim); a Spark step's outcome and result are its
-- run's (state and metrics). Then their workflows move forward (queue_app_wf_steps_settled). For a statement
-- that ended no step item (every plain settle) this is one lookup of a transaction-local setting.
CREATE OR REPLACE FUNCTION queue_app_wf_statement_settled() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ended text := current_setting('jobsite.workflow_items_ended', true);
    steps bigint[];
BEGIN
    IF ended IS NULL OR ended = '' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('jobsite.workflow_items_ended', '', true);
    WITH settled AS (
        UPDATE queue_app_workflowstep s
        SET state = CASE
                WHEN i.state = 'dead' THEN 'failed'
                WHEN i.state <> 'done' THEN 'cancelled'
                WHEN s.spark_run_id IS NULL THEN 'succeeded'
                ELSE (SELECT CASE r.state WHEN 'succeeded' THEN 'succeeded' WHEN 'cancelled' THEN 'cancelled'
                                          ELSE 'failed' END
                      FROM queue_app_sparkrun r WHERE r.id = s.spark_run_id)
            END,
            result = CASE WHEN s.spark_run_id IS NULL THEN i.result
                          ELSE (SELECT r.metrics FROM queue_app_sparkrun r WHERE r.id = s.spark_run_id) END,
            error = COALESCE(i.error, ''), finished_at = now()
        FROM queue_app_queueitem i
        WHERE i.id = ANY(string_to_array(rtrim(ended, ','), ',')::bigint[])
          AND s.id = i.workflow_step_id AND s.item_id = i.id AND s.state = 'queued'
        RETURNING s.id
    )
    SELECT array_agg(id) INTO steps FROM settled;
    IF steps IS NOT NULL THEN
        PERFORM queue_app_wf_steps_settled(steps);
    END IF;
    RETURN NULL;
END
$$;

ALTER TABLE queue_app_workflowstep SET (fillfactor = 75);
"""


def _previous_functions() -> str:
    """The two functions as migration 0014 created them."""
    text = importlib.import_module("queue_app.migrations.0014_workflows").WORKFLOW_FUNCTIONS
    start = text.index("CREATE FUNCTION queue_app_wf_item_settled()")
    end = text.index("CREATE TRIGGER workflow_step_settled")
    return text[start:end].replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0016_spark_connect_server"),
    ]

    operations = [
        migrations.AlterField(
            model_name="stepdependency",
            name="downstream",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.DB_CASCADE,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="stepdependency",
            name="upstream",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="compensates",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="queue_app.workflowstep",
            ),
        ),
        migrations.AlterField(
            model_name="workflowstep",
            name="workflow",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.DB_CASCADE,
                related_name="steps",
                to="queue_app.workflow",
            ),
        ),
        migrations.RunSQL(
            SETTLE_FUNCTIONS,
            _previous_functions() + "ALTER TABLE queue_app_workflowstep RESET (fillfactor);",
        ),
    ]
