"""A script's driver is followed by its event log as it is written (queue_app/spark/statusapi.py): the attempt
whose conf carries the run's tag, its start, and its jobs' and stages' progress; the driver's status API is asked
only once a job has run a while (its first answer costs the driver about 2 s). Here the log is written line by
line by the test in Spark's own event shapes; tests/spark/spark/test_spark_scripts.py follows real drivers."""

import json

from queue_app.spark import protocol, statusapi


def event(kind: str, **fields) -> str:
    return json.dumps({"Event": f"SparkListener{kind}", **fields}) + "\n"


def start_events(tag: str, app_id: str) -> str:
    return (
        event("LogStart", **{"Spark Version": "4.0.5"})
        + event("EnvironmentUpdate", **{"Spark Properties": {"spark.master": "local[*]", statusapi.TAG: tag}})
        + event("ApplicationStart", **{"App ID": app_id, "Timestamp": 1_000})
    )


JOB = event(
    "JobStart",
    **{
        "Job ID": 0,
        "Submission Time": 2_000,
        "Stage Infos": [{"Stage ID": 0, "Number of Tasks": 3}, {"Stage ID": 1, "Number of Tasks": 2}],
    },
)
STAGE_0_DONE = event("StageCompleted", **{"Stage Info": {"Stage ID": 0, "Number of Tasks": 3}})
JOB_DONE = event("JobEnd", **{"Job ID": 0, "Completion Time": 3_000, "Job Result": {"Result": "JobSucceeded"}})


def follower(tmp_path, api_after: float | None):
    lines: list[str] = []
    # Nothing listens on the port: any call to the status API fails (and would be seen failing).
    poller = statusapi.StatusPoller(
        statusapi.free_port(), "run-7-abc", 4242, lines.append, log_dir=str(tmp_path), api_after=api_after
    )
    return poller, lines


def decoded(lines: list[str]) -> list[tuple[str, dict]]:
    return [protocol.decode(line) for line in lines]


def test_the_attempt_carrying_the_tag_is_followed_from_its_start_to_its_jobs_end(tmp_path):
    poller, lines = follower(tmp_path, api_after=None)  # API_AFTER: the job ends well before it
    (tmp_path / "local-1").write_text(start_events("run-7-earlier", "local-1") + JOB)  # an earlier attempt's log
    log = tmp_path / "local-2.inprogress"
    log.write_text(start_events("run-7-abc", "local-2")[:-30])  # the start's last line not yet whole
    poller._round()
    assert lines == []  # no application start read yet

    with log.open("a") as f:
        f.write(start_events("run-7-abc", "local-2")[-30:])
    poller._round()
    started = decoded(lines)[0]
    assert started == (
        protocol.STARTED,
        {
            "app_id": "local-2",
            "master": "local[*]",
            "spark_version": "4.0.5",
            "ui_url": poller.ui_url,
            "pid": 4242,
        },
    )

    for text in (JOB, STAGE_0_DONE, JOB_DONE):
        with log.open("a") as f:
            f.write(text)
        poller._round()
    progress = [payload for kind, payload in decoded(lines) if kind == protocol.PROGRESS]
    assert [(p["jobs_done"], p["stages_done"], p["tasks_done"], p["tasks_total"]) for p in progress] == [
        (0, 0, 0, 0),  # started, no job yet
        (0, 0, 0, 5),  # the job started: its stages' tasks counted
        (0, 1, 3, 5),  # a stage completed: its tasks are done, whether or not their ends were flushed
        (1, 2, 5, 5),  # the job ended: the stage it skipped counts as done
    ]
    assert {p["source"] for p in progress} == {"event log"}
    assert not poller.api_on  # the driver's status API was never asked


def test_the_status_api_is_asked_once_a_job_has_run_a_while_and_the_log_stands_in_when_it_fails(tmp_path):
    poller, lines = follower(tmp_path, api_after=0)
    (tmp_path / "local-3.inprogress").write_text(start_events("run-7-abc", "local-3"))
    poller._round()
    assert not poller.api_on  # no job yet: nothing to ask for
    with (tmp_path / "local-3.inprogress").open("a") as f:
        f.write(JOB)
    poller._round()  # the job is seen running
    poller._round()  # ... for api_after (0 s): the API is asked, fails (nothing on its port), the log answers
    assert poller.api_on
    progress = [payload for kind, payload in decoded(lines) if kind == protocol.PROGRESS]
    assert progress[-1]["source"] == "event log" and progress[-1]["tasks_total"] == 5
