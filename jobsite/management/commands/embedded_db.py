"""``manage.py embedded_db start|stop|status|url|psql``: the embedded PostgreSQL (jobsite/embedded_pg/)."""

import os
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobsite import embedded_pg

EMBEDDED_ENGINE = "jobsite.embedded_backend"


class Command(BaseCommand):
    help = (
        "Manage the embedded PostgreSQL used when DATABASE_URL is unset: start it, stop it (pg_ctl -m fast), "
        "show its status, print its connection URL, or open psql on it."
    )
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "status", "url", "psql"])
        parser.add_argument(
            "--database",
            default=None,
            help="Database name for url/psql (default: the NAME in settings, i.e. 'jobsite').",
        )

    def handle(self, *args, action, database, **options):
        default = settings.DATABASES["default"]
        embedded = default.get("ENGINE") == EMBEDDED_ENGINE
        if not embedded and action != "stop":
            self.stderr.write(
                self.style.WARNING("DATABASE_URL is set: the project does not use the embedded database now.")
            )
        dbname = database or (default.get("NAME") if embedded else None) or "jobsite"
        try:
            getattr(self, f"do_{action}")(dbname)
        except embedded_pg.EmbeddedPostgresUnavailable as exc:
            raise CommandError(str(exc)) from exc

    def do_start(self, dbname):
        before = embedded_pg.status()
        started = time.monotonic()
        params = embedded_pg.ensure_running()
        created = embedded_pg.ensure_database(dbname, params)
        took = time.monotonic() - started
        verb = "already running" if before["running"] else f"ready in {took:.2f}s"
        self.stdout.write(f"embedded PostgreSQL {verb}: socket {params['host']} (port {params['port']})")
        if created:
            self.stdout.write(f"created database {dbname!r}")
        self.stdout.write(embedded_pg.uri(dbname, params))

    def do_stop(self, dbname):
        if embedded_pg.stop():
            self.stdout.write("embedded PostgreSQL stopped")
        else:
            self.stdout.write("embedded PostgreSQL is not running")

    def do_status(self, dbname):
        info = embedded_pg.status()
        width = max(len(k) for k in info)
        for key, value in info.items():
            self.stdout.write(f"{key.ljust(width)}  {value}")
        if info["running"]:
            self.stdout.write(f"{'url'.ljust(width)}  {embedded_pg.uri(dbname, info)}")

    def do_url(self, dbname):
        self.stdout.write(embedded_pg.uri(dbname))

    def do_psql(self, dbname):
        psql = embedded_pg.psql_executable()
        if psql is None:
            raise CommandError("psql not found; install the PostgreSQL client (e.g. `apt install postgresql-client`)")
        url = embedded_pg.uri(dbname)
        self.stdout.flush()
        os.execv(psql, [psql, url])
