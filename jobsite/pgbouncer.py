"""A PgBouncer in transaction mode on a free loopback port, in front of a PostgreSQL server: what the pooler test
(tests/core/processes/test_pgbouncer.py) and queue_bench's pooler part (jobsite/bench/pooler_side.py) start. Debian's
package (jobsite/system_packages.py installs it); tooling, not product."""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import system_packages


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgBouncer:
    """A running PgBouncer: its port, its directory (ini, log) and process."""

    port: int
    here: Path
    proc: subprocess.Popen

    def log(self) -> str:
        return (self.here / "pgbouncer.log").read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.here, ignore_errors=True)


def start(host: str, port: int | str, user: str, *, pool_size: int, timeout: float = 15.0) -> PgBouncer:
    """PgBouncer in transaction mode in front of the server at `host` (a name, or a unix socket directory) and
    `port`, connecting as `user` (auth_type any: the server's own authentication applies), at most `pool_size`
    server connections per database. Raises RuntimeError when it is not installed or does not start."""
    if not Path(system_packages.PGBOUNCER).exists():
        raise RuntimeError(f"pgbouncer is not installed ({system_packages.PGBOUNCER})")
    # Its own directory under /tmp: PgBouncer runs as the server's OS user when run by root (it refuses root),
    # and pytest's temporary directories are root's alone.
    here = Path(tempfile.mkdtemp(prefix="jobsite-pgbouncer-"))
    here.chmod(0o755)
    listen = free_port()
    ini = here / "pgbouncer.ini"
    ini.write_text(
        f"""[databases]
* = host={host} port={port} user={user}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = 500
ignore_startup_parameters = extra_float_digits
"""
    )
    ini.chmod(0o644)
    command = [system_packages.PGBOUNCER, str(ini)]
    if os.geteuid() == 0:  # as the OS user that may reach the server: the embedded cluster's socket directory is
        # its owner's alone (pgserver's cluster runs as `pgserver`)
        command[1:1] = ["-u", Path(host).owner() if host.startswith("/") else "postgres"]
    with (here / "pgbouncer.log").open("w") as log:  # its stderr: it logs there without a logfile
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    bouncer = PgBouncer(listen, here, proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited: {bouncer.log()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", listen)) == 0:
                return bouncer
        time.sleep(0.05)
    bouncer.stop()
    raise RuntimeError(f"pgbouncer did not listen within {timeout:g} s")
