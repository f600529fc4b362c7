"""The backup and restore recipe of docs/howto/backup.md works as the page says.

The commands are the page's own: every MyST code block with a ``:name:`` (``backup-sqlite``,
``restore-sqlite``…) is read from the page, its ``$ `` lines run in one bash (so ``umask``
holds for the lines after it) and the lines under each command compared with what it
printed. Only paths are put in: the page's state directory, backup folder, dated file name
and database address become this test's own. The store is a real one (``Store``, SQLite in
WAL mode, or the tests' own PostgreSQL server): a job committed before the backup (still in
the write-ahead log), a write in progress and open connections while it runs, a job accepted
after it, then a restore as the page says, and the store opened again.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import debian
from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.models import JobRow, ProjectRow

PAGE = Path(__file__).resolve().parents[1] / "docs" / "howto" / "backup.md"

# What the page names, and what this test puts in its place.
STATE = "/var/lib/gpushare"
BACKUPS = "/backup"
DATED = re.compile(r"/backup/gpushare-\d{4}-\d{2}-\d{2}\.(sqlite|dump)")
PG_ADDRESS = "postgresql://gpushare@db.example.org/gpushare"

_BLOCK = re.compile(r"^(?P<indent> *)```\{code-block\} console\n(?P=indent):name: (?P<name>\S+)\n"
                    r"(?P<body>.*?)^(?P=indent)```", re.S | re.M)


def page_blocks() -> dict[str, list[tuple[str, list[str]]]]:
    """The page's named console blocks: each a list of (command, the lines it prints)."""
    blocks = {}
    for m in _BLOCK.finditer(PAGE.read_text()):
        body = textwrap.dedent(m["body"]).strip("\n")
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif line.strip():
                assert steps, f"block {m['name']}: output before any command: {line!r}"
                steps[-1][1].append(line)
        blocks[m["name"]] = steps
    return blocks


BLOCKS = page_blocks()


def run_block(name: str, swap: dict[str, str], env: dict | None = None) -> None:
    """Run block ``name`` of the page in one bash, with ``swap`` put in (longest first), and
    check each command's output against the page's."""
    steps = BLOCKS[name]
    assert steps, f"backup.md has no commands in block {name}"
    # One pass, longest first: a path put in is never replaced again.
    names = re.compile("|".join(re.escape(k) for k in sorted(swap, key=len, reverse=True)))
    script, marks = ["set -e"], []
    for i, (command, _) in enumerate(steps):
        command = names.sub(lambda m: swap[m.group(0)], command)
        marks.append(f"@@step {i}@@")
        script += [f"echo '{marks[-1]}'", command]
    done = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)
    assert done.returncode == 0, (f"block {name} failed ({done.returncode}):\n{script}\n"
                                  f"{done.stdout}\n{done.stderr}")
    printed = re.split(r"^@@step \d+@@\n", done.stdout, flags=re.M)[1:]
    assert len(printed) == len(steps)
    for (command, expected), out in zip(steps, printed):
        if expected:
            assert out.splitlines() == expected, f"{command!r} printed {out!r}"


def make_job(store: Store, name: str, state: str = "pending") -> str:
    job = store.jobs.add(time.time(), user="alice", project="vision", name=name, gpus=1000,
                         priority=0, command=["python", "train.py"], env={"SEED": "1"},
                         checkpoint_dir="")
    if state == "running":
        store.jobs.start(job.id, {"node-0": 1000}, time.time())
    return job.id


def sqlite_tool() -> None:
    if shutil.which("sqlite3") is None:
        debian.install("sqlite3")
    if shutil.which("sqlite3") is None:
        pytest.skip("SKIPPED LOUDLY: the page's SQLite recipe uses Debian's sqlite3 command: "
                    "apt-get install -y sqlite3 (as root; this test does it itself as root)")


