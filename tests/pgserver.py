"""A real PostgreSQL server for the tests, the fleet demo and the benchmark.

initdb + pg_ctl into a new temporary dir, listening on a free port of 127.0.0.1 only
(and a Unix socket inside that dir), password authentication (scram-sha-256) for the
user `broker`. Run as root, the server runs as the unprivileged `postgres` user (or
`nobody`), as PostgreSQL requires. `scripts/postgres-up.sh` installs the binaries.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

USER = "broker"
PASSWORD = "fleet-test-password"


def bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: $BROKER_PG_BIN, Debian's newest, or $PATH."""
    env = os.environ.get("BROKER_PG_BIN")
    if env and (Path(env) / "initdb").exists():
        return Path(env)
    debian = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgServer:
    """One PostgreSQL cluster in a temporary dir; `url(db)` names a database in it."""

    def __init__(self, fsync: bool = True) -> None:
        binaries = bin_dir()
        if binaries is None:
            raise RuntimeError("PostgreSQL's binaries are missing: run scripts/postgres-up.sh")
        self.bin = binaries
        self.root = Path(tempfile.mkdtemp(prefix="broker-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.fsync = fsync
        self._user = self._unprivileged() if os.geteuid() == 0 else None
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
        self._initdb()

    @staticmethod
    def _unprivileged() -> pwd.struct_passwd:
        for name in ("postgres", "nobody"):
            with contextlib.suppress(KeyError):
                return pwd.getpwnam(name)
        raise RuntimeError("running as root, and no unprivileged user to run PostgreSQL as")

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._user is not None:
            command = [
                "setpriv",
                f"--reuid={self._user.pw_uid}",
                f"--regid={self._user.pw_gid}",
                "--clear-groups",
                *command,
            ]
        return subprocess.run(
            command, capture_output=True, text=True, check=check, cwd=self.root, timeout=120
        )

    def _initdb(self) -> None:
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n", encoding="utf-8")
        if self._user is not None:
            os.chown(pwfile, self._user.pw_uid, self._user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "-A",
            "scram-sha-256",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        pwfile.unlink()
        settings = [
            "listen_addresses = '127.0.0.1'",
            f"port = {self.port}",
            f"unix_socket_directories = '{self.root}'",
            "max_connections = 200",
            "shared_buffers = 64MB",
            f"fsync = {'on' if self.fsync else 'off'}",
            "log_min_messages = warning",
        ]
        with (self.data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n".join(settings) + "\n")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return self._run("pg_ctl", "-D", str(self.data), "status", check=False).returncode == 0

    def url(self, database: str = "postgres") -> str:
        """A URL without the password (brokers take it by reference)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.url(), password=PASSWORD, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def wait_ready(self, timeout: float = 30) -> None:
        import psycopg

        end = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), password=PASSWORD, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        if self.data.exists():
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
