"""The warm-run supervisor's probe (spark/connect.py) gives up on a server that takes a query and never answers:
PySpark's Connect client sets no deadline on a query's RPC, and a probe blocked for good once left a restarted
server unhealthy for the rest of a CI run. The server here is a real socket that accepts and then says nothing."""

import socket
import threading
import time

from queue_app.spark import connect
from tests.support.waiting import wait_for


def test_a_server_that_never_answers_fails_the_probe_at_its_deadline():
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:  # takes every connection, reads nothing, answers nothing
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    url = connect.ConnectUrl("127.0.0.1", listener.getsockname()[1])
    try:
        began = time.monotonic()
        error, session = connect.probe(url, deadline=2)
        took = time.monotonic() - began
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert (error, session) == ("the server did not answer a query within 2 s", None)
    assert took < 10  # without the deadline: RetriesExceeded after 23 s (gRPC's connect timeout, then retries)
    # The session's channel closed, the query's thread ends too: a supervisor probing every few seconds does not
    # pile up blocked threads.
    wait_for(
        lambda: not any(t.name == "spark-connect-probe" for t in threading.enumerate()),
        10,
        what="the probe's query thread to end",
    )
