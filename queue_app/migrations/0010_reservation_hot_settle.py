"""The done settle's reservation update becomes a HOT update: no index names a column it changes (finished_at and
outcome lose the index reservation_finished; the failure counts read not_done_at, a stored generated column the
done settle leaves NULL), and the table leaves half of each page free for the new row versions (fillfactor 50:
a page's reservations are leased together and completed together, so the page needs room for all of them;
pages written before keep their fill)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('queue_app', '0009_sparkrun_open_item'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='reservation',
            name='reservation_finished',
        ),
        migrations.AddField(
            model_name='reservation',
            name='not_done_at',
            field=models.GeneratedField(db_persist=True, expression=models.Case(models.When(models.Q(('outcome', 'done'), _negated=True), then=models.F('finished_at'))), output_field=models.DateTimeField(blank=True, null=True)),
        ),
        migrations.RunSQL(
            "ALTER TABLE queue_app_reservation SET (fillfactor = 50)",
            "ALTER TABLE queue_app_reservation RESET (fillfactor)",
        ),
        migrations.AddIndex(
            model_name='reservation',
            index=models.Index(models.F('not_done_at'), condition=models.Q(('not_done_at__isnull', False)), name='reservation_not_done'),
        ),
    ]
