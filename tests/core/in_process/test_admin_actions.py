"""Admin actions: each runs one services.py function on the selected rows, from the change list and from the
detail page (Django 6.1 action locations), writes LogEntries and reports its counts; "all matching this filter"
confirms the count first and changes only matching rows; purge and queue options go through services too."""

from datetime import timedelta

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.messages import get_messages
from django.utils import timezone

from queue_app import services
from queue_app.models import DeadLetter, Queue, QueueItem
from tests.support.admin_fixtures import (
    action_post,
    dead,
    detail_action_post,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    letter_of,
    ready,
    reserved,
    state,
    url,
)

pytestmark = pytest.mark.django_db


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def log_messages(model: str) -> list[str]:
    return list(
        LogEntry.objects.filter(content_type__model=model).order_by("id").values_list("change_message", flat=True)
    )


@pytest.fixture
def spy(monkeypatch):
    """spy("requeue_items") -> the list of calls the admin makes to that services.py function."""

    def watch(name: str) -> list[tuple]:
        calls: list[tuple] = []
        real = getattr(services, name)

        def record(*args, **kwargs):
            calls.append((args, kwargs))
            return real(*args, **kwargs)

        monkeypatch.setattr(services, name, record)
        return calls

    return watch


# -- selected rows, change list -------------------------------------------------------------------------------


def test_requeue_action_requeues_dead_items_and_leaves_the_rest(admin_client, spy):
    calls = spy("requeue_items")
    dead_id, ready_id = dead(), ready()

    response = admin_client.post(url("queueitem"), action_post("requeue", dead_id, ready_id))

    assert response.status_code == 302
    assert (state(dead_id), state(ready_id)) == ("ready", "ready")
    assert sorted(calls[0][0][0]) == sorted([dead_id, ready_id])
    assert calls[0][1] == {"actor": "admin"}
    assert messages_of(response) == [
        f"Requeued 1 of 2 selected queue items; the other 1 were not dead or cancelled and were left alone: {ready_id}."
    ]


def test_requeue_action_writes_a_log_entry_per_selected_item(admin_client):
    dead_ids = [dead(), dead()]

    admin_client.post(url("queueitem"), action_post("requeue", *dead_ids))

    entries = LogEntry.objects.filter(content_type__model="queueitem", action_flag=CHANGE)
    assert sorted(int(e.object_id) for e in entries) == sorted(dead_ids)
    assert all(e.change_message == "Requeued 2 queue items. (admin action requeue)" for e in entries)
    assert {e.user.username for e in entries} == {"admin"}


def test_cancel_action_cancels_ready_and_reserved_items(admin_client, spy):
    calls = spy("cancel_items")
    ready_id, reserved_id, dead_id = ready(), reserved(), dead()

    response = admin_client.post(url("queueitem"), action_post("cancel", ready_id, reserved_id, dead_id))

    assert (state(ready_id), state(reserved_id), state(dead_id)) == ("cancelled", "cancelled", "dead")
    assert len(calls) == 1
    assert messages_of(response) == [
        f"Cancelled 2 of 3 selected queue items; the other 1 were not ready or reserved and were left alone: {dead_id}."
    ]
    logged = LogEntry.objects.filter(content_type__model="queueitem", action_flag=CHANGE)
    assert sorted(int(e.object_id) for e in logged) == sorted([ready_id, reserved_id])  # not the untouched one


def test_retry_now_makes_a_waiting_item_due(admin_client, spy):
    calls = spy("retry_now")
    waiting = ready(delay=3600)

    response = admin_client.post(url("queueitem"), action_post("retry_now", waiting))

    item = QueueItem.objects.get(id=waiting)
    assert item.visible_at <= timezone.now()
    assert len(calls) == 1
    assert messages_of(response) == ["Made 1 queue item due now."]


def test_an_action_that_changes_nothing_says_so_as_a_warning(admin_client):
    ready_id = ready()

    response = admin_client.post(url("queueitem"), action_post("requeue", ready_id), follow=True)

    (message,) = list(response.context["messages"])
    assert message.level_tag == "warning"
    assert str(message).startswith("Requeued 0 of 1 selected queue item;")


