"""The demo: jobs, datasets, checks and workflows that show jobsite's layers working together.

An app of its own (`jobsite.demo`) that the jobsite project installs and an adopter's project does not: the
registries find its tasks and workflows (tasks.py), Spark jobs (spark_jobs.py) and datasets (datasets.py) because
it is installed, so `migrate` and the workers of another project never see them.

    pipeline.py     demo_pipeline: a day's sample files -> rollup (Spark) -> analytics (Spark) -> summary
    waits.py        demo_waits: a sleep, an event, an approval and a branch
    data.py         the demo's datasets (demo.events, demo.rollup, demo.analytics), their checks, the two jobs
    spark_demo.py   the `demo` Spark job (a few stages to watch in the admin)
"""
