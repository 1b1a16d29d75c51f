"""Which of the engine's statements a call ran on this test's database session: psycopg prepares each statement
of the engine on first use (engine/db.py), and `pg_prepared_statements` counts each one's runs (its generic plus
its custom plans), so a count that grew during the call says that statement ran."""

import re
import threading
from collections.abc import Callable, Iterable

from django.db import connection

from queue_app.engine import sql


def positional(text: str) -> tuple[str, int]:
    """`text` as psycopg sends it to be prepared (each %(name)s numbered $n in the order the names first appear),
    and how many parameters it has."""
    names: list[str] = []

    def number(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text), len(names)


def _runs() -> dict[str, int]:
    with connection.cursor() as cur:
        cur.execute("SELECT statement, generic_plans + custom_plans FROM pg_prepared_statements")
        return dict(cur.fetchall())


def which_ran(call: Callable[[], object], names: Iterable[str]) -> list[str]:
    """Of the engine's statements `names` (sql.NAME), those that `call` ran on this session, in the order given."""
    before = _runs()
    call()
    ran = {text for text, runs in _runs().items() if runs > before.get(text, 0)}
    return [name for name in names if positional(getattr(sql, name))[0] in ran]


def plans_on_a_projects_connection(call: Callable[[], object], names: Iterable[str]) -> dict[str, tuple]:
    """Run `call` in a thread of its own, whose connection is a new session and a project's, not the worker's
    (this test's thread may have been marked as a worker's by a test before it: engine_session_here), and return
    how the engine's statements `names` were planned there: {name: (plan_cache_mode, generic plans, custom
    plans)}. A project's connection keeps PostgreSQL's plan choice (`auto`), which plans a prepared statement
    with its values five times and then keeps the generic plan, unless that plan looks dearer than planning
    anew; then every later run is planned again."""
    found: dict[str, tuple] = {}
    failed: list[BaseException] = []

    def run() -> None:
        try:
            call()
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT statement, current_setting('plan_cache_mode'), generic_plans, custom_plans"
                    " FROM pg_prepared_statements"
                )
                counts = {text: rest for text, *rest in cur.fetchall()}
            for name in names:
                found[name] = tuple(counts.get(positional(getattr(sql, name))[0], ()))
        except BaseException as exc:  # reported in the test's own thread
            failed.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    if failed:
        raise failed[0]
    return found
