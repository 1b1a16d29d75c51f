"""Django database backend for the project's embedded PostgreSQL (see jobsite/embedded_pg/).

It is Django's PostgreSQL backend; only the connection parameters differ: the server is started on demand and
reached through its unix socket.
"""
