"""Flow control in the admin: the queue form's rate, group and fairness options (saved through the services,
logged, refused with the reason when a queue could not run with them), the overview's "held back" column, and
search by group key."""

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User

from queue_app import engine, services
from queue_app.models import Queue
from tests.support.admin_fixtures import ready, url
from tests.support.queue_helpers import all_rows

pytestmark = pytest.mark.django_db

GOOD = {"concurrency_limit": "", "lease_timeout": "30.0", "max_attempts": "5", "retention": "7 00:00:00"}


def post(client, **fields):
    return client.post(url("queue", "change", "mail"), {**GOOD, **fields, "_save": "Save"})


def test_queue_form_sets_flow_control_through_the_services(admin_client):
    ready(queue="mail")

    response = post(
        admin_client,
        rate_limit="100",
        rate_period="60",
        group_concurrency="2",
        group_weights='{"gold": 3}',
    )

    assert response.status_code == 302
    queue = Queue.objects.get(name="mail")
    assert (queue.rate_limit, queue.rate_period, queue.group_concurrency) == (100, 60, 2)
    assert queue.group_weights == {"gold": 3}
    assert LogEntry.objects.filter(content_type__model="queue", action_flag=CHANGE).count() == 1
    listing = admin_client.get(url("queue")).content.decode()
    assert "rate 100/1m, 2 per group key, fair" in listing


def test_changing_only_the_rate_period_keeps_the_limit(admin_client):
    ready(queue="mail")
    services.set_queue_options("mail", rate_limit=10, rate_period=60)

    assert post(admin_client, rate_limit="10", rate_period="3600").status_code == 302

    assert Queue.objects.values_list("rate_limit", "rate_period").get(name="mail") == (10, 3600)


BAD = {
    "rate-zero": ({"rate_limit": "0", "rate_period": "60"}, "rate_limit", "an integer >= 1"),
    "rate-negative": ({"rate_limit": "-3", "rate_period": "60"}, "rate_limit", "greater than or equal to 0"),
    "period-zero": ({"rate_limit": "5", "rate_period": "0"}, "rate_period", "integer number of seconds from 1"),
    "period-missing": ({"rate_limit": "5"}, "rate_period", "must be given with the other"),
    "limit-missing": ({"rate_period": "60"}, "rate_limit", "must be given with the other"),
    "group-zero": ({"group_concurrency": "0"}, "group_concurrency", "an integer >= 1"),
    "weight-zero": ({"group_weights": '{"a": 0}'}, "group_weights", "weights from 0 (excluded)"),
    "weight-key-long": ({"group_weights": '{"' + "k" * 201 + '": 1}'}, "group_weights", "an object of at most"),
    "weights-not-json": ({"group_weights": "{nope"}, "group_weights", "Enter a valid JSON"),
}


@pytest.mark.parametrize(("fields", "field", "message"), BAD.values(), ids=BAD.keys())
def test_queue_form_refuses_flow_options_a_queue_cannot_run_with(admin_client, fields, field, message):
    ready(queue="mail")
    before, stored = all_rows(), Queue.objects.values().get(name="mail")

    response = post(admin_client, **fields)

    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors[field])
    assert Queue.objects.values().get(name="mail") == stored
    assert all_rows() == before


def test_a_viewer_cannot_change_flow_control(client):
    ready(queue="mail")
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_queue"))
    client.force_login(viewer)

    response = post(client, rate_limit="1", rate_period="1")

    assert response.status_code == 403
    assert Queue.objects.get(name="mail").rate_limit is None


@pytest.mark.django_db(transaction=True)
def test_overview_shows_which_queues_and_keys_are_held_back_and_why(admin_client):
    engine.enqueue_many("t", [{}] * 5, queue="partner-api")
    services.set_queue_options("partner-api", rate_limit=2, rate_period=3600)
    engine.enqueue_many("t", [{}] * 3, queue="tenants", group_key="acme")
    engine.enqueue("t", queue="tenants", group_key="tiny")
    services.set_queue_options("tenants", group_concurrency=1)
    engine.enqueue("t", queue="free")
    engine.lease(["partner-api", "tenants"], 10, "w1", lease_timeout=600)

    html = admin_client.get("/admin/").content.decode()

    rows = {chunk.split('"', 1)[0]: chunk for chunk in html.split('data-queue="')[1:]}
    assert "rate limit 2/1h: 2 leased in this window, next in" in rows["partner-api"]
    assert "group limit 1: 1 key at it (&#x27;acme&#x27;)" in rows["tenants"]  # tiny has nothing waiting
    assert 'class="held-back">-</td>' in rows["free"]


def test_items_are_found_by_their_group_key(admin_client):
    mine = ready(queue="tenants", group_key="customer-42")
    ready(queue="tenants", group_key="customer-7")

    response = admin_client.get(url("queueitem"), {"q": "customer-42"})

    assert [item.id for item in response.context["cl"].result_list] == [mine]
