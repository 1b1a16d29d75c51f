from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("queue_app", "0010_reservation_hot_settle")]

    # A nullable column without a default: a catalog change only, no table rewrite. No index names it, so the
    # at-most-once start (which writes it) stays a HOT update.
    operations = [
        migrations.AddField(
            model_name="reservation",
            name="started_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
