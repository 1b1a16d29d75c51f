"""The admin across the split: archived items and reservations have their lists (filters, exact search by id and
key) and detail pages, an old link to an item that moved leads to its history page, a cancelled item is requeued
from history, and dead letters (whose items stay hot) keep working."""

import pytest
from django.contrib.admin.models import LogEntry
from django.db import connection, transaction

from queue_app import engine
from queue_app.models import ItemHistory, QueueItem, ReservationHistory
from tests.support.admin_fixtures import (
    action_post,
    cancelled,
    dead,
    done,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    letter_of,
    url,
)

pytestmark = pytest.mark.django_db(transaction=True)


def archive(*ids: int) -> None:
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE queue_app_queueitem SET finished_at = now() - interval '1 hour' WHERE id = ANY(%s)", [list(ids)]
        )
    with transaction.atomic():
        engine.archive(1000, grace=60)
    assert ItemHistory.objects.filter(id__in=ids).count() == len(ids)


def listed(response) -> set[int]:
    return {obj.pk for obj in response.context["cl"].result_list}


@pytest.fixture
def archived() -> dict[str, int]:
    made = {"done": done(dedup_key="order-42"), "other": done("t.other", queue="billing"), "cancelled": cancelled()}
    archive(*made.values())
    made["dead"] = dead()
    return made


def test_history_lists_filter_and_search(admin_client, archived):
    assert listed(admin_client.get(url("itemhistory"))) == {archived["done"], archived["other"], archived["cancelled"]}
    assert listed(admin_client.get(url("itemhistory"), {"queue": "billing"})) == {archived["other"]}
    assert listed(admin_client.get(url("itemhistory"), {"state": "cancelled"})) == {archived["cancelled"]}
    assert listed(admin_client.get(url("itemhistory"), {"finished": "24h"})) == set(archived.values()) - {
        archived["dead"]
    }
    assert listed(admin_client.get(url("itemhistory"), {"q": f"#{archived['other']}"})) == {archived["other"]}
    assert listed(admin_client.get(url("itemhistory"), {"q": "order-42"})) == {archived["done"]}
    assert listed(admin_client.get(url("itemhistory"), {"q": "no-such-key"})) == set()
    reservations = admin_client.get(url("reservationhistory"), {"q": str(archived["done"])})
    assert {r.item_id for r in reservations.context["cl"].result_list} == {archived["done"]}


def test_an_archived_item_has_a_detail_page_and_old_links_lead_to_it(admin_client, archived):
    page = admin_client.get(url("itemhistory", "change", archived["done"]))
    assert page.status_code == 200
    assert "attempt timeline" in page.content.decode().lower()
    res = ReservationHistory.objects.filter(item_id=archived["done"]).first()
    assert admin_client.get(url("reservationhistory", "change", res.pk)).status_code == 200
    moved = admin_client.get(url("queueitem", "change", archived["done"]))
    assert moved.status_code == 302 and moved["Location"] == url("itemhistory", "change", archived["done"])


def test_a_cancelled_item_is_requeued_from_history(admin_client, archived):
    response = admin_client.post(url("itemhistory"), action_post("requeue", archived["cancelled"], archived["done"]))
    assert response.status_code == 302
    assert QueueItem.objects.get(id=archived["cancelled"]).state == "ready"
    assert not ItemHistory.objects.filter(id=archived["cancelled"]).exists()
    assert ItemHistory.objects.get(id=archived["done"]).state == "done"  # a done item is not requeued
    (entry,) = LogEntry.objects.all()  # the requeue is in the admin log, naming the item where it now is
    assert (entry.content_type.model, entry.object_id) == ("queueitem", str(archived["cancelled"]))


def test_the_item_list_says_where_the_finished_items_went(admin_client, archived):
    """The archiver moves finished items out of the item list: it names Item history with their count, for the
    list's queue and finished state; a list of unfinished states has no such note."""
    html = admin_client.get(url("queueitem")).content.decode()
    assert f'<a href="{url("itemhistory")}"><strong>3</strong> in Item history</a>' in html
    html = admin_client.get(url("queueitem"), {"queue__name__exact": "mail", "state__exact": "done"}).content.decode()
    assert f'<a href="{url("itemhistory")}?queue=mail&amp;state=done"><strong>1</strong> in Item history</a>' in html
    assert listed(admin_client.get(url("itemhistory"), {"queue": "mail", "state": "done"})) == {archived["done"]}
    html = admin_client.get(url("queueitem"), {"state__exact": "ready"}).content.decode()
    assert "in Item history" not in html
    moved = ReservationHistory.objects.count()  # the archived items' attempts
    html = admin_client.get(url("reservation")).content.decode()
    link = f'<a href="{url("reservationhistory")}"><strong>{moved}</strong> in Reservation history</a>'
    assert moved and link in html


def test_the_task_filters_name_the_tasks_of_archived_items(admin_client, archived):
    """A finished item's task (registered or not) stays in the task filters once the archiver moved the item."""
    for model in ("itemhistory", "queueitem"):
        filters = admin_client.get(url(model)).context["cl"].filter_specs
        (tasks,) = [spec for spec in filters if getattr(spec, "parameter_name", "") == "task"]
        assert {"t.other", "t.cancelled", "t.done"} <= {name for name, _ in tasks.lookup_choices}, model


def test_dead_letters_keep_their_items_in_the_hot_table(admin_client, archived):
    letter = letter_of(archived["dead"])
    assert admin_client.get(url("deadletter")).status_code == 200
    assert admin_client.get(url("deadletter", "change", letter.pk)).status_code == 200
    assert QueueItem.objects.filter(id=archived["dead"]).exists()
