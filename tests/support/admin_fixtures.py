"""Helpers and fixtures for tests/test_admin_*.py (imported by them, not by conftest.py): queue rows in each
state made through the engine, staff users with chosen permissions, and the admin's URLs."""

from datetime import timedelta

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from queue_app import engine
from queue_app.models import DeadLetter, QueueItem, Worker

LONG = 3600.0


def url(model: str, view: str = "changelist", *args) -> str:
    """The admin URL of a jobsite model's view, under its app's label (the core's or a layer app's)."""
    return reverse(f"admin:{app_label_of(model)}_{model}_{view}", args=args)


JOBSITE_LABELS = ("queue_app", "jobsite_spark", "jobsite_workflows", "jobsite_datasets", "jobsite_webhooks")


def app_label_of(model_name: str) -> str:
    """The app label of jobsite's model `model_name` (lower case): queue_app, or the layer app that owns it."""
    from django.apps import apps

    return next(
        model._meta.app_label
        for label in JOBSITE_LABELS
        for model in apps.get_app_config(label).get_models()
        if model._meta.model_name == model_name
    )


def ready(task: str = "t.ready", payload=None, *, queue: str = "mail", **options) -> int:
    return engine.enqueue(task, payload if payload is not None else {"n": 1}, queue=queue, **options).id


def _started(task: str, payload, queue: str, **options) -> engine.Lease:
    """Enqueue an item and lease it. It goes first (priority 100), so other ready items stay ready."""
    item_id = ready(task, payload, queue=queue, priority=100, **options)
    (held,) = engine.lease([queue], 1, "worker-1", lease_timeout=LONG)
    assert held.item_id == item_id
    return held


def reserved(task: str = "t.reserved", *, queue: str = "mail", **options) -> int:
    return _started(task, None, queue, **options).item_id


def done(task: str = "t.done", *, queue: str = "mail", **options) -> int:
    held = _started(task, None, queue, **options)
    engine.complete(held, {"ok": True})
    return held.item_id


def failed(task: str = "t.retry", *, queue: str = "mail", error: str = "TimeoutError: upstream") -> int:
    """An item whose first attempt failed; it waits for its retry (an hour away)."""
    held = _started(task, None, queue)
    engine.fail(held, error, retry_in=LONG)
    return held.item_id


def dead(
    task: str = "t.dead",
    payload=None,
    *,
    queue: str = "mail",
    reason: str = "poison: unknown task",
    error: str = "KeyError: 't.dead'",
    traceback: str = 'Traceback (most recent call last):\n  File "handler.py", line 1\nKeyError: t.dead',
    **options,
) -> int:
    held = _started(task, payload, queue, **options)
    engine.dead(held, reason, error, traceback=traceback)
    return held.item_id


def cancelled(task: str = "t.cancelled", *, queue: str = "mail") -> int:
    from queue_app import services

    item_id = ready(task, queue=queue)
    services.cancel_items([item_id])
    return item_id


def letter_of(item_id: int) -> DeadLetter:
    return DeadLetter.objects.get(item_id=item_id)


def state(item_id: int) -> str:
    return QueueItem.objects.get(id=item_id).state


def live_worker(worker_id: str = "worker-1", *, age: timedelta = timedelta(0), **fields) -> Worker:
    now = timezone.now()
    values = {
        "host": "host-1",
        "pid": 4242,
        "queues": [],
        "concurrency": 4,
        "started_at": now - age - timedelta(minutes=5),
        "last_heartbeat": now - age,
        "state": "running",
        "stats": {"processed": 7, "failed": 2},
    }
    values.update(fields)
    return Worker.objects.create(id=worker_id, **values)


def action_post(action: str, *pks, **extra) -> dict:
    """The POST of the change list's action form."""
    return {"action": action, "index": "0", "_selected_action": [str(pk) for pk in pks], **extra}


def detail_action_post(action: str, pk) -> dict:
    """The POST of the detail page's action form (Django 6.1: prefixed with the CHANGE_FORM location)."""
    return {"CHANGE_FORM-action": action, "index": "0", "_selected_action": [str(pk)]}


# Test modules import these by their function names (`*_fixture`) and use them by fixture name.


@pytest.fixture(name="fast_password_hashing", autouse=True)
def fast_password_hashing_fixture(settings):
    """Users made here need no key stretching (the default hasher spends ~1.5 s per password on this box)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(name="staff_client")
def staff_client_fixture(db, django_user_model):
    """staff_client("requeue_queueitem", ...) -> a logged-in Client of a staff user with exactly those
    queue_app permissions (codenames), plus view permission on every queue screen."""

    def make(*codenames: str, username: str = "staff") -> Client:
        user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
        views = ["view_queueitem", "view_deadletter", "view_reservation", "view_queue", "view_worker"]
        user.user_permissions.set(
            Permission.objects.filter(content_type__app_label__in=JOBSITE_LABELS, codename__in=[*views, *codenames])
        )
        client = Client()
        client.force_login(user)
        return client

    return make
