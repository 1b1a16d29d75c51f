"""The workflow settle triggers fire only for a statement that ended a step item (queue_app/workflows/sql.py,
ITEM_ENDED_FUNCTION and TRIGGERS). The statement trigger workflow_steps_settled fired on every UPDATE of an item's
state, every settle and every lease included, to find nothing to do: 0.05 ms of a 0.45 ms lease of one item.

Now the row trigger's WHEN notes each step item that ended, just after its row's update (queue_app_wf_item_ended,
which answers false: no row event is queued), and the statement trigger's WHEN, evaluated as the statement's
update ends, asks whether any was noted. The same steps end, in the same statement, in one UPDATE as before.

The frozen copy of what changed, as queue_app/workflows/sql.py has it now (tests/workflows/in_process/
test_workflow_sql_source.py compares the migrated database with the module).
"""

from django.db import migrations

ITEM_ENDED = """
CREATE OR REPLACE FUNCTION queue_app_wf_item_ended(item_id bigint) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('jobsite.workflow_items_ended',
                       COALESCE(current_setting('jobsite.workflow_items_ended', true), '') || item_id::text || ',',
                       true);
    RETURN false;
END
$$;
"""

TRIGGERS = """
CREATE OR REPLACE TRIGGER workflow_step_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
    WHEN (CASE WHEN NEW.workflow_step_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
                    AND OLD.state IS DISTINCT FROM NEW.state
               THEN queue_app_wf_item_ended(NEW.id) ELSE false END)
    EXECUTE FUNCTION queue_app_wf_item_settled();
CREATE OR REPLACE TRIGGER workflow_steps_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH STATEMENT
    WHEN (current_setting('jobsite.workflow_items_ended', true) <> '')
    EXECUTE FUNCTION queue_app_wf_statement_settled();
"""

# As migration 0021 installed them.
TRIGGERS_BEFORE = """
CREATE OR REPLACE TRIGGER workflow_step_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH ROW
    WHEN (NEW.workflow_step_id IS NOT NULL AND NEW.state IN ('done', 'dead', 'cancelled')
          AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION queue_app_wf_item_settled();
CREATE OR REPLACE TRIGGER workflow_steps_settled AFTER UPDATE OF state ON queue_app_queueitem FOR EACH STATEMENT
    EXECUTE FUNCTION queue_app_wf_statement_settled();
"""


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0051_item_queue_moved_after_update")]

    operations = [
        migrations.RunSQL(
            ITEM_ENDED + TRIGGERS,
            reverse_sql=TRIGGERS_BEFORE + "DROP FUNCTION queue_app_wf_item_ended(bigint);",
        )
    ]