# A pool service that commits a job after the backup and is then killed (SIGKILL): its
# write-ahead log stays behind, as after a crash, with that job in it.
LATE_WRITER = """
import sys, time
from jupyter_gpushare.pool.store.database import Store
store = Store(sys.argv[1])
job = store.jobs.add(time.time(), user="bob", project="vision", name="late", gpus=1000,
                    priority=0, command=["true"], env={}, checkpoint_dir="")
print(job.id, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["backup-sqlite", "backup-python"])
def test_sqlite_backup_and_restore_as_the_page_says(tmp_path, how):
    sqlite_tool()  # the check and the schema query use it either way
    state, backups = tmp_path / "state", tmp_path / "backup"
    state.mkdir(mode=0o700)
    database = state / "gpushare.sqlite"
    url = f"sqlite:///{database}"
    store = Store(url)
    store.quotas.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=["vision"])])
    kept = make_job(store, "kept", state="running")
    waiting = make_job(store, "waiting")
    wal = Path(f"{database}-wal")
    assert wal.exists() and wal.stat().st_size > 0, "the jobs are not in the write-ahead log"

    # A write in progress while the backup runs: flushed, not committed (it holds the
    # database's write lock); the store's own connections stay open too.
    writing = store.session()
    writing.add(JobRow(id="j-inflight", user="alice", project="vision", name="uncommitted",
                       gpus=1000, priority=0, command=["true"], env={}, state="pending",
                       attempt=1, submitted=time.time(), pending_since=time.time()))
    writing.flush()

    swap = {STATE: str(state), BACKUPS: str(backups)}
    backups.mkdir()
    run_block(how, swap, env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    writing.rollback()
    writing.close()
    [copy] = backups.glob("gpushare-*.sqlite")
    assert re.fullmatch(r"gpushare-\d{4}-\d{2}-\d{2}\.sqlite", copy.name)
    assert copy.stat().st_mode & 0o077 == 0, "the copy is readable by others (umask 077)"
    dated = {m.group(0): str(copy) for m in DATED.finditer(PAGE.read_text())
             if m.group(1) == "sqlite"}
    run_block("backup-check", {**dated, **swap})

    # After the backup the job that waited starts, the service stops; then (started again)
    # it accepts a job and is killed, leaving that job in its write-ahead log, as a crash.
    store.jobs.start(waiting, {"node-0": 1000}, time.time())
    store.engine.dispose()
    late = subprocess.Popen([sys.executable, "-c", LATE_WRITER, url], stdout=subprocess.PIPE,
                            text=True)
    try:
        late_id = late.stdout.readline().strip()
        assert late_id.startswith("j-")
    finally:
        late.send_signal(signal.SIGKILL)
        late.wait()
    assert wal.exists() and wal.stat().st_size > 0, "the killed service left no log"

    # The restore, as the page says (the hub, and so the service, stopped).
    run_block("restore-sqlite", {**dated, **swap})
    assert not Path(f"{database}-wal").exists() and not Path(f"{database}-shm").exists()
    assert (backups / "replaced" / "gpushare.sqlite").exists()

    again = Store(url)
    row = again.jobs.get(kept)
    assert (row.name, row.state, row.env, row.placement) == ("kept", "running", {"SEED": "1"},
                                                             {"node-0": 1000})
    assert again.jobs.get(waiting).state == "pending"  # as at the backup: it waits again
    assert again.jobs.get(late_id) is None  # accepted after the backup: gone
    assert again.jobs.get("j-inflight") is None  # never committed
    assert [e.kind for e in again.jobs.events(kept)] == ["submit", "start"]
    assert again.quotas.project("vision").quota == 2000
    with again.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
    again.engine.dispose()
    assert database.stat().st_mode & 0o077 == 0


def test_postgresql_backup_and_restore_as_the_page_says(tmp_path, postgresql):
    if shutil.which("pg_dump") is None or shutil.which("pg_restore") is None:
        pytest.skip("SKIPPED LOUDLY: the page's PostgreSQL recipe needs pg_dump and pg_restore "
                    "(Debian's postgresql-client)")
    url = postgresql.database()
    address = url.replace("postgresql+psycopg://", "postgresql://")
    store = Store(url)
    store.quotas.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=["vision"])])
    kept = make_job(store, "kept", state="running")
    backups = tmp_path / "backup"
    backups.mkdir()
    swap = {PG_ADDRESS: address, BACKUPS: str(backups)}
    run_block("backup-postgresql", swap)
    [copy] = backups.glob("gpushare-*.dump")
    assert copy.stat().st_mode & 0o077 == 0
    late = make_job(store, "late")
    store.quotas.update_project("vision", {"quota": 1000}, time.time())
    store.engine.dispose()

    dated = {m.group(0): str(copy) for m in DATED.finditer(PAGE.read_text())
             if m.group(1) == "dump"}
    run_block("restore-postgresql", {**dated, **swap})

    again = Store(url)
    assert again.jobs.get(kept).state == "running"
    assert again.jobs.get(late) is None
    assert again.quotas.project("vision").quota == 2000
    again.engine.dispose()


def test_the_page_names_every_block_this_test_runs():
    assert set(BLOCKS) >= {"backup-sqlite", "backup-python", "backup-check", "backup-postgresql",
                           "restore-sqlite", "restore-postgresql"}
