"""Id marks (engine/marks.py): the admin's "created / reserved in the last hour" filters start their walk of the
primary key at the newest mark taken before the window, and list exactly what they list without one. Under
real workers taking marks while transactions of every length enqueue, no row stamped after a mark has an id at
or below it."""

import random
import signal
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from queue_app import engine
from queue_app.models import IdMark, QueueItem, Reservation
from queue_app.registry import get_task
from tests.support.admin_fixtures import fast_password_hashing_fixture, reserved, url  # noqa: F401 (autouse)
from tests.support.waiting import wait_for
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks the workers --import)


def listed(client, model: str, query: str) -> tuple[set[int], list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url(model) + query)
    assert response.status_code == 200
    return {obj.pk for obj in response.context["cl"].result_list}, [q["sql"] for q in queries]


def age(table: str, column: str, ids: list[int], interval: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {table} SET {column} = now() - %s::interval WHERE id = ANY(%s)", [interval, ids])


@pytest.mark.django_db
def test_time_filters_start_at_the_newest_mark_before_the_window_and_list_the_same(admin_client):
    # Two hours ago: three items queued and leased, then a mark (ids at or below it were given out by then).
    old = [reserved(queue="marks") for _ in range(3)]
    old_res = list(Reservation.objects.filter(item_id__in=old).values_list("id", flat=True))
    age("queue_app_queueitem", "created_at", old, "2 hours")
    age("queue_app_reservation", "reserved_at", old_res, "2 hours")
    engine.take_mark()
    with connection.cursor() as cur:
        cur.execute("UPDATE queue_app_idmark SET taken_at = now() - interval '90 minutes'")
    mark = IdMark.objects.get()
    assert mark.item_id >= max(old) and mark.reservation_id >= max(old_res)
    new = [reserved(queue="marks") for _ in range(2)]
    new_res = set(Reservation.objects.filter(item_id__in=new).values_list("id", flat=True))

    items, sql = listed(admin_client, "queueitem", "?created=1h")
    assert items == set(new)
    assert any(f'"queue_app_queueitem"."id" > {mark.item_id}' in s for s in sql), sql
    reservations, sql = listed(admin_client, "reservation", "?reserved=1h")
    assert reservations == new_res
    assert any(f'"queue_app_reservation"."id" > {mark.reservation_id}' in s for s in sql), sql
    # A day's window begins before the mark: no bound, every item listed.
    items, sql = listed(admin_client, "queueitem", "?created=24h")
    assert items == set(old + new)
    assert not any(f'"id" > {mark.item_id}' in s for s in sql)

    # Without marks (a new install): the same lists, the walk unbounded.
    IdMark.objects.all().delete()
    items, sql = listed(admin_client, "queueitem", "?created=1h")
    assert items == set(new) and not any(f'"id" > {mark.item_id}' in s for s in sql)
    assert listed(admin_client, "reservation", "?reserved=1h")[0] == new_res


@pytest.mark.django_db
def test_a_mark_inside_the_window_is_not_used_and_old_marks_are_forgotten():
    engine.take_mark()
    with connection.cursor() as cur:
        cur.execute("UPDATE queue_app_idmark SET taken_at = now() - interval '9 days'")
    assert engine.take_mark() == (1, 1)  # the nine-day-old mark goes; the new one stays
    assert IdMark.objects.count() == 1
    # Another worker's turn a moment later: the mark just taken stands for it.
    assert engine.take_mark(spacing=9.0) == (0, 0) and IdMark.objects.count() == 1
    ready = get_task("queue_app.probe").enqueue({})
    from queue_app.admin.filters import recent

    filt = recent("created_at", "created", "created", mark="item_id")
    listed_ids = filt(None, {"created": ["1h"]}, QueueItem, None).queryset(None, QueueItem.objects.all())
    assert ready.id in set(listed_ids.values_list("id", flat=True))
    assert 'queue_app_queueitem"."id" >' not in str(listed_ids.query)


ENQUEUERS = 4
MARK_EVERY = "0.05"


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # three real run_worker processes
def test_no_row_stamped_after_a_mark_has_an_id_at_or_below_it_under_workers_and_long_transactions(worker):
    """Three real workers take marks every 50 ms (the id_marks unit) and lease; four threads enqueue in
    transactions that sleep up to 300 ms before their insert, so ids are handed out out of stamp order (the case
    a search of created_at over ids would get wrong). The invariant holds for every mark and every row."""
    env = {"JOBSITE_ID_MARK_EVERY": MARK_EVERY}
    workers = [worker(f"w{n}", "--queues", "marks", "--concurrency", "4", env=env) for n in range(3)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def enqueue_slowly(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                with transaction.atomic():
                    # The stamp (now()) is the transaction's start on the server, which is its first statement
                    # (Django begins lazily): start it, then sleep before the insert takes its id.
                    with connection.cursor() as cur:
                        cur.execute("SELECT 1")
                    time.sleep(rng.uniform(0, 0.3))
                    engine.enqueue("queue_app.probe", {}, queue="marks")
                    if rng.random() < 0.5:
                        engine.enqueue_many("queue_app.probe", [{}] * 5, queue="marks")
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=enqueue_slowly, args=(n,)) for n in range(ENQUEUERS)]
    for t in threads:
        t.start()
    wait_for(lambda: IdMark.objects.count() >= 40, 60, what="the workers' id_marks unit to take marks")
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(30)
    wait_for(
        lambda: not QueueItem.objects.filter(queue_id="marks", state__in=["ready", "reserved"]).exists(),
        120,
        what="every item run",
    )
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(60) == 0, proc.log.read_text()
    assert not errors, errors

    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM queue_app_idmark")
        marks = cur.fetchone()[0]
        # The hard case happened: some item got a higher id than another stamped later.
        cur.execute(
            """SELECT count(*) FROM queue_app_item_all a JOIN queue_app_item_all b
               ON b.id > a.id AND b.created_at < a.created_at WHERE a.queue_id = 'marks' AND b.queue_id = 'marks'"""
        )
        out_of_order = cur.fetchone()[0]
        cur.execute(
            """SELECT count(*) FROM queue_app_idmark m JOIN queue_app_item_all i
               ON i.created_at >= m.taken_at AND i.id <= m.item_id"""
        )
        item_breaches = cur.fetchone()[0]
        cur.execute(
            """SELECT count(*) FROM queue_app_idmark m JOIN queue_app_reservation_all r
               ON r.reserved_at >= m.taken_at AND r.id <= m.reservation_id"""
        )
        reservation_breaches = cur.fetchone()[0]
        cur.execute("SELECT count(*) FROM queue_app_item_all WHERE queue_id = 'marks'")
        items = cur.fetchone()[0]
    assert marks >= 40 and items > 50
    assert out_of_order > 0
    assert (item_breaches, reservation_breaches) == (0, 0)
    assert "Traceback" not in "".join(proc.log.read_text() for proc in workers)


@pytest.mark.django_db
def test_the_analytics_start_one_past_the_mark_where_a_search_of_reserved_at_over_ids_misses_a_late_id():
    """Four attempts by id: a (old), s (this hour), r and r2 (stamped old, ids given late: a long transaction).
    The binary search lands on r, takes everything below it for old, and starts past s; the mark taken before
    the hour starts at or below s."""
    from queue_app.spark.pipelines.queue_analytics import first_id_at, lowest_id_at

    items = [reserved(queue="marks") for _ in range(4)]
    a, s, r, r2 = (Reservation.objects.get(item_id=i).id for i in items)
    assert [s, r, r2] == [a + 1, a + 2, a + 3]  # one sequence, nobody else drawing from it
    with connection.cursor() as cur:
        cur.execute("SELECT date_trunc('hour', now())")
        hour = cur.fetchone()[0]
        cur.execute(
            "UPDATE queue_app_reservation SET reserved_at = CASE WHEN id = %s THEN %s ELSE %s END WHERE id = ANY(%s)",
            [s, hour, hour - timedelta(hours=2), [a, s, r, r2]],
        )
        # Taken before the hour, when the sequence stood at a: s, r and r2 got their ids later.
        cur.execute(
            "INSERT INTO queue_app_idmark (taken_at, item_id, reservation_id) VALUES (%s, 0, %s)",
            [hour - timedelta(minutes=30), a],
        )
    connection.ensure_connection()
    raw = connection.connection
    assert first_id_at(raw, hour - timedelta(minutes=10)) > s  # the search's miss, for the record
    assert lowest_id_at(raw, hour) == a + 1 <= s
    IdMark.objects.all().delete()  # no mark: the search, as before
    assert lowest_id_at(raw, hour) == first_id_at(raw, hour - timedelta(minutes=10))
