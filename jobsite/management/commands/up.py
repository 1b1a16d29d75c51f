"""``manage.py up``: everything needed to use jobsite locally, in one command.

Database (the embedded PostgreSQL unless DATABASE_URL is set) -> ``migrate`` -> ``collectstatic`` -> an
``admin`` superuser with a generated password (printed once) -> gunicorn (WhiteNoise serves the static files)
and the queue worker (``manage.py run_worker``), supervised: a crashed worker is restarted, Ctrl-C / SIGTERM
stops both, and then the embedded PostgreSQL if this ``up`` started it (one already running, say from
``manage.py embedded_db start``, is left running, and a DATABASE_URL server is never touched).
"""

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command, get_commands
from django.core.management.base import BaseCommand, CommandError
from django.db import IntegrityError, connections

from jobsite import embedded_pg, system_packages
from queue_app.conf import queue_settings

EMBEDDED_ENGINE = "jobsite.embedded_backend"
STOP_GRACE = 30.0  # seconds children get to finish after SIGTERM before they are killed
RESTART_BACKOFF_MAX = 30.0


def _child_setup_factory():
    """preexec_fn for children: own process group (a terminal Ctrl-C reaches only `up`, which then stops the
    children in order) and, on Linux, SIGTERM when `up` dies without cleaning up (no orphaned gunicorn)."""
    prctl = None
    if sys.platform == "linux":
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            prctl = None

    def setup():
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return setup


def _gunicorn_has_setting(name):
    try:
        from gunicorn.config import KNOWN_SETTINGS
    except ImportError:
        return False
    return any(getattr(setting, "name", None) == name for setting in KNOWN_SETTINGS)


class _Child:
    def __init__(self, name, cmd, restart):
        self.name = name
        self.cmd = cmd
        self.restart = restart
        self.proc = None
        self.started_at = 0.0
        self.backoff = 1.0
        self.restart_at = None

    def start(self, preexec):
        self.proc = subprocess.Popen(self.cmd, cwd=settings.BASE_DIR, stdin=subprocess.DEVNULL, preexec_fn=preexec)
        self.started_at = time.monotonic()
        self.restart_at = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, signum):
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)


