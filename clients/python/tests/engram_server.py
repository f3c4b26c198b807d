"""Starts the real engram binary on ephemeral ports against a fresh store;
shared by the client's tests and the MCP tests (tests/mcp).

Every suite runs on both stores: a temp SQLite file, and a new database on
the Postgres server named by ENGRAM_TEST_DATABASE_URL when it is set (as
scripts/test sets it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

ENGRAM_BIN = os.environ.get(
    "ENGRAM_BIN", str(Path(__file__).resolve().parents[3] / "target" / "debug" / "engram")
)

#: The stores every suite runs on.
STORES = ["sqlite"] + (["postgres"] if os.environ.get("ENGRAM_TEST_DATABASE_URL") else [])


@dataclass
class Server:
    process: subprocess.Popen[str]
    #: host:port of gRPC.
    address: str
    #: host:port of HTTP (/mcp, /metrics).
    http_address: str
    database_url: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)


def database_url(store: str, directory: str) -> str:
    """A fresh, empty store: a SQLite file in ``directory``, or a new
    Postgres database."""
    if store == "sqlite":
        return f"sqlite://{directory}/engram.db"
    url = os.environ["ENGRAM_TEST_DATABASE_URL"]
    name = f"engram_py_{uuid.uuid4().hex[:12]}"
    psql = shutil.which("psql", path=os.environ.get("PG_BINDIR")) or "psql"
    subprocess.run([psql, url, "-qc", f"CREATE DATABASE {name}"], check=True, capture_output=True)
    return url.rsplit("/", 1)[0] + "/" + name


def new_token(tenant: str, admin: bool) -> tuple[str, str]:
    """A token and its tokens-file line, from `engram token new`."""
    args = [ENGRAM_BIN, "token", "new", "--tenant", tenant, "--output", "json"]
    if admin:
        args.append("--admin")
    made = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return made["token"], made["line"]


def start_with_tokens(
    database_url: str,
    directory: str,
    roster: list[tuple[str, str, bool]],
    env: dict[str, str] | None = None,
) -> tuple[Server, dict[str, str]]:
    """Runs `engram serve` with a tokens file in ``directory`` holding a
    token for each (name, tenant, admin) of ``roster``; returns the server
    and the tokens by name."""
    tokens: dict[str, str] = {}
    lines = []
    for name, tenant, admin in roster:
        tokens[name], line = new_token(tenant, admin)
        lines.append(line)
    tokens_file = Path(directory) / "tokens"
    tokens_file.write_text("\n".join(lines) + "\n")
    running = start_server(database_url, env={"ENGRAM_TOKENS_FILE": str(tokens_file), **(env or {})})
    return running, tokens


def start_server(
    database_url: str, grpc_addr: str = "127.0.0.1:0", env: dict[str, str] | None = None
) -> Server:
    """Runs `engram serve` and waits for the log line saying where it listens."""
    process = subprocess.Popen(
        [ENGRAM_BIN, "serve", "--grpc-addr", grpc_addr, "--http-addr", "127.0.0.1:0"],
        env={
            **os.environ,
            "ENGRAM_DATABASE_URL": database_url,
            "ENGRAM_LOG_FORMAT": "json",
            "ENGRAM_SHUTDOWN_GRACE_SECS": "2",
            **(env or {}),
        },
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert process.stderr is not None
    for line in process.stderr:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if "grpc_addr" in event:
            # Keep draining stderr so the server never blocks on a full pipe.
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return Server(process, event["grpc_addr"], event["http_addr"], database_url)
    raise RuntimeError(f"engram exited before listening (status {process.wait()})")


class Outage:
    """Makes the server's database refuse writes, or (Postgres) every
    connection, until :meth:`end`."""

    def __init__(self, database_url: str) -> None:
        self.url = database_url
        self._lock: sqlite3.Connection | None = None
        self._ending: list[str] = []

    @property
    def sqlite(self) -> bool:
        return self.url.startswith("sqlite://")

    def _psql(self, *statements: str) -> None:
        """Runs statements on the cluster's `postgres` database, about the
        server's database."""
        name = self.url.rsplit("/", 1)[1]
        admin = self.url.rsplit("/", 1)[0] + "/postgres"
        psql = shutil.which("psql", path=os.environ.get("PG_BINDIR")) or "psql"
        for statement in statements:
            subprocess.run(
                [psql, admin, "-qAtc", statement.replace("{db}", name)],
                check=True,
                capture_output=True,
            )

    def _end_sessions(self) -> None:
        self._psql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = '{db}' AND pid <> pg_backend_pid()"
        )

    def writes(self) -> None:
        if self.sqlite:
            self._lock = sqlite3.connect(self.url.removeprefix("sqlite://"), isolation_level=None)
            self._lock.execute("BEGIN IMMEDIATE")
            return
        self._psql('ALTER DATABASE "{db}" SET default_transaction_read_only = on')
        self._end_sessions()
        self._ending = ['ALTER DATABASE "{db}" RESET default_transaction_read_only']

    def connections(self) -> None:
        assert not self.sqlite, "SQLite's readers cannot be shut out"
        self._psql('ALTER DATABASE "{db}" ALLOW_CONNECTIONS false')
        self._end_sessions()
        self._ending = ['ALTER DATABASE "{db}" ALLOW_CONNECTIONS true']

    def end(self) -> None:
        if self._lock is not None:
            self._lock.execute("ROLLBACK")
            self._lock.close()
            self._lock = None
        self._psql(*self._ending)
        self._ending = []


class Injected:
    """Makes Postgres fail the next ``times`` inserts into a table of the
    server's database with an error of the given SQLSTATE, as a deadlock
    Postgres broke (``40P01``) or a statement canceled (``57014``) would:
    a trigger raises it, counting on a sequence, which no rollback undoes.
    The failed transaction is rolled back whole, as the real ones are."""

    def __init__(self, database_url: str) -> None:
        assert not database_url.startswith("sqlite://"), "a trigger of Postgres"
        self.url = database_url
        self._tables: list[str] = []

    def _psql(self, statement: str) -> None:
        psql = shutil.which("psql", path=os.environ.get("PG_BINDIR")) or "psql"
        subprocess.run([psql, self.url, "-qAtc", statement], check=True, capture_output=True)

    def fail(self, table: str, sqlstate: str, times: int = 1) -> None:
        self._psql(
            f"CREATE SEQUENCE injected_{table}; "
            f"CREATE FUNCTION injected_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN IF nextval('injected_{table}') <= {times} THEN "
            f"RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END IF; "
            f"RETURN NEW; END $$; "
            f"CREATE TRIGGER injected BEFORE INSERT ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION injected_{table}()"
        )
        self._tables.append(table)

    def end(self) -> None:
        for table in self._tables:
            self._psql(
                f"DROP TRIGGER injected ON {table}; DROP FUNCTION injected_{table}(); "
                f"DROP SEQUENCE injected_{table}"
            )
        self._tables = []
