"""One registry shape (queue_app/registries.py) and one parameter module (queue_app/params.py), shared by tasks,
Spark jobs and workflows. In process, no worker."""

import datetime as dt

import pytest
from django.core.exceptions import ImproperlyConfigured

from queue_app import registry
from queue_app.params import Param, ParamError, validate_params
from queue_app.registries import DuplicateName, Registry, origin_of
from queue_app.spark import registry as spark_registry
from queue_app.spark.registry import SparkJob, SparkParamError, UnknownSparkJob
from queue_app.workflows import UnknownWorkflow, WorkflowError, get_workflow
from queue_app.workflows import definition as workflow_definition
from queue_app.workflows.definition import WorkflowDefinition, WorkflowParamError

PARAMS = (
    Param("day", "date", required=True),
    Param("n", "int", default=3, min=1),
    Param("mode", "choice", choices=("fast", "slow"), default="fast"),
)
BAD = {"day": "2026-02-30", "n": "0", "colour": "red"}
EXPECTED_ERRORS = {
    "colour": "unknown parameter (this {} takes: day, mode, n)",
    "day": "must be a date as YYYY-MM-DD, got '2026-02-30'",
    "n": "must be >= 1",
}


def first(payload, ctx):
    return 1


def second(payload, ctx):
    return 2


def test_spark_jobs_and_workflows_validate_their_parameters_with_the_one_algorithm():
    job = SparkJob("reg_job", func=first, params=PARAMS)
    definition = WorkflowDefinition("reg_wf", build=first, params=PARAMS)

    with pytest.raises(SparkParamError) as spark_error:
        job.validate(BAD)
    with pytest.raises(WorkflowParamError) as workflow_error:
        definition.validate(BAD)

    assert spark_error.value.errors == {k: v.format("job") for k, v in EXPECTED_ERRORS.items()}
    assert workflow_error.value.errors == {k: v.format("workflow") for k, v in EXPECTED_ERRORS.items()}
    assert str(spark_error.value).startswith("invalid parameters for Spark job 'reg_job': colour: ")
    assert str(workflow_error.value).startswith("invalid parameters for workflow 'reg_wf': colour: ")
    # Each caller's own error type still catches them, and so does the shared one.
    assert isinstance(workflow_error.value, WorkflowError) and isinstance(workflow_error.value, ParamError)
    assert isinstance(spark_error.value, ParamError)
    good = {"day": "2026-02-01", "n": " 5 "}
    expected = {"day": dt.date(2026, 2, 1), "n": 5, "mode": "fast"}
    assert job.validate(good) == definition.validate(good) == validate_params(PARAMS, good, owner="x")[0] == expected


def test_a_callable_default_is_called_when_the_value_is_missing():
    values, errors = validate_params([Param("day", "date", default=lambda: dt.date(2026, 1, 2))], {}, owner="job")
    assert (values, errors) == ({"day": dt.date(2026, 1, 2)}, {})


def test_parameters_that_are_not_a_mapping_are_one_error_not_a_crash():
    values, errors = validate_params(PARAMS, ["day"], owner="job")
    assert (values, errors) == ({}, {"__all__": "parameters must be a mapping, got list"})
    with pytest.raises(WorkflowParamError, match="parameters must be a mapping, got str"):
        WorkflowDefinition("reg_wf", build=first, params=PARAMS).validate("day=2026-01-01")


def test_a_name_taken_by_another_origin_is_refused_the_same_origin_replaces():
    names: Registry = Registry("thing", app_module="no_such_module_anywhere", origin=origin_of)
    names.register("a", first)
    assert names.register("a", first) is first  # the same function registered again (a module imported twice)
    with pytest.raises(DuplicateName, match=r"thing name 'a' is registered twice: by .*\.first and by .*\.second"):
        names.register("a", second)
    assert issubclass(DuplicateName, ImproperlyConfigured) and issubclass(DuplicateName, ValueError)
    assert names.entries() == {"a": first}
    assert names.get(["not", "a", "name"]) is None


def test_all_three_registries_are_the_one_shape():
    assert {type(r) for r in (registry._tasks, spark_registry._jobs, workflow_definition._workflows)} == {Registry}
    assert registry._tasks.get("queue_app.echo") is registry.get_task("queue_app.echo")
    assert "demo_pipeline" in workflow_definition._workflows.names()


@pytest.mark.django_db  # the Spark registry also lists the scripts stored by the admin
def test_a_misspelt_spark_job_or_workflow_names_the_closest_ones():
    with pytest.raises(UnknownSparkJob, match=r"unknown Spark job 'demo_slep' \(did you mean 'demo_sleep'[,?]"):
        spark_registry.get_job("demo_slep")
    with pytest.raises(UnknownWorkflow, match=r"unknown workflow 'demo_pipelin' \(did you mean 'demo_pipeline'\?\)"):
        get_workflow("demo_pipelin")
    with pytest.raises(UnknownWorkflow, match=r"^unknown workflow 'zzz'; registered workflows: .*demo_pipeline"):
        get_workflow("zzz")
