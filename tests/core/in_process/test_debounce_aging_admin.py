"""Debounce and aging in the admin (issue 41): the item page shows the absorbed enqueues and the effective
priority, the queue form sets the aging rate through the services and refuses a bad one."""

import pytest

from queue_app import engine, services
from queue_app.models import Queue
from tests.support.admin_fixtures import ready, url

pytestmark = pytest.mark.django_db

GOOD = {"concurrency_limit": "", "lease_timeout": "30.0", "max_attempts": "5", "retention": "7 00:00:00"}


def test_item_page_shows_absorbed_enqueues_and_effective_priority(admin_client):
    services.configure_queue("mail", aging_rate=2.0)
    for n in range(3):
        item = engine.enqueue("t.debounced", {"n": n}, queue="mail", debounce_key="k", debounce=30)
    html = admin_client.get(url("queueitem", "change", item.id)).content.decode()
    assert "2 enqueues of its debounce key absorbed" in html
    assert "aging 2 points/s while due" in html
    plain = ready(queue="other")
    html = admin_client.get(url("queueitem", "change", plain)).content.decode()
    assert "the queue has no aging" in html


def test_queue_form_sets_and_refuses_the_aging_rate(admin_client):
    ready(queue="mail")
    response = admin_client.post(url("queue", "change", "mail"), {**GOOD, "aging_rate": "0.5", "_save": "Save"})
    assert response.status_code == 302
    assert Queue.objects.get(name="mail").aging_rate == 0.5
    assert "aging 0.5/s" in admin_client.get(url("queue")).content.decode()
    refused = admin_client.post(url("queue", "change", "mail"), {**GOOD, "aging_rate": "-1", "_save": "Save"})
    assert refused.status_code == 200 and "aging_rate must be" not in refused.content.decode()
    assert "above 0" in refused.content.decode()
    assert Queue.objects.get(name="mail").aging_rate == 0.5
