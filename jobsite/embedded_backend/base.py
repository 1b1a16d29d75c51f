"""``ENGINE = "jobsite.embedded_backend"``: Django's PostgreSQL backend on the embedded cluster.

``get_connection_params()`` is the one hook every connection goes through, including the maintenance
connection to the ``postgres`` database that ``_nodb_cursor()`` opens (``NAME=None``) to create and drop test
databases, and pooled connections. It starts the cluster if needed and points host/port/user at it. Once per
process it creates the configured database if it is missing; test databases are left to Django's test-database
creation.
"""

import threading

from django.db.backends.base.creation import TEST_DATABASE_PREFIX
from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper
from django.db.backends.postgresql.client import DatabaseClient as PostgresDatabaseClient

from jobsite import embedded_pg

_ensured: set[str] = set()
_ensured_lock = threading.Lock()


class DatabaseClient(PostgresDatabaseClient):
    """``manage.py dbshell``: psql on the embedded server's socket."""

    @classmethod
    def settings_to_cmd_args_env(cls, settings_dict, parameters):
        server = embedded_pg.ensure_running()
        settings_dict = {
            **settings_dict,
            "HOST": server["host"],
            "PORT": str(server["port"]),
            "USER": server["user"],
        }
        args, env = super().settings_to_cmd_args_env(settings_dict, parameters)
        psql = embedded_pg.psql_executable()
        if psql:
            args[0] = psql
        return args, env


class DatabaseWrapper(PostgresDatabaseWrapper):
    display_name = "PostgreSQL (embedded)"
    client_class = DatabaseClient

    def get_connection_params(self):
        params = super().get_connection_params()
        server = embedded_pg.ensure_running()
        params.update(host=server["host"], port=server["port"], user=server["user"])
        dbname = params.get("dbname")
        if dbname and self._should_ensure(dbname):
            with _ensured_lock:
                if dbname not in _ensured:
                    embedded_pg.ensure_database(dbname, server)
                    _ensured.add(dbname)
        return params

    def _should_ensure(self, dbname: str) -> bool:
        if dbname in _ensured or dbname == "postgres":
            return False
        # Test databases (test_<name>, TEST["NAME"], xdist clones) are created and dropped by Django's test
        # database creation through the maintenance connection; creating them here would get in its way.
        test_name = (self.settings_dict.get("TEST") or {}).get("NAME")
        return not (dbname.startswith(TEST_DATABASE_PREFIX) or dbname == test_name)
