"""`manage.py queue_chaos`: prove that nothing is lost under faults.

A run owns everything it breaks: a private PostgreSQL cluster (cluster.py) it may restart, a TCP proxy (proxy.py)
between the workers and that cluster that can cut every connection, and the worker processes (fleet.py) it kills
and stops. It plants probe items across the three delivery modes, ordering keys, group keys on a rate- and group-
limited queue and poison (plan.py), fires a seeded fault schedule (faults.py) while the workers run, drains with
`--burst` workers, then judges the outcome from the rows the probes and the engine wrote (checks.py). runner.py
ties the steps together; report.py prints the figures.
"""
