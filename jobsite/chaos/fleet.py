"""The worker processes of a chaos run: real `manage.py run_worker` children, started, killed, stopped and
replaced, each under a worker id of its own so the checks can tell which reservations a killed worker held.

Pools alternate (process, thread, process, ...): both executors face the same faults.
"""

import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
MANAGE = ROOT / "manage.py"


@dataclass
class WorkerProc:
    worker_id: str
    pool: str
    popen: subprocess.Popen
    log: Path
    started: float  # time.monotonic()
    burst: bool = False
    handoff: bool = False  # the hand-off worker: serves the hand-off queue alone (chaos/handoff.py)
    fate: str | None = None  # killed, sigterm, stopped (end of the fault phase)
    signalled_at: float | None = None
    exit_code: int | None = None
    killed_at: datetime | None = None  # wall clock, to compare with the database's timestamps

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def unasked(self, lines: int = 12) -> str:
        """What a check reports of a worker that exited on its own: its code, its log, and the log's last lines
        (the traceback, when it died of one), so a CI run that cannot keep the log still shows the cause."""
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = []
        said = "".join(f"\n        | {line[:300]}" for line in tail)
        return f"{self.worker_id} exited {self.exit_code} unasked (log {self.log}){said}"


@dataclass
class Fleet:
    env: dict[str, str]
    log_dir: Path
    concurrency: int
    queues: tuple[str, ...]
    poll_interval: float = 0.5
    imports: tuple[str, ...] = ()  # modules each worker imports (--import): a scenario's tasks
    procs: list[WorkerProc] = field(default_factory=list)
    _seq: int = 0

    def spawn(self, *, burst: bool = False, pool: str | None = None, handoff_queue: str | None = None) -> WorkerProc:
        """A worker of the fleet's queues; or, `handoff_queue`, the hand-off worker, which serves that queue
        alone (on threads)."""
        pool = "thread" if handoff_queue else pool or ("process", "thread")[self._seq % 2]
        role = "-burst" if burst else "-handoff" if handoff_queue else ""
        worker_id = f"chaos-{self._seq:03d}-{pool}{role}"
        self._seq += 1
        log = self.log_dir / f"{worker_id}.log"
        queues = handoff_queue or ",".join(self.queues)
        args = [
            sys.executable, str(MANAGE), "run_worker", "--worker-id", worker_id, "--queues", queues,
            "--pool", pool, "--concurrency", str(self.concurrency), "--poll-interval", str(self.poll_interval),
        ]  # fmt: skip
        for module in self.imports:
            args += ["--import", module]
        if burst:
            args.append("--burst")
        with log.open("w") as out:
            popen = subprocess.Popen(
                args, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        proc = WorkerProc(worker_id, pool, popen, log, time.monotonic(), burst=burst, handoff=bool(handoff_queue))
        self.procs.append(proc)
        return proc

    def running(self) -> list[WorkerProc]:
        """Workers alive and not asked to stop."""
        return [p for p in self.procs if p.fate is None and p.alive()]

    def ripe(self, min_age: float, registered: set[str], *, handoff: bool = False) -> list[WorkerProc]:
        """Workers that have been working a while: registered in the Worker table (so their signal handlers are
        installed: a SIGTERM before that is a plain kill) and at least `min_age` seconds old; the fleet's, or
        (`handoff`) the hand-off worker."""
        now = time.monotonic()
        return [
            p
            for p in self.running()
            if now - p.started >= min_age and p.worker_id in registered and p.handoff == handoff
        ]

    def kill(self, proc: WorkerProc) -> None:
        """kill -9 the supervisor; its pool's children die with it (PR_SET_PDEATHSIG)."""
        proc.fate, proc.signalled_at, proc.killed_at = "killed", time.monotonic(), datetime.now(UTC)
        os.kill(proc.pid, signal.SIGKILL)
        proc.exit_code = proc.popen.wait(30)

    def sigterm(self, proc: WorkerProc, fate: str = "sigterm") -> None:
        proc.fate, proc.signalled_at = fate, time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)

    def pick(
        self, rng: random.Random, min_age: float, registered: set[str], *, handoff: bool = False
    ) -> WorkerProc | None:
        ripe = self.ripe(min_age, registered, handoff=handoff)
        return rng.choice(ripe) if ripe else None

    def reap(self) -> list[WorkerProc]:
        """Record the exit codes of workers that ended; returns those that ended without being asked to
        (a crash, or a burst worker done)."""
        ended = []
        for proc in self.procs:
            if proc.exit_code is None and not proc.alive():
                proc.exit_code = proc.popen.returncode
                if proc.fate is None:
                    proc.fate = "burst-done" if proc.burst and proc.exit_code == 0 else "crashed"
                    ended.append(proc)
        return ended

    def wait_all(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.reap()
            if all(p.exit_code is not None for p in self.procs):
                return True
            time.sleep(0.2)
        return False

    def kill_all(self) -> None:
        """Cleanup: nothing of ours outlives the run."""
        for proc in self.procs:
            if proc.alive():
                proc.popen.kill()
                proc.popen.wait(30)
        self.reap()

    def killed(self) -> dict[str, datetime]:
        return {p.worker_id: p.killed_at for p in self.procs if p.fate == "killed"}
