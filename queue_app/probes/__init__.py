"""The probe tasks and their tables, in one home: tasks.py (the three probes, one per delivery mode) and
models.py (ExecutionLog: one row per run of a probe's handler; ProbeEffect: the write a probe makes).

They are the product's, not only the tooling's: the probes are among the built-in tasks, the way anyone checks
the delivery guarantees on a deployment from outside (enqueue probes, count their runs and effects), and the
chaos command, the benchmarks and the test suite all run them on real workers. So the tables stay in the
product's schema (app_label queue_app, migrations 0002 and 0003) rather than in an app only the chaos command
and benchmarks install: such an app would have to be installed in every worker those start and in the test
settings (a second settings module), and moving the tables out of queue_app's migration state would take a
state-only migration racing the workflow migrations written in parallel, for two small tables that nothing on
the hot path touches unless a probe runs. Nothing here imports up: queue_app.models and queue_app.tasks import
these modules to register them.
"""
