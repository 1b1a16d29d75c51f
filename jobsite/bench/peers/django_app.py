"""What the Django-based peers share: each runs under its own minimal settings module (peer_settings.py and
the peer's own on top) in its scratch database, migrates it with its own migrations, and queues its jobs with
its own API from a child process (`<jobs module>.enqueue(n)`, and `enqueue_probe(n)` for the latency), as an
application would."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

from . import DSN_ENV, Client, Peer
from .probe import PROBE_FILE_ENV


class DjangoAppPeer(Peer):
    settings_module: str = ""
    jobs_module: str = ""  # defines enqueue(n) and enqueue_probe(n)

    def env(self, probe_file: Path | None = None, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": self.settings_module,
            DSN_ENV: self.dsn,
            "PYTHONUNBUFFERED": "1",
            **({PROBE_FILE_ENV: str(probe_file)} if probe_file else {}),
            **extra,
        }

    def client_env(self) -> dict[str, str]:
        return self.env()

    @classmethod
    def open_client(cls) -> Client:
        return _DjangoClient(cls.jobs_module)

    def run_python(self, *args: str) -> None:
        proc = subprocess.run([sys.executable, *args], env=self.env(), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")

    def setup(self) -> None:
        self.ctx.fresh_database(self.name)
        self.run_python("-m", "django", "migrate", "--verbosity", "0")

    def enqueue(self, n: int) -> None:
        code = f"import django; django.setup(); from {self.jobs_module} import enqueue; enqueue({int(n)})"
        self.run_python("-c", code)


class _DjangoClient:
    """The peer's jobs module under its own settings (the feeder's and the prober's environment says which)."""

    def __init__(self, jobs_module: str) -> None:
        import django

        django.setup()
        self._jobs = importlib.import_module(jobs_module)

    def noops(self, n: int) -> None:
        self._jobs.enqueue(n)

    def probe(self, n: int) -> None:
        self._jobs.enqueue_probe(n)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()
