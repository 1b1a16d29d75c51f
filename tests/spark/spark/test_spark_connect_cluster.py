"""Warm runs with SPARK_MASTER on a Spark standalone cluster: jobsite's Connect server is an application of the
cluster, and a run's tasks run in its executor on the cluster's worker (master and worker started from pyspark's
own jars on loopback, as in test_spark_launcher).
"""

import subprocess
import sys

import pytest

from queue_app.spark import connect, warm_pool
from queue_app.spark.launcher import launch
from queue_app.spark.models import SparkConnectServer
from tests.conftest import ROOT, child_env
from tests.support import spark_cluster
from tests.support.spark_cluster import free_port, stop_group, ui_json
from tests.support.spark_fixtures import require_spark
from tests.support.waiting import wait_for

standalone_cluster = spark_cluster.standalone_cluster  # the fixture

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def cluster_connect_server(standalone_cluster, tmp_path, test_db_name):
    """`spark_connect_server --master spark://...`, its executors sized for the cluster's one small worker."""
    require_spark()
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.executor.memory 512m\nspark.cores.max 1\n")
    url = connect.parse_url(f"sc://127.0.0.1:{free_port()}")
    env = child_env(
        test_db_name, SPARK_LOCAL_IP="127.0.0.1", SPARK_CONF_DIR=str(conf_dir), JAVA_TOOL_OPTIONS="-XX:+UseSerialGC"
    )
    command = ["spark_connect_server", "--url", str(url), "--master", standalone_cluster.url, "--interval", "1"]
    with (tmp_path / "server.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *command],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield url
        finally:
            warm_pool.drop_spare()  # the light child prepared after the run
            stop_group(proc)  # the supervisor and the server it started


def test_a_warm_run_on_the_standalone_cluster_runs_in_the_clusters_executor(
    standalone_cluster, cluster_connect_server, test_db_name, monkeypatch, tmp_path
):
    url = cluster_connect_server
    server = wait_for(
        lambda: SparkConnectServer.objects.filter(url=str(url), healthy=True).first(),
        240,
        what=f"the server on the cluster to answer a probe (log: {tmp_path / 'server.log'})",
    )
    assert server.master == standalone_cluster.url

    monkeypatch.setenv("JOBSITE_SPARK_CONNECT", str(url))
    result = launch("demo_sleep", {"tasks": 2, "seconds": 0}, "cluster-warm", env=child_env(test_db_name))
    assert result.outcome == "succeeded", (
        f"{result.outcome}: {result.error}\n{result.log_tail}" + standalone_cluster.said()
    )
    assert result.path == "connect" and result.metrics == {"tasks": 2, "sum": 1}
    assert result.progress["tasks_done"] == result.progress["tasks_total"] >= 2

    # The server is the cluster's application, and its executor runs on the cluster's worker: with a standalone
    # master the driver runs no tasks itself, so the run's tasks ran there.
    # (Each web UI is asked until it answers: a daemon on a loaded machine may take seconds to.)
    master = wait_for(lambda: ui_json(standalone_cluster.master_ui), 60, what="the master's web UI")
    apps = [app for app in master["activeapps"] if app["name"] == "jobsite-spark-connect"]
    assert len(apps) == 1 and apps[0]["id"].startswith("app-")
    executors = wait_for(lambda: ui_json(standalone_cluster.worker_ui), 60, what="the worker's web UI")["executors"]
    assert [e["appid"] for e in executors] == [apps[0]["id"]]