def test_requeue_dead_letter_action_requeues_the_item(admin_client, spy):
    calls = spy("requeue_dead_letters")
    item_id = dead()
    letter = letter_of(item_id)

    response = admin_client.post(url("deadletter"), action_post("requeue", letter.pk))

    assert state(item_id) == "ready"
    letter.refresh_from_db()
    assert letter.requeued_by == "admin"
    assert calls[0][0][0] == [letter.pk]
    assert messages_of(response) == ["Requeued the items of 1 dead letter."]
    assert log_messages("deadletter") == ["Requeued the items of 1 dead letter. (admin action requeue)"]


def test_pause_and_resume_queue_actions(admin_client, spy):
    pauses, resumes = spy("pause_queue"), spy("resume_queue")
    ready(queue="mail")
    ready(queue="billing")

    admin_client.post(url("queue"), action_post("pause", "mail", "billing"))
    assert set(Queue.objects.filter(paused=True).values_list("name", flat=True)) == {"mail", "billing"}

    response = admin_client.post(url("queue"), action_post("resume", "mail"))
    assert set(Queue.objects.filter(paused=True).values_list("name", flat=True)) == {"billing"}
    assert (len(pauses), len(resumes)) == (2, 1)
    assert messages_of(response)[-1] == "Resumed 1 queue."
    assert len(log_messages("queue")) == 3


# -- the detail page (ActionLocation.CHANGE_FORM) -------------------------------------------------------------


def test_detail_page_offers_the_actions(admin_client):
    html = admin_client.get(url("queueitem", "change", dead())).content.decode()

    assert 'name="CHANGE_FORM-action"' in html
    assert '<option value="requeue">Requeue this queue item</option>' in html
    assert '<option value="cancel">Cancel this queue item</option>' in html


def test_requeue_from_the_detail_page(admin_client):
    item_id = dead()

    response = admin_client.post(url("queueitem", "change", item_id), detail_action_post("requeue", item_id))

    assert response.status_code == 302
    assert response["Location"] == url("queueitem", "change", item_id)
    assert state(item_id) == "ready"
    assert messages_of(response) == ["Requeued 1 queue item."]
    assert log_messages("queueitem") == ["Requeued 1 queue item. (admin action requeue)"]


def test_requeue_a_dead_letter_from_its_detail_page(admin_client):
    item_id = dead()
    letter = letter_of(item_id)

    admin_client.post(url("deadletter", "change", letter.pk), detail_action_post("requeue", letter.pk))

    assert state(item_id) == "ready"


def test_pause_from_the_queue_detail_page(admin_client):
    ready(queue="mail")

    admin_client.post(url("queue", "change", "mail"), detail_action_post("pause", "mail"))

    assert Queue.objects.get(name="mail").paused


# -- everything matching the filter ---------------------------------------------------------------------------


@pytest.fixture
def dead_in_two_queues() -> dict[str, list[int]]:
    return {
        "mail": [dead(queue="mail") for _ in range(3)],
        "billing": [dead(queue="billing") for _ in range(2)],
    }


def test_requeue_all_matching_confirmation_says_how_many(admin_client, dead_in_two_queues):
    ready(queue="mail")  # matches the queue filter, but is not requeueable

    response = admin_client.get(url("queueitem", "bulk", "requeue"), {"queue__name__exact": "mail"})

    html = response.content.decode()
    assert response.status_code == 200
    assert response.context["count"] == 3
    assert "<strong>3</strong>" in html
    assert "<code>queue__name__exact</code> = <code>mail</code>" in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert all(state(i) == "dead" for i in dead_in_two_queues["mail"])  # a GET changes nothing


def test_requeue_all_matching_requeues_only_matching_rows(admin_client, dead_in_two_queues):
    target = url("queueitem", "bulk", "requeue") + "?queue__name__exact=mail&state__exact=dead"

    response = admin_client.post(target)

    assert response.status_code == 302
    assert response["Location"] == url("queueitem") + "?queue__name__exact=mail&state__exact=dead"
    assert [state(i) for i in dead_in_two_queues["mail"]] == ["ready"] * 3
    assert [state(i) for i in dead_in_two_queues["billing"]] == ["dead"] * 2
    assert messages_of(response) == ["Requeued 3 queue items matching queue__name__exact=mail&state__exact=dead."]
    (entry,) = LogEntry.objects.filter(content_type__model="queueitem")
    assert entry.object_id is None
    assert entry.object_repr == "3 queue items matching queue__name__exact=mail&state__exact=dead"