class Command(BaseCommand):
    help = (
        "Start jobsite: database, migrations, static files, an admin user, the web server (gunicorn) and the "
        "queue worker. Ctrl-C stops it."
    )

    def add_arguments(self, parser):
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
        parser.add_argument("--no-worker", action="store_true", help="do not start the queue worker")
        parser.add_argument(
            "--workers", type=int, default=1, help="number of queue worker processes (manage.py run_worker)"
        )
        parser.add_argument("--web-workers", type=int, default=2, help="gunicorn worker processes")
        parser.add_argument(
            "--spark-connect",
            action="store_true",
            help="also run the Spark Connect server for warm Spark runs (manage.py spark_connect_server) at "
            "JOBSITE_SPARK_CONNECT (default sc://127.0.0.1:15002), which the workers then use",
        )

    # -- output ---------------------------------------------------------------------------------------------
    def say(self, message, style=None):
        self.stdout.write(style(message) if style else message)
        self.stdout.flush()

    # -- steps ----------------------------------------------------------------------------------------------
    def handle(self, *args, **opts):
        try:
            self.run(**opts)
        finally:
            self.stop_embedded_database()

    def run(self, **opts):
        started = time.monotonic()
        host, port = opts["host"], opts["port"]
        self.check_port_free(host, port)
        if opts["spark_connect"]:
            from queue_app.spark import connect

            os.environ.setdefault(connect.ENV, f"sc://127.0.0.1:{connect.DEFAULT_PORT}")  # the children inherit it
            try:
                connect.configured()
            except connect.ConnectConfigError as exc:
                raise CommandError(str(exc)) from None

        default = settings.DATABASES["default"]
        if default.get("ENGINE") == EMBEDDED_ENGINE:
            try:
                params = embedded_pg.ensure_running()
            except embedded_pg.EmbeddedPostgresUnavailable as exc:
                raise CommandError(str(exc)) from exc
            if embedded_pg.started_here():
                self.say(f"database: embedded PostgreSQL, socket {params['host']} (started here: stopped on exit)")
            else:
                self.say(f"database: embedded PostgreSQL, socket {params['host']} (already running: left running)")
        else:
            where = default.get("HOST") or "local socket"
            self.say(f"database: {default.get('NAME')} on {where} (DATABASE_URL)")

        system_packages.ensure(["java", "jdbc", "graphviz"])  # Spark runs, the workflow graph; the rest works without
        call_command("migrate", interactive=False, verbosity=max(0, opts["verbosity"] - 1))
        queue_db = queue_settings.DATABASE
        if queue_db != "default":  # the queue on a database of its own (QUEUE_DATABASE_URL): its tables there
            call_command("migrate", database=queue_db, interactive=False, verbosity=max(0, opts["verbosity"] - 1))
        self.say("migrations applied")
        call_command("collectstatic", interactive=False, verbosity=0)
        self.say(f"static files collected in {settings.STATIC_ROOT}")
        self.ensure_admin()
        connections.close_all()

        children = [self.web_child(host, port, opts["web_workers"])]
        children += self.worker_children(0 if opts["no_worker"] else opts["workers"])
        if opts["spark_connect"]:
            manage = str(settings.BASE_DIR / "manage.py")
            children.append(_Child("spark-connect", [sys.executable, manage, "spark_connect_server"], restart=True))
            self.say(f"spark connect server: {os.environ['JOBSITE_SPARK_CONNECT']} (warm Spark runs)")
        code = self.supervise(children, host, port, started)
        if code:
            sys.exit(code)

    def stop_embedded_database(self) -> bool:
        """Stop the embedded PostgreSQL if this process started it; True if it did. Not one that was running
        before `up` (another `up`, `embedded_db start`), and never a DATABASE_URL server."""
        if not embedded_pg.started_here():  # with DATABASE_URL nothing here ever starts it
            return False
        connections.close_all()
        if not embedded_pg.stop():
            return False
        self.say(
            "embedded PostgreSQL stopped (`up` started it; start it first with `python3 manage.py embedded_db "
            "start` to keep it running)"
        )
        return True

    def check_port_free(self, host, port):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                raise CommandError(
                    f"cannot listen on {host}:{port} ({exc.strerror}); pick another with --port"
                ) from exc

    def ensure_admin(self):
        user_model = get_user_model()
        username_field = user_model.USERNAME_FIELD
        if user_model._default_manager.filter(**{username_field: "admin"}).exists():
            self.say("superuser 'admin' exists (forgot its password? python3 manage.py changepassword admin)")
            return
        password = secrets.token_urlsafe(16)
        try:
            user_model._default_manager.create_superuser(**{username_field: "admin"}, email="", password=password)
        except IntegrityError:  # created concurrently
            self.say("superuser 'admin' exists (forgot its password? python3 manage.py changepassword admin)")
            return
        self.say("created superuser  admin  with password  " + password, self.style.SUCCESS)
        self.say("  (shown only this once; change it with: python3 manage.py changepassword admin)")

    def web_child(self, host, port, web_workers):
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        cmd = [
            sys.executable, "-m", "gunicorn", "jobsite.wsgi",
            "--bind", bind,
            "--workers", str(max(1, web_workers)),
            "--chdir", str(settings.BASE_DIR),
            "--access-logfile", "-",
            "--graceful-timeout", "10",
        ]  # fmt: skip
        if _gunicorn_has_setting("control_socket_disable"):
            # recent gunicorn opens a control socket at a fixed path (~/.gunicorn/gunicorn.ctl) shared by
            # every instance of the user; this one does not need it.
            cmd.append("--no-control-socket")
        return _Child("web", cmd, restart=False)

    def worker_children(self, count):
        if count <= 0:
            return []
        if "run_worker" not in get_commands():
            self.say("queue worker: `manage.py run_worker` does not exist yet; starting the web server only")
            return []
        manage = str(settings.BASE_DIR / "manage.py")
        cmd = [sys.executable, manage, "run_worker"]
        return [_Child(f"worker-{i + 1}" if count > 1 else "worker", cmd, restart=True) for i in range(count)]

    # -- supervision ----------------------------------------------------------------------------------------
    def supervise(self, children, host, port, started):
        signals_seen = []

        def on_signal(signum, frame):
            signals_seen.append(signum)

        old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        preexec = _child_setup_factory()
        try:
            for child in children:
                child.start(preexec)
            self.wait_listening(children[0], host, port, started)
            exit_code = 0
            while not signals_seen:
                for child in children:
                    if child.proc.poll() is None:
                        if child.restart_at is None and time.monotonic() - child.started_at > 60:
                            child.backoff = 1.0  # healthy for a minute: reset the backoff
                        continue
                    if not child.restart:
                        self.say(
                            f"{child.name} exited with code {child.proc.returncode}; stopping",
                            self.style.ERROR,
                        )
                        exit_code = child.proc.returncode or 1
                        signals_seen.append(None)
                        break
                    now = time.monotonic()
                    if child.restart_at is None:
                        child.restart_at = now + child.backoff
                        self.say(
                            f"{child.name} exited with code {child.proc.returncode}; "
                            f"restarting in {child.backoff:.0f}s",
                            self.style.WARNING,
                        )
                        child.backoff = min(child.backoff * 2, RESTART_BACKOFF_MAX)
                    elif now >= child.restart_at:
                        child.start(preexec)
                time.sleep(0.2)
            self.stop_children(children, signals_seen)
            return exit_code
        finally:
            for child in children:  # never leave a child behind, whatever happened above
                child.signal(signal.SIGKILL)
            for signum, handler in old.items():
                signal.signal(signum, handler)

    def wait_listening(self, web, host, port, started):
        deadline = time.monotonic() + 30
        target = "127.0.0.1" if host in ("0.0.0.0", "") else ("::1" if host == "::" else host)
        while time.monotonic() < deadline and web.alive():
            try:
                with socket.create_connection((target, port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        else:
            return  # gunicorn died or is slow; the supervision loop reports it
        shown = "localhost" if host in ("0.0.0.0", "::", "127.0.0.1", "::1") else host
        self.say(
            f"jobsite is up in {time.monotonic() - started:.1f}s: http://{shown}:{port}/admin/  (Ctrl-C to stop)",
            self.style.SUCCESS,
        )
        self.say_workflows()

    def say_workflows(self):
        """What a new user can run next: the registered workflows (demo_pipeline needs no parameters)."""
        from queue_app.workflows import registered_workflows

        names = [d.name for d in registered_workflows()]
        if names:
            self.say(f"workflows: {', '.join(names)}  (try: python3 manage.py workflow start demo_pipeline --wait)")

    def stop_children(self, children, signals_seen):
        self.say("stopping ...")
        for child in children:
            child.signal(signal.SIGTERM)  # gunicorn: graceful; run_worker: finish or release in-flight work
        escalated = len(signals_seen)
        deadline = time.monotonic() + STOP_GRACE
        while any(child.alive() for child in children):
            if len(signals_seen) > escalated:  # a second Ctrl-C: quick shutdown
                escalated = len(signals_seen)
                self.say("stopping now")
                for child in children:
                    child.signal(signal.SIGINT if child.name == "web" else signal.SIGTERM)
            if time.monotonic() > deadline or len(signals_seen) > 2:
                self.say("killing what is left", self.style.WARNING)
                for child in children:
                    child.signal(signal.SIGKILL)
                break
            time.sleep(0.1)
        for child in children:
            if child.proc is not None:
                child.proc.wait()
        self.say("stopped")
