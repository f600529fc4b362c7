"""A real PostgreSQL server of the tests' own, in a temporary folder, on a Unix socket only.

Debian's ``postgresql`` package provides the server binaries; where they are missing and the
tests run as root, it is installed with apt-get (as the JupyterLab test installs chromium).
initdb refuses root, so as root the server runs as the package's ``postgres`` account; as any
other user, as that user. Each test gets a fresh database from :meth:`PostgreSQL.database`.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

import debian


def server_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    return found[-1].parent if found else None


def install() -> None:
    """apt-get install postgresql, where it is missing and we may."""
    if server_bin() is None:
        debian.install("postgresql")


class PostgreSQL:
    def __init__(self):
        install()
        self.bin = server_bin()
        if self.bin is None:
            pytest.skip("SKIPPED LOUDLY: the PostgreSQL tests need Debian's postgresql "
                        "(apt-get install -y postgresql, as root; the tests do it themselves "
                        "when run as root)")
        pytest.importorskip("psycopg", reason="pip install 'psycopg[binary]' (the test extra)")
        self.run_as = []
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("SKIPPED LOUDLY: running as root, but there is no postgres "
                            "account to run PostgreSQL as (Debian's package makes it)")
            self.run_as = ["runuser", "-u", "postgres", "--"]
        # Not under pytest's own temporary folder: that is closed to the postgres account.
        self.base = Path(tempfile.mkdtemp(prefix="gpushare-pg-"))
        self.data, self.socket = self.base / "data", self.base / "socket"
        self.socket.mkdir()
        if self.run_as:
            shutil.chown(self.base, "postgres")
            shutil.chown(self.socket, "postgres")
        self._pg("initdb", "-D", str(self.data), "-A", "trust", "-U", "gpushare")
        # A log file, not our pipes: the server outlives pg_ctl and would hold them open.
        subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-w",
                        "-l", str(self.base / "server.log"), "-o",
                        f"-k {self.socket} -c listen_addresses='' -c fsync=off", "start"],
                       check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run([*self.run_as, str(self.bin / tool), *args], check=True,
                       capture_output=True)

    def database(self, name: str | None = None) -> str:
        """A new, empty database; its SQLAlchemy URL."""
        name = name or "t_" + uuid.uuid4().hex[:12]
        self._pg("createdb", "-h", str(self.socket), "-U", "gpushare", name)
        return f"postgresql+psycopg://gpushare@/{name}?host={self.socket}"

    def stop(self) -> None:
        subprocess.run([*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                        "immediate", "stop"], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)