def test_requeue_all_matching_works_in_chunks(admin_client, dead_in_two_queues, monkeypatch, spy):
    monkeypatch.setattr("queue_app.admin.actions.BULK_CHUNK", 2)
    calls = spy("requeue_items")

    admin_client.post(url("queueitem", "bulk", "requeue") + "?state__exact=dead")

    assert [len(args[0]) for args, _ in calls] == [2, 2, 1]
    assert QueueItem.objects.filter(state="dead").count() == 0


def test_requeue_all_matching_stops_at_its_time_budget_and_offers_the_rest(
    admin_client, dead_in_two_queues, monkeypatch
):
    monkeypatch.setattr("queue_app.admin.actions.BULK_CHUNK", 2)
    monkeypatch.setattr("queue_app.admin.actions.BULK_SECONDS", 0.0)
    target = url("queueitem", "bulk", "requeue") + "?state__exact=dead"

    response = admin_client.post(target)

    assert response["Location"] == target
    assert QueueItem.objects.filter(state="dead").count() == 3
    assert messages_of(response) == [
        "Requeued 2 queue items matching state__exact=dead. More remain: confirm again to continue."
    ]
    assert admin_client.get(target).context["count"] == 3


def test_requeue_all_matching_applies_the_search_too(admin_client):
    wanted = dead(dedup_key="invoice-1")
    other = dead(dedup_key="invoice-2")

    admin_client.post(url("queueitem", "bulk", "requeue") + "?q=invoice-1")

    assert (state(wanted), state(other)) == ("ready", "dead")


def test_select_all_across_pages_goes_to_the_confirmation(admin_client, dead_in_two_queues):
    one = dead_in_two_queues["mail"][0]

    response = admin_client.post(
        url("queueitem") + "?state__exact=dead", action_post("requeue", one, select_across="1")
    )

    assert response.status_code == 302
    assert response["Location"] == url("queueitem", "bulk", "requeue") + "?state__exact=dead"
    assert state(one) == "dead"


def test_requeue_all_matching_dead_letters(admin_client, dead_in_two_queues):
    target = url("deadletter", "bulk", "requeue") + "?item__queue__name__exact=billing"

    assert admin_client.get(target).context["count"] == 2
    admin_client.post(target)

    assert [state(i) for i in dead_in_two_queues["billing"]] == ["ready"] * 2
    assert [state(i) for i in dead_in_two_queues["mail"]] == ["dead"] * 3
    assert DeadLetter.objects.filter(requeued_at__isnull=False).count() == 2


def test_change_lists_link_to_requeue_all_matching_with_their_filter(admin_client, dead_in_two_queues):
    html = admin_client.get(url("queueitem"), {"state__exact": "dead"}).content.decode()

    assert f'href="{url("queueitem", "bulk", "requeue")}?state__exact=dead"' in html


# -- purge and queue options ----------------------------------------------------------------------------------


def test_purge_deletes_items_dead_longer_than_the_age_chosen(admin_client, spy):
    calls = spy("purge_dead_letters")
    old, recent = dead(), dead()
    QueueItem.objects.filter(id=old).update(finished_at=timezone.now() - timedelta(days=10))

    page = admin_client.get(url("deadletter", "purge"))
    response = admin_client.post(url("deadletter", "purge"), {"older_than": "7d"})

    assert [(a["key"], a["count"]) for a in page.context["ages"]] == [("1d", 1), ("7d", 1), ("30d", 0)]
    assert calls[0][0] == (timedelta(days=7),)
    assert not QueueItem.objects.filter(id=old).exists()
    assert state(recent) == "dead"
    assert messages_of(response)[0].startswith("Purged 1 items dead for more than 7 days")
    (entry,) = LogEntry.objects.filter(content_type__model="deadletter")
    assert entry.action_flag == DELETION


def test_queue_options_are_saved_through_the_service(admin_client, spy):
    calls = spy("set_queue_options")
    ready(queue="mail")
    form = {"concurrency_limit": "3", "lease_timeout": "30.0", "max_attempts": "9", "retention": "7 00:00:00"}

    response = admin_client.post(url("queue", "change", "mail"), {**form, "_save": "Save"})

    assert response.status_code == 302
    queue = Queue.objects.get(name="mail")
    assert (queue.concurrency_limit, queue.lease_timeout, queue.max_attempts) == (3, 30.0, 9)
    assert calls == [(("mail",), {"concurrency_limit": 3, "lease_timeout": 30.0, "max_attempts": 9})]
    assert LogEntry.objects.filter(content_type__model="queue", action_flag=CHANGE).count() == 1
