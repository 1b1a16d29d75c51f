"""jobsite in a Django project that is not jobsite's, as a new user adopts it (docs/how-to/adopt.md).

The wheel is built from this checkout and installed, with only its core dependencies, into a fresh virtualenv
beside a project made by Django's `startproject`, which adds `queue_app` to INSTALLED_APPS, one `include()` to its
URLs and the `django.tasks` backend to its settings, and nothing else of jobsite. Then, as real processes in that
virtualenv: `check` is clean, `migrate` runs, a view enqueues inside `transaction.atomic()` (and through
`django.tasks`), `run_worker --burst` runs both items, every jobsite admin page answers 200 with its content, and
`manage.py test` is Django's own runner. None of the layers' libraries (pyspark, plotly, graphviz, openlineage,
the OpenTelemetry SDK) is installed there, so a page or command that needed one would fail; the same script also
asserts none was imported.

One module-scoped build (the wheel, the virtualenv, the project, its database) shared by the tests; pip reuses its
download cache, so a run after the first installs from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from tests.support.paths import ROOT

HEAVY = ("pyspark", "plotly", "graphviz", "openlineage", "opentelemetry.sdk", "pandas", "httpx")

# django_db: pytest-django sets up only the databases the collected tests use, and the fixture below creates the
# adopter's database on the test server (run alone, this file would otherwise talk to the development database).
pytestmark = [pytest.mark.slow, pytest.mark.django_db]

SETTINGS_TAIL = """
INSTALLED_APPS += ["queue_app", "shop"]
DATABASES = {{"default": {{
    "ENGINE": "django.db.backends.postgresql", "NAME": {name!r}, "HOST": {host!r}, "PORT": {port!r},
    "USER": {user!r},
}}}}
TASKS = {{"default": {{"BACKEND": "queue_app.tasks_backend.QueueBackend", "QUEUES": []}}}}
"""

URLS = """
from django.contrib import admin
from django.urls import include, path

from shop.views import order

urlpatterns = [
    path("admin/", admin.site.urls),
    path("order/", order),
    path("jobsite/", include("queue_app.urls")),
]
"""

SHOP_TASKS = """
from django.tasks import task
from queue_app.registry import job


@job("shop.ship")
def ship(payload, ctx):
    from shop.models import Order

    Order.objects.filter(pk=payload["order"]).update(shipped=True)


@job("shop.out_of_stock")
def out_of_stock(payload, ctx):
    raise RuntimeError("no stock left")


@task()
def receipt(order_id):
    from shop.models import Order

    Order.objects.filter(pk=order_id).update(receipt=True)
"""

SHOP_MODELS = """
from django.db import models


class Order(models.Model):
    shipped = models.BooleanField(default=False)
    receipt = models.BooleanField(default=False)
"""

SHOP_VIEWS = """
from django.db import transaction
from django.http import JsonResponse

from queue_app import engine
from shop.models import Order
from shop.tasks import receipt


def order(request):
    with transaction.atomic():  # the order and its items commit together, or not at all
        placed = Order.objects.create()
        item = engine.enqueue("shop.ship", {"order": placed.pk})
        engine.enqueue("shop.out_of_stock", {"order": placed.pk}, max_attempts=1)  # a dead letter to look at
        result = receipt.enqueue(placed.pk)
    return JsonResponse({"order": placed.pk, "item": item.id, "task": str(result.id)})
"""

SHOP_TESTS = """
from django.test import TestCase

from shop.models import Order


class OrderTests(TestCase):
    def test_an_order_starts_unshipped(self):
        self.assertFalse(Order.objects.create().shipped)
"""

# Run inside the adopter's project (manage.py shell): every jobsite page of the admin, as a superuser.
PAGES = """
import json, sys
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from queue_app.models import DeadLetter, QueueItem, Reservation

user = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw")
client = Client(HTTP_HOST="localhost")
client.force_login(user)
item = QueueItem.objects.order_by("id").first()
urls = {"overview": reverse("admin:queue_app_queue_overview"), "index": reverse("admin:index")}
for model in admin.site._registry:
    if model._meta.app_label == "queue_app":
        name = model._meta.model_name
        urls[name] = reverse(f"admin:queue_app_{name}_changelist")
        first = model._default_manager.order_by("pk").first()
        if first is not None:
            urls[name + " detail"] = reverse(f"admin:queue_app_{name}_change", args=[first.pk])
answers = {}
for what, url in urls.items():
    try:
        response = client.get(url)
        answers[what] = [response.status_code, len(response.content), url]
    except Exception as exc:  # the client re-raises a view's exception: report it with the page's name
        answers[what] = [500, f"{type(exc).__name__}: {exc}"[:300], url]
heavy = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY_ROOTS or m.startswith("opentelemetry.sdk"))
print(json.dumps({"pages": answers, "heavy": heavy, "item_state": item.state if item else None}))
"""


def _run(venv_python: Path, *args: str, cwd: Path, timeout: float = 180, env: dict | None = None):
    result = subprocess.run(
        [str(venv_python), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )
    return result


@pytest.fixture(scope="module")
def adopter(tmp_path_factory, django_db_setup, django_db_blocker):
    """A startproject project in a fresh virtualenv with jobsite's wheel (core only), on a database of its own."""
    from django.db import connection

    base = tmp_path_factory.mktemp("adopter")
    wheels = base / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = next(wheels.glob("jobsite-*.whl"))

    venv.create(base / "venv", with_pip=True)
    python = base / "venv" / "bin" / "python"
    installed = _run(
        python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel), cwd=base, timeout=600
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    project = base / "site"
    project.mkdir()
    made = _run(python, "-m", "django", "startproject", "mysite", str(project), cwd=base)
    assert made.returncode == 0, made.stderr
    shop = project / "shop"
    shop.mkdir()
    (shop / "__init__.py").write_text("")
    (shop / "models.py").write_text(SHOP_MODELS)
    (shop / "tasks.py").write_text(SHOP_TASKS)
    (shop / "views.py").write_text(SHOP_VIEWS)
    (shop / "tests.py").write_text(SHOP_TESTS)
    (shop / "migrations").mkdir()
    (shop / "migrations" / "__init__.py").write_text("")

    with django_db_blocker.unblock():
        params = connection.get_connection_params()
        name = f"adopter_{os.getpid()}"
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cursor.execute(f'CREATE DATABASE "{name}"')
    settings = project / "mysite" / "settings.py"
    settings.write_text(
        settings.read_text()
        + SETTINGS_TAIL.format(
            name=name, host=params.get("host", ""), port=str(params.get("port", "")), user=params.get("user", "")
        )
    )
    (project / "mysite" / "urls.py").write_text(URLS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DJANGO_", "JOBSITE_", "OTEL_"))}
    env.pop("DATABASE_URL", None)
    env["PYTHONPATH"] = ""

    def manage(*args: str, timeout: float = 180):
        return _run(python, "manage.py", *args, cwd=project, timeout=timeout, env=env)

    made = manage("makemigrations", "shop")
    assert made.returncode == 0, made.stderr
    yield {"manage": manage, "python": python, "base": base, "project": project}
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cursor.execute(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')


def test_the_core_installs_without_the_layers_libraries(adopter):
    listed = _run(adopter["python"], "-m", "pip", "list", "--format", "json", cwd=adopter["base"])
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert "jobsite" in names and "django" in names
    assert not names & {
        "pyspark",
        "plotly",
        "graphviz",
        "openlineage-python",
        "opentelemetry-sdk",
        "pgserver",
        "httpx",
        "gunicorn",
        "whitenoise",
        "django-environ",
        "pandas",
    }


def test_an_adopters_project_checks_migrates_enqueues_runs_and_shows_every_page(adopter):
    manage = adopter["manage"]
    checked = manage("check")
    assert checked.returncode == 0, checked.stderr
    assert "no issues" in checked.stdout
    migrated = manage("migrate", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr

    # A view enqueues in the transaction of its own write, through the engine and through django.tasks.
    ordered = manage(
        "shell",
        "-c",
        "import json; from django.test import Client; "
        "r = Client(HTTP_HOST='localhost').get('/order/'); print(json.dumps([r.status_code, r.json()]))",
    )
    assert ordered.returncode == 0, ordered.stderr
    status, placed = json.loads(ordered.stdout.strip().splitlines()[-1])
    assert status == 200 and placed["item"] > 0

    ran = manage("run_worker", "--burst", "--pool", "thread", timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    done = manage("shell", "-c", "from shop.models import Order; o = Order.objects.get(); print(o.shipped, o.receipt)")
    assert done.stdout.split()[-2:] == ["True", "True"], done.stderr

    # The demo's datasets, workflows and schedules are the jobsite project's, not this project's.
    demo = manage(
        "shell",
        "-c",
        "from queue_app.datasets.models import Dataset; "
        "from queue_app.workflows.definition import registered_workflows as w; "
        "print(Dataset.objects.filter(name__startswith='demo.').count(), sorted(d.name for d in w()))",
    )
    assert demo.returncode == 0, demo.stderr
    assert demo.stdout.split()[-2:] == ["0", "[]"]

    script = PAGES.replace("HEAVY_ROOTS", repr(sorted(m for m in HEAVY if "." not in m)))
    shown = manage("shell", "-c", textwrap.dedent(script), timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    report = json.loads(shown.stdout.strip().splitlines()[-1])
    pages = report["pages"]
    assert {"overview", "queueitem detail", "reservation detail", "deadletter detail", "queue detail"} <= set(pages)
    assert {"worker detail", "schedule detail"} <= set(pages)
    assert not {"sparkrun", "sparkscript", "workflow"} & set(pages)  # the Spark and workflows apps are not installed
    assert "dataset" not in pages and "datasetcheckresult" not in pages  # nor the datasets app
    assert "webhookendpoint" not in pages and "webhookdelivery" not in pages  # nor the webhooks app
    assert {what: answer for what, answer in pages.items() if answer[0] != 200} == {}
    assert report["heavy"] == []
    assert report["item_state"] == "done"


def test_the_adopters_test_command_is_djangos(adopter):
    tested = adopter["manage"]("test", "shop", "--noinput", timeout=300)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "Ran 1 test" in tested.stderr and "OK" in tested.stderr
    assert "pytest" not in tested.stdout + tested.stderr


def add_layer(adopter, extra: str, *added: str) -> None:
    """Add the apps to the project's INSTALLED_APPS before their extra: check fails naming each extra to install
    (jobsite.E114), not an ImportError. Then install `jobsite[extra]` from the wheel: check is clean and migrate
    runs."""
    settings = adopter["project"] / "mysite" / "settings.py"
    settings.write_text(settings.read_text() + f"\nINSTALLED_APPS += {list(added)!r}\n")
    without = adopter["manage"]("check")
    assert without.returncode != 0 and "Traceback" not in without.stderr, without.stderr[-3000:]
    for name in extra.split(","):
        assert "jobsite.E114" in without.stderr and f"pip install 'jobsite[{name}]'" in without.stderr, without.stderr

    wheel = next((adopter["base"] / "wheels").glob("jobsite-*.whl"))
    installed = _run(
        adopter["python"], "-m", "pip", "install", "-q", "--disable-pip-version-check",
        f"jobsite[{extra}] @ {wheel.as_uri()}", cwd=adopter["base"], timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]

    checked = adopter["manage"]("check")
    assert checked.returncode == 0, checked.stderr
    assert "no issues" in checked.stdout
    migrated = adopter["manage"]("migrate", "-v", "0")
    assert migrated.returncode == 0, migrated.stderr


def test_the_spark_and_workflows_apps_are_added_with_their_extras(adopter):
    """First of the layers (each step changes the shared project): without them there is no `workflow` or
    `spark_run` command; with `jobsite[spark,workflows]` and `queue_app.spark`, `queue_app.workflows` added, check
    is clean, migrate runs, `workflow list` runs and their admin pages answer."""
    manage = adopter["manage"]
    for command in ("workflow", "spark_run"):
        absent = manage(command, "--help")
        assert absent.returncode != 0 and f"Unknown command: '{command}'" in absent.stderr

    add_layer(adopter, "spark,workflows", "queue_app.spark", "queue_app.workflows")
    listed = manage("workflow", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []  # the adopter declares none; the demo's are not there
    shown = manage(
        "shell",
        "-c",
        "import json; from django.contrib.auth import get_user_model; from django.test import Client; "
        "c = Client(HTTP_HOST='localhost'); c.force_login(get_user_model().objects.get(username='boss')); "
        "pages = ['/admin/jobsite_spark/sparkrun/', '/admin/jobsite_spark/sparkscript/', "
        "'/admin/jobsite_workflows/workflow/', '/admin/jobsite_workflows/workflow/start/']; "
        "print(json.dumps({p: c.get(p).status_code for p in pages}))",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert set(json.loads(shown.stdout.strip().splitlines()[-1]).values()) == {200}


def test_the_datasets_app_is_added_with_its_extra(adopter):
    """After Spark and workflows, which it builds on: without the datasets app there is no `dataset` command; with
    `jobsite[datasets]` installed and `queue_app.datasets` added, check is clean, migrate runs, the datasets'
    admin pages answer and `dataset list` runs."""
    manage = adopter["manage"]
    absent = manage("dataset", "list")
    assert absent.returncode != 0 and "Unknown command: 'dataset'" in absent.stderr

    add_layer(adopter, "datasets", "queue_app.datasets")
    listed = manage("dataset", "list")
    assert listed.returncode == 0, listed.stderr
    shown = manage(
        "shell",
        "-c",
        "import json; from django.contrib.auth import get_user_model; from django.test import Client; "
        "c = Client(HTTP_HOST='localhost'); c.force_login(get_user_model().objects.get(username='boss')); "
        "pages = ['/admin/jobsite_datasets/dataset/', '/admin/jobsite_datasets/datasetcheckresult/']; "
        "print(json.dumps({p: c.get(p).status_code for p in pages}))",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert set(json.loads(shown.stdout.strip().splitlines()[-1]).values()) == {200}


def test_the_webhooks_app_is_added_with_its_extra(adopter):
    """After the datasets (it changes the shared project too): without the webhooks app there is no `webhooks`
    command and a published event goes nowhere; with `jobsite[webhooks]` and `queue_app.webhooks` added, check is
    clean, migrate runs, its admin pages answer, `webhooks add` and `webhooks list` run, and the core's
    events.publish reaches the endpoint as a delivery."""
    manage = adopter["manage"]
    absent = manage("webhooks", "list")
    assert absent.returncode != 0 and "Unknown command: 'webhooks'" in absent.stderr
    nowhere = manage("shell", "-c", "from queue_app import events; print(events.publish('test', {'n': 1}))")
    assert nowhere.returncode == 0 and nowhere.stdout.strip().splitlines()[-1] == "[]", nowhere.stderr[-3000:]

    add_layer(adopter, "webhooks", "queue_app.webhooks")
    added = manage("webhooks", "add", "https://93.184.216.34/in", "--event", "test")
    assert added.returncode == 0, added.stderr[-3000:]
    listed = manage("webhooks", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [e["url"] for e in json.loads(listed.stdout)] == ["https://93.184.216.34/in"]
    shown = manage(
        "shell",
        "-c",
        "import json; from django.contrib.auth import get_user_model; from django.test import Client; "
        "from queue_app import events; "
        "made = events.publish('test', {'n': 2}); "
        "c = Client(HTTP_HOST='localhost'); c.force_login(get_user_model().objects.get(username='boss')); "
        "pages = ['/admin/jobsite_webhooks/webhookendpoint/', '/admin/jobsite_webhooks/webhookdelivery/', "
        "f'/admin/jobsite_webhooks/webhookdelivery/{made[0].pk}/change/']; "
        "print(json.dumps({'made': len(made), 'pages': {p: c.get(p).status_code for p in pages}}))",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-3000:]
    report = json.loads(shown.stdout.strip().splitlines()[-1])
    assert report["made"] == 1
    assert set(report["pages"].values()) == {200}, report
