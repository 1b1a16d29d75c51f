"""`manage.py spark_connect_server`: run and supervise jobsite's Spark Connect server (warm Spark runs).

    JOBSITE_SPARK_CONNECT=sc://127.0.0.1:15002 python manage.py spark_connect_server
    python manage.py spark_connect_server --url sc://127.0.0.1:15002 --master spark://host:7077

Starts the server with the installed pyspark on loopback only, restarts it when it dies, and records its health
(SparkConnectServer row, shown on the admin's Spark pages) every few seconds. Workers use it for runs of
registered functions while JOBSITE_SPARK_CONNECT names it and it is healthy. Stops on SIGTERM/SIGINT.
"""

import signal

from django.core.management.base import BaseCommand, CommandError

from queue_app.spark.connect import DEFAULT_PORT, ConnectConfigError, configured, parse_url
from queue_app.spark.connect_server import Supervisor


class Command(BaseCommand):
    help = "Run and supervise the Spark Connect server that warm Spark runs use."

    def add_arguments(self, parser):
        parser.add_argument("--url", help=f"sc://127.0.0.1:PORT (default: JOBSITE_SPARK_CONNECT, else {DEFAULT_PORT})")
        parser.add_argument("--master", help="Spark master of the server (default: SPARK_MASTER, else local[*])")
        parser.add_argument("--interval", type=float, default=5.0, help="seconds between health probes")

    def handle(self, *args, **options):
        try:
            url = (
                parse_url(options["url"])
                if options["url"]
                else configured() or parse_url(f"sc://127.0.0.1:{DEFAULT_PORT}")
            )
        except ConnectConfigError as exc:
            raise CommandError(str(exc)) from None
        if options["interval"] <= 0:
            raise CommandError("--interval must be positive")
        supervisor = Supervisor(url, master=options["master"], interval=options["interval"], log=self.stdout.write)
        stop = []

        def on_signal(signum, frame):
            stop.append(signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            supervisor.serve(until=lambda: bool(stop))
        except ConnectConfigError as exc:
            raise CommandError(str(exc)) from None
        finally:
            supervisor.stop()
