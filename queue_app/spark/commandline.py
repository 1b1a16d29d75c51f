"""The command lines and the environment of a Spark run's processes.

A registered function runs as `spark-submit ... child.py --job NAME --params-json ... --run-id ID --output-file
PATH` (SPARK_HOME = the installed pyspark, PYSPARK_PYTHON = this interpreter); an existing script as
`spark-submit ... <its options> <its file> <its args>`, nothing of jobsite's in its driver. The Spark conf of
both comes from session.run_conf().
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from queue_app.spark import session

if TYPE_CHECKING:
    from queue_app.spark.scripts import BoundScript

CHILD_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def submit_head(run_id: int | str, master: str | None, conf: Mapping[str, str] | None) -> list[str]:
    """spark-submit with the run's master, name and conf, before the application and its arguments."""
    cmd = [
        os.path.join(session.spark_home(), "bin", "spark-submit"),
        "--master",
        master or session.spark_master(),
        "--name",
        session.job_group(run_id),
    ]
    for key, value in session.run_conf(run_id, conf).items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def submit_command(
    job: str,
    params: Mapping[str, Any],
    run_id: int | str,
    output_file: str,
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> list[str]:
    """The spark-submit command line of a run (`params` already validated and JSON-safe)."""
    return submit_head(run_id, master, conf) + child_args(job, params, run_id, output_file)


def child_args(job: str, params: Mapping[str, Any], run_id: int | str, output_file: str) -> list[str]:
    """child.py and its arguments for one run."""
    return [
        CHILD_SCRIPT,
        "--job",
        job,
        "--params-json",
        json.dumps(dict(params), separators=(",", ":")),
        "--run-id",
        str(run_id),
        "--output-file",
        output_file,
    ]


def script_command(
    script: BoundScript, run_id: int | str, *, master: str | None = None, conf: Mapping[str, str] | None = None
) -> list[str]:
    """The spark-submit command line of an existing script: its own file and arguments, nothing of jobsite's."""
    return submit_head(run_id, master, conf) + script.submit_options() + [script.path, *script.args]


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of spark-submit: this interpreter for the driver and the Python workers, this project on
    the path, Spark from the installed pyspark."""
    env = dict(os.environ)
    env.pop("PYSPARK_SUBMIT_ARGS", None)  # meant for in-process sessions; spark-submit gets its own arguments
    env.update(
        SPARK_HOME=session.spark_home(),
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (PROJECT_ROOT, env.get("PYTHONPATH")) if p),
    )
    env.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
    env.update(extra or {})
    # pyspark marks a process that opened a Connect session (a probe, the bench) in its environment, and copies
    # of that environment carry the marks: a spark-submit child with them would be a Connect client. The
    # launcher says which path a run takes.
    for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_REMOTE"):
        env.pop(name, None)
    return env
