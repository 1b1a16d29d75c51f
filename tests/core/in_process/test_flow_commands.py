"""`manage.py queue_config`, `enqueue --group-key` and `queue_stats --groups`: flow control on the command line."""

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queue_app import engine, flow, services
from queue_app.models import Queue, QueueItem

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def config(*args: str) -> dict:
    return json.loads(run("queue_config", *args, "--json"))


def test_queue_config_creates_a_queue_with_its_limits():
    settings = config("partner-api", "--rate-limit", "100/1m", "--concurrency", "4", "--group-concurrency", "2")

    assert settings["created"] is True
    assert settings["changed"] == ["concurrency_limit", "group_concurrency", "rate_limit", "rate_period"]
    assert (settings["rate_limit"], settings["rate_limit_count"], settings["rate_period_seconds"]) == (
        "100/1m",
        100,
        60,
    )
    queue = Queue.objects.get(name="partner-api")
    assert (queue.rate_limit, queue.rate_period, queue.concurrency_limit, queue.group_concurrency) == (100, 60, 4, 2)


def test_queue_config_changes_one_limit_and_keeps_the_others():
    config("api", "--rate-limit", "10/30s", "--concurrency", "3")

    settings = config("api", "--concurrency", "none")

    assert settings["created"] is False
    assert (settings["concurrency_limit"], settings["rate_limit"]) == (None, "10/30s")


def test_queue_config_lifts_a_rate_limit():
    config("api", "--rate-limit", "5/h")

    assert config("api", "--rate-limit", "none")["rate_limit"] is None
    assert Queue.objects.get(name="api").rate_period is None


def test_queue_config_without_options_shows_the_queue():
    engine.ensure_queue("api")
    services.set_queue_options("api", group_concurrency=3)

    out = run("queue_config", "api")

    assert out.strip() == "queue api: concurrency unlimited, rate unlimited, group concurrency 3, fair yes"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate-limit", "0/1m"], "--rate-limit N must be an integer >= 1"),
        (["--rate-limit=-5/1m"], "--rate-limit N must be an integer >= 1"),
        (["--rate-limit", "5/0s"], r"--rate-limit PERIOD \(in seconds\) must be an integer number of seconds"),
        (["--rate-limit", "5"], "a rate limit is N/PERIOD such as 100/1m"),
        (["--rate-limit", "5/1w"], "a rate limit is N/PERIOD"),
        (["--rate-limit", "five/1m"], "a rate limit is N/PERIOD"),
        (["--concurrency", "0"], "--concurrency must be an integer >= 1"),
        (["--concurrency", "-2"], "--concurrency must be an integer >= 1"),
        (["--concurrency", "many"], "--concurrency must be an integer"),
        (["--group-concurrency", "0"], "--group-concurrency must be an integer >= 1"),
        (["--group-concurrency", "-1"], "--group-concurrency must be an integer >= 1"),
        (["--group-concurrency", "99999999999"], "--group-concurrency must be an integer >= 1"),
    ],
)
def test_queue_config_bad_input_is_a_command_error_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message):
        run("queue_config", "api", *args)
    assert not Queue.objects.exists()


def test_queue_config_refuses_a_bad_queue_name():
    with pytest.raises(CommandError, match="queue name must match"):
        run("queue_config", "bad queue!", "--concurrency", "2")
    assert not Queue.objects.exists()


@pytest.mark.parametrize(
    ("text", "rate"), [("100/1m", (100, 60)), ("7/m", (7, 60)), ("5 / 2h", (5, 7200)), ("1/1d", (1, 86400))]
)
def test_rates_are_read_as_n_per_period(text, rate):
    assert flow.parse_rate(text) == rate
    assert flow.parse_rate(flow.format_rate(*rate)) == rate


def test_enqueue_with_a_group_key_stores_it():
    run("enqueue", "queue_app.noop", "--count", "3", "--group-key", "customer-7")
    run("enqueue", "queue_app.noop", "--group-key", "customer-8")

    assert sorted(QueueItem.objects.values_list("group_key", flat=True)) == ["customer-7"] * 3 + ["customer-8"]


def test_enqueue_refuses_a_group_key_over_the_size_limit():
    with pytest.raises(CommandError, match="group_key must be a non-empty UTF-8 string of at most 200 characters"):
        run("enqueue", "queue_app.noop", "--group-key", "k" * 201)
    assert not QueueItem.objects.exists()


