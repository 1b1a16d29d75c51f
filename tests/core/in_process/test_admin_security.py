"""Admin security: an action needs its custom permission (not offered without it, 403 when posted anyway, and
nothing changes), CSRF protects every state change, and markup in payloads and errors is shown, never run."""

import pytest
from django.test import Client

from queue_app.models import Queue
from tests.support.admin_fixtures import (
    action_post,
    dead,
    detail_action_post,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    letter_of,
    ready,
    staff_client_fixture,  # noqa: F401
    state,
    url,
)

pytestmark = pytest.mark.django_db


def action_names(response) -> set[str]:
    form = response.context["action_form"]
    return set() if form is None else {name for name, _ in form.fields["action"].choices if name}


# -- requeue --------------------------------------------------------------------------------------------------


def test_staff_without_requeue_permission_is_not_offered_requeue(staff_client):
    client = staff_client("cancel_queueitem")
    item_id = dead()

    assert action_names(client.get(url("queueitem"))) == {"cancel"}
    assert action_names(client.get(url("queueitem", "change", item_id))) == {"cancel"}
    assert action_names(client.get(url("deadletter"))) == set()
    assert "all matching" not in client.get(url("queueitem")).content.decode()


def test_posting_requeue_without_the_permission_is_refused_and_changes_nothing(staff_client):
    client = staff_client("cancel_queueitem")
    item_id = dead()
    letter = letter_of(item_id)

    responses = [
        client.post(url("queueitem"), action_post("requeue", item_id)),
        client.post(url("queueitem", "change", item_id), detail_action_post("requeue", item_id)),
        client.post(url("deadletter"), action_post("requeue", letter.pk)),
        client.post(url("deadletter", "change", letter.pk), detail_action_post("requeue", letter.pk)),
        client.post(url("queueitem"), action_post("retry_now", item_id)),
    ]

    assert [r.status_code for r in responses] == [403] * 5
    assert state(item_id) == "dead"
    letter.refresh_from_db()
    assert letter.requeued_at is None


def test_requeue_all_matching_without_the_permission_is_refused(staff_client):
    client = staff_client("cancel_queueitem")
    item_id = dead()

    assert client.get(url("queueitem", "bulk", "requeue") + "?state__exact=dead").status_code == 403
    assert client.post(url("queueitem", "bulk", "requeue") + "?state__exact=dead").status_code == 403
    assert client.post(url("deadletter", "bulk", "requeue")).status_code == 403
    assert state(item_id) == "dead"


def test_staff_with_requeue_permission_can_requeue(staff_client):
    client = staff_client("requeue_queueitem")
    item_id = dead()

    assert "requeue" in action_names(client.get(url("queueitem")))
    assert client.post(url("queueitem"), action_post("requeue", item_id)).status_code == 302
    assert state(item_id) == "ready"


# -- cancel ---------------------------------------------------------------------------------------------------


def test_staff_without_cancel_permission_can_neither_see_nor_post_cancel(staff_client):
    client = staff_client("requeue_queueitem")
    item_id = ready()

    assert "cancel" not in action_names(client.get(url("queueitem")))
    assert client.post(url("queueitem"), action_post("cancel", item_id)).status_code == 403
    assert client.post(url("queueitem", "change", item_id), detail_action_post("cancel", item_id)).status_code == 403
    assert client.post(url("queueitem", "bulk", "cancel")).status_code == 403
    assert state(item_id) == "ready"


# -- pause ----------------------------------------------------------------------------------------------------


def test_staff_without_pause_permission_can_neither_see_nor_post_pause(staff_client):
    client = staff_client("requeue_queueitem", "cancel_queueitem")
    ready(queue="mail")

    assert action_names(client.get(url("queue"))) == set()
    assert client.post(url("queue"), action_post("pause", "mail")).status_code == 403
    assert client.post(url("queue", "change", "mail"), detail_action_post("pause", "mail")).status_code == 403
    assert not Queue.objects.get(name="mail").paused


def test_staff_with_pause_permission_can_pause(staff_client):
    client = staff_client("pause_queue")
    ready(queue="mail")

    assert action_names(client.get(url("queue"))) == {"pause", "resume"}
    client.post(url("queue"), action_post("pause", "mail"))
    assert Queue.objects.get(name="mail").paused


# -- purge ----------------------------------------------------------------------------------------------------


def test_purge_needs_the_delete_dead_letter_permission(staff_client):
    client = staff_client("requeue_queueitem")
    item_id = dead()

    assert "Purge old dead letters" not in client.get(url("deadletter")).content.decode()
    assert client.get(url("deadletter", "purge")).status_code == 403
    assert client.post(url("deadletter", "purge"), {"older_than": "1d"}).status_code == 403
    assert state(item_id) == "dead"


def test_an_unknown_action_name_is_refused(admin_client):
    item_id = dead()

    assert admin_client.post(url("queueitem"), action_post("delete_selected", item_id)).status_code == 403
    assert state(item_id) == "dead"


# -- CSRF -----------------------------------------------------------------------------------------------------


@pytest.fixture
def csrf_client(admin_user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    return client


def test_actions_without_a_csrf_token_are_refused(csrf_client):
    item_id = dead()
    letter = letter_of(item_id)

    responses = [
        csrf_client.post(url("queueitem"), action_post("requeue", item_id)),
        csrf_client.post(url("queueitem", "change", item_id), detail_action_post("requeue", item_id)),
        csrf_client.post(url("deadletter"), action_post("requeue", letter.pk)),
        csrf_client.post(url("queueitem", "bulk", "requeue")),
        csrf_client.post(url("deadletter", "purge"), {"older_than": "1d"}),
        csrf_client.post(url("queue"), action_post("pause", "mail")),
    ]

    assert [r.status_code for r in responses] == [403] * 6
    assert state(item_id) == "dead"
    assert not Queue.objects.get(name="mail").paused


def test_actions_with_the_csrf_token_go_through(csrf_client):
    item_id = dead()
    page = csrf_client.get(url("queueitem"))
    token = page.context["csrf_token"]

    response = csrf_client.post(url("queueitem"), action_post("requeue", item_id, csrfmiddlewaretoken=str(token)))

    assert response.status_code == 302
    assert state(item_id) == "ready"


# -- markup in data -------------------------------------------------------------------------------------------

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def test_a_payload_with_a_script_is_escaped_in_the_list_and_the_detail(admin_client):
    item_id = dead(payload={"x": SCRIPT}, reason=f"poison {SCRIPT}", error=f"error {SCRIPT}", traceback=SCRIPT)

    pages = {
        "item list": url("queueitem"),
        "item detail": url("queueitem", "change", item_id),
        "dead letters": url("deadletter"),
        "dead letter detail": url("deadletter", "change", letter_of(item_id).pk),
        "reservations": url("reservation"),
        "overview": "/admin/",
    }
    for name, page in pages.items():
        html = admin_client.get(page).content.decode()
        assert SCRIPT not in html, name
    assert ESCAPED in admin_client.get(url("queueitem")).content.decode()
    assert ESCAPED in admin_client.get(url("queueitem", "change", item_id)).content.decode()
