"""Autoscaling signals (queue_app/autoscaling.py): the suggested worker count on /metrics and in
`queue_stats --json` follows the formula of docs/how-to/autoscaling.md, and the KEDA ScaledObject on that page
selects a series a live /metrics serves, with the value the database state calls for."""

import json
import math
import re
import socket
import urllib.request

import pytest
import yaml
from django.core.management import call_command
from prometheus_client.parser import text_string_to_metric_families

from queue_app import engine, services
from queue_app.models import QueueItem
from tests.support.admin_fixtures import done, live_worker, ready, reserved
from tests.support.paths import ROOT
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db

PAGE = ROOT / "docs" / "how-to" / "autoscaling.md"
# A PromQL instant vector selector: metric{label="value", ...}, possibly inside an aggregation (max(...)).
SELECTOR = re.compile(r"\b(jobsite_[a-z_]+)\s*\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*=\s*"([^"]*)"')


def scaled_object() -> dict:
    """The ScaledObject of the docs page, as KEDA would read it."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.S)
    documents = [yaml.safe_load(block) for block in blocks]
    found = [d for d in documents if isinstance(d, dict) and d.get("kind") == "ScaledObject"]
    assert len(found) == 1, "the page shows one ScaledObject"
    return found[0]


def documented_selector() -> tuple[str, dict[str, str]]:
    (trigger,) = scaled_object()["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    query = trigger["metadata"]["query"]
    match = SELECTOR.search(query)
    assert match, f"no metric selector in the documented query {query!r}"
    matchers = dict(MATCHER.findall(match.group(2)))
    # only equality matchers: what this test checks is what KEDA selects
    assert len(matchers) == match.group(2).count("="), query
    return match.group(1), matchers


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metrics(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return samples(response.content.decode())


def queue_stats_json() -> dict[str, dict]:
    from io import StringIO

    out = StringIO()
    call_command("queue_stats", "--json", stdout=out)
    return {q["queue"]: q for q in json.loads(out.getvalue())["queues"]}


# -- the formula ----------------------------------------------------------------------------------------------


def test_the_suggestion_drains_the_backlog_within_the_target_at_the_measured_rate(client, settings):
    """mail: one live worker completed 30 items in the last 5 minutes (0.1/s); 13 ready + 1 in flight to drain
    in 60 s need ceil(14 / (0.1 * 60)) = 3 workers."""
    settings.JOBSITE = {"AUTOSCALE_TARGET_DRAIN_SECONDS": 60.0, "AUTOSCALE_MAX_WORKERS": 20}
    live_worker("worker-1", queues=["mail"])
    for _ in range(30):
        done(queue="mail")
    for _ in range(13):
        ready(queue="mail")
    reserved(queue="mail")
    mail = (("queue", "mail"),)

    values = metrics(client)
    stats = queue_stats_json()["mail"]

    assert values["jobsite_queue_throughput_per_worker", mail] == pytest.approx(30 / 300)
    assert values["jobsite_queue_suggested_workers", mail] == math.ceil(14 / (0.1 * 60)) == 3
    assert values["jobsite_queue_in_flight", mail] == 1
    assert stats["suggested_workers"] == 3 and stats["throughput_per_worker"] == pytest.approx(0.1)
    assert stats["in_flight"] == 1 and stats["workers_alive"] == 1
    assert stats["ready"] == 13 and stats["reserved"] == 1  # the existing fields keep their names and meaning

    settings.JOBSITE = {"AUTOSCALE_TARGET_DRAIN_SECONDS": 15.0, "AUTOSCALE_MAX_WORKERS": 20}
    assert metrics(client)["jobsite_queue_suggested_workers", mail] == math.ceil(14 / (0.1 * 15)) == 10
    settings.JOBSITE = {"AUTOSCALE_TARGET_DRAIN_SECONDS": 15.0, "AUTOSCALE_MAX_WORKERS": 4}
    assert metrics(client)["jobsite_queue_suggested_workers", mail] == 4  # bounded by the cap


def test_without_a_measured_rate_the_suggestion_keeps_at_least_one_worker_and_none_without_work(client):
    ready(queue="mail")
    live_worker("worker-1", queues=["billing"])  # serves another queue: billing has no work, mail no rate
    reserved(queue="billing")
    QueueItem.objects.filter(queue_id="billing").update(state="done")  # billing: nothing ready or in flight

    values = metrics(client)
    stats = queue_stats_json()

    assert values["jobsite_queue_suggested_workers", (("queue", "mail"),)] == 1
    assert ("jobsite_queue_throughput_per_worker", (("queue", "mail"),)) not in values  # unknown: no sample
    assert stats["mail"]["throughput_per_worker"] is None and stats["mail"]["suggested_workers"] == 1
    assert values["jobsite_queue_suggested_workers", (("queue", "billing"),)] == 0
    assert stats["billing"]["suggested_workers"] == 0


def test_a_paused_queue_asks_workers_only_for_what_is_in_flight(client, settings):
    """0.1 items/s per worker (30 completed by one worker in 5 minutes), 60 s to drain: 6 items a worker."""
    settings.JOBSITE = {"AUTOSCALE_TARGET_DRAIN_SECONDS": 60.0}
    live_worker("worker-1", queues=["mail"])
    for _ in range(30):
        done(queue="mail")
    in_flight = reserved(queue="mail")
    for _ in range(11):
        ready(queue="mail")
    mail = (("queue", "mail"),)
    assert metrics(client)["jobsite_queue_suggested_workers", mail] == 2  # ceil(12 / 6)

    services.pause_queue("mail")
    assert metrics(client)["jobsite_queue_suggested_workers", mail] == 1  # ceil(1 / 6): the one in flight

    QueueItem.objects.filter(id=in_flight).update(state="done")
    assert metrics(client)["jobsite_queue_suggested_workers", mail] == 0


# -- the documented KEDA query against a live /metrics --------------------------------------------------------


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        assert response.status == 200
        return response.read().decode()


def _answers(port: int) -> bool:
    try:
        return bool(_get(port, "/metrics"))
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_documented_keda_query_finds_the_suggestion_on_a_live_metrics_endpoint(spawn):
    """The ScaledObject's query, read from the docs page, selects a series that a running site (`runserver`)
    serves with the query's labels: 0 while the queue is empty, and with N ready items (no worker has measured a
    rate yet) ready == N and a suggestion of one worker, which KEDA's activation threshold of 0 scales up from."""
    name, matchers = documented_selector()
    assert name == "jobsite_queue_suggested_workers"
    queue = matchers["queue"]
    engine.enqueue("t.warm", queue=queue)
    QueueItem.objects.filter(queue_id=queue).update(state="done")  # the queue exists, with nothing to do
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn("runserver", f"127.0.0.1:{port}", "--noreload")
    wait_for(lambda: _answers(port), timeout=120, what="the site to answer")

    selected = tuple(sorted(matchers.items()))
    before = samples(_get(port, "/metrics"))
    assert before[name, selected] == 0

    n = 7
    engine.enqueue_many("t.backlog", [{"i": i} for i in range(n)], queue=queue)
    after = samples(_get(port, "/metrics"))

    assert after["jobsite_queue_depth", tuple(sorted({**matchers, "state": "ready"}.items()))] == n
    assert after[name, selected] == 1 > float(scaled_object()["spec"]["triggers"][0]["metadata"]["activationThreshold"])
    assert [key for key in after if key[0] == name and dict(key[1]).items() >= matchers.items()] == [(name, selected)]
