"""Sub-workflows (issue 48): a sub-workflow step whose child its workflow's start transaction made (its row written
linked, child_workflow_id set) queues no start item when it becomes ready; the trigger workflow_child_start fires
only for a step with no child linked yet (workflows/children.py).
"""

from django.db import migrations

# queue_app/workflows/sql.py's trigger, as of this migration (frozen: never import it from there).
INSTALL = r"""
CREATE OR REPLACE TRIGGER workflow_child_start AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'workflow' AND NEW.state = 'queued' AND OLD.state = 'waiting'
          AND NEW.child_workflow_id IS NULL)
    EXECUTE FUNCTION queue_app_wf_child_start();
"""
# 0043's trigger.
DROP = r"""
CREATE OR REPLACE TRIGGER workflow_child_start AFTER UPDATE OF state ON queue_app_workflowstep FOR EACH ROW
    WHEN (NEW.kind = 'workflow' AND NEW.state = 'queued' AND OLD.state = 'waiting')
    EXECUTE FUNCTION queue_app_wf_child_start();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("queue_app", "0044_part48_dynamic_partitions"),
    ]

    operations = [migrations.RunSQL(INSTALL, DROP)]
