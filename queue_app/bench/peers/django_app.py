"""What the Django-based peers share: each runs under its own minimal settings module (peer_settings.py and
the peer's own on top) in its scratch database, migrates it with its own migrations, and queues its jobs with
its own API from a child process (`<jobs module>.enqueue(n)`), as an application would."""

import os
import subprocess
import sys

from . import Peer


class DjangoAppPeer(Peer):
    settings_module: str = ""
    jobs_module: str = ""  # defines enqueue(n)

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": self.settings_module,
            "JOBSITE_BENCH_PEER_DSN": self.dsn,
            "PYTHONUNBUFFERED": "1",
            **extra,
        }

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