def test_queue_stats_groups_counts_each_group_key_by_state():
    engine.enqueue_many("queue_app.noop", [{}] * 3, queue="tenants", group_key="a")
    engine.enqueue_many("queue_app.noop", [{}] * 2, queue="tenants", group_key="b")
    engine.enqueue("queue_app.noop", queue="plain")
    (held,) = engine.lease(["tenants"], 1, "w1")
    engine.complete(held)

    stats = {row["queue"]: row for row in json.loads(run("queue_stats", "--json", "--groups"))["queues"]}

    groups = stats["tenants"]["groups"]
    assert (groups["a"]["ready"], groups["a"]["done"], groups["b"]["ready"], groups["b"]["done"]) == (2, 1, 2, 0)
    assert stats["plain"]["groups"] == {}
    assert "groups" not in json.loads(run("queue_stats", "--json"))["queues"][0]


def test_queue_stats_says_which_keys_are_held_back_and_why():
    engine.enqueue_many("queue_app.noop", [{}] * 3, queue="tenants", group_key="a")
    services.set_queue_options("tenants", group_concurrency=1)
    assert len(engine.lease(["tenants"], 10, "w1", lease_timeout=600)) == 1

    (row,) = json.loads(run("queue_stats", "--json"))["queues"]

    assert row["held_back"] == ["group limit 1: 1 key at it ('a')"]


@pytest.mark.django_db(transaction=True)
def test_queue_config_from_the_command_line_exits_1_on_bad_input(manage):
    bad = manage("queue_config", "api", "--rate-limit", "0/1m")
    good = manage("queue_config", "api", "--rate-limit", "100/1m", "--json")

    assert bad.returncode == 1 and "--rate-limit N must be an integer >= 1" in bad.stderr
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["rate_limit"] == "100/1m"


@pytest.mark.django_db(transaction=True)
def test_queue_config_turns_fair_leasing_on_and_off_with_group_weights(manage):
    engine.enqueue_many("queue_app.noop", [{}] * 2, queue="tenants")  # queued while the queue was not fair

    on = manage("queue_config", "tenants", "--fair", "--group-weight", "big=3", "--group-weight", "trial=0.5", "--json")

    assert on.returncode == 0, on.stderr
    settings = json.loads(on.stdout)
    assert (settings["fair"], settings["group_weights"], settings["changed"]) == (
        True,
        {"big": 3, "trial": 0.5},
        ["fair", "group_weights"],
    )
    queue = Queue.objects.get(name="tenants")
    assert (queue.fair, queue.group_weights) == (True, {"big": 3, "trial": 0.5})
    # Through services.set_queue_options, as the admin's form: the items queued without a key join the group ''.
    assert set(QueueItem.objects.values_list("group_key", flat=True)) == {""}
    shown = manage("queue_config", "tenants")
    assert shown.stdout.strip() == (
        "queue tenants: concurrency unlimited, rate unlimited, group concurrency unlimited, fair yes, "
        "group weights big=3 trial=0.5"
    )

    off = manage("queue_config", "tenants", "--no-fair", "--group-weight", "trial=none", "--group-weight", "new=2")

    assert off.returncode == 0, off.stderr
    assert off.stdout.strip().endswith("fair no, group weights big=3 new=2")
    queue.refresh_from_db()
    assert (queue.fair, queue.group_weights) == (False, {"big": 3, "new": 2})


@pytest.mark.django_db(transaction=True)
def test_queue_config_no_fair_keeps_the_turns_a_group_limit_implies(manage):
    result = manage("queue_config", "tenants", "--group-concurrency", "2", "--no-fair", "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["fair"] is True
    assert Queue.objects.get(name="tenants").fair is False


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("weight", "message"),
    [
        ("big=0", "--group-weight big: the weight must be a number above 0 and at most 1000"),
        ("big=1001", "--group-weight big: the weight must be a number above 0 and at most 1000"),
        ("big=nan", "--group-weight big: the weight must be a number above 0 and at most 1000"),
        ("big=lots", "--group-weight big: the weight must be a number above 0"),
        ("=3", "--group-weight is KEY=WEIGHT with KEY a group key"),
        ("big", "--group-weight is KEY=WEIGHT with KEY a group key"),
    ],
)
def test_queue_config_refuses_a_bad_group_weight_and_writes_nothing(manage, weight, message):
    engine.ensure_queue("tenants")
    services.set_queue_options("tenants", group_weights={"small": 2})

    result = manage("queue_config", "tenants", "--fair", "--group-weight", "ok=2", "--group-weight", weight)

    assert result.returncode == 1 and message in result.stderr, result.stderr
    queue = Queue.objects.get(name="tenants")
    assert (queue.fair, queue.group_weights) == (False, {"small": 2})
