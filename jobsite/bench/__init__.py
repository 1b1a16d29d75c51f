"""`manage.py queue_bench`: how fast jobsite's queue is on this machine, against the ceiling and the peers.

One run on one PostgreSQL server measures three things, each in a scratch database of its own (so the bench
never touches the queue the project serves):

- ceiling.py: pgbench with custom scripts on a bare queue table: the most any PostgreSQL queue can do here;
- jobsite_side.py: bulk enqueue, end-to-end no-op throughput of one `run_worker`, idle enqueue-to-start
  latency, the admin change list under load (admin_probe.py runs in a process of its own);
- peers/: Procrastinate, django-tasks-db, Celery with Redis, PgQueuer, django-q2 (ORM broker), each with the best
  settings of a few tried;

then report.py prints the table of figures and ratios and writes the JSON. churn.py is the separate hour-long
`--churn` run: table and index size under steady enqueue and work. runner.py ties them together.
"""
