"""The pool's store: migrations build exactly the models, and nothing accepted is lost."""

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from jupyter_gpushare.pool.models import Base, ProjectRow
from jupyter_gpushare.pool.store import Store


def schema_diff(store: Store):
    with store.engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn), Base.metadata)


def test_migrations_build_exactly_the_models(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    assert schema_diff(store) == []
    with store.engine.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
    assert mode == "wal"


def test_jobs_attempts_and_events_survive_reopening(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    store = Store(url)
    store.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=["vision"])])
    job = store.add_job(time.time(), user="alice", project="vision", name="t", gpus=2000,
                        priority=0, command=["true"], env={"A": "1"}, checkpoint_dir="")
    store.start(job.id, {"sim-node-0": 2000}, time.time())
    store.mark(job.id, time.time(), preempting=True, detail="for nlp")
    requeued = store.requeue(job.id, time.time(), "preempted")
    assert (requeued.id, requeued.attempt, requeued.state) == (job.id, 2, "pending")
    again = Store(url)  # a restart: the migration is a no-op and everything is there
    row = again.job(job.id)
    assert (row.attempt, row.state, row.env, row.placement) == (2, "pending", {"A": "1"}, {})
    assert [a.outcome for a in again.attempts(job.id)] == ["preempted"]
    assert [e.kind for e in again.events(job.id)] == ["submit", "start", "preempt", "requeue"]
    # Configured projects do not overwrite what admins changed since.
    again.update_project("vision", {"quota": 3000}, time.time())
    again.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=["vision"])])
    assert again.project("vision").quota == 3000


def _postgres_bin():
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def test_migrations_on_postgresql():
    bin_dir = _postgres_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql); "
                    "the store's PostgreSQL path is not tested here")
    pytest.importorskip("psycopg", reason="pip install 'psycopg[binary]' to test PostgreSQL")
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []  # initdb refuses root
    base = Path(tempfile.mkdtemp(prefix="gpushare-pg-"))  # pytest's own is closed to postgres
    data, sock = base / "pg", base / "sock"
    sock.mkdir()
    if run_as:
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run([*run_as, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U",
                    "gpushare"], check=True, capture_output=True)
    # The server gets a log file, not our pipes: it outlives pg_ctl and would hold them open.
    subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l",
                    str(base / "server.log"), "-o", f"-k {sock} -c listen_addresses=''", "start"],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    try:
        subprocess.run([*run_as, str(bin_dir / "createdb"), "-h", str(sock), "-U", "gpushare",
                        "pool"], check=True, capture_output=True)
        store = Store(f"postgresql+psycopg://gpushare@/pool?host={sock}")
        assert schema_diff(store) == []
        job = store.add_job(time.time(), user="bob", project="nlp", name="", gpus=1000,
                            priority=0, command=["true"], env={}, checkpoint_dir="")
        assert Store(f"postgresql+psycopg://gpushare@/pool?host={sock}").job(job.id).user == "bob"
        store.engine.dispose()
    finally:
        subprocess.run([*run_as, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast",
                        "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_counts_are_not_capped_by_list_limits(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    for _ in range(3):
        store.add_job(time.time(), user="ann", project="a", name="", gpus=1000, priority=0,
                      command=["true"], env={}, checkpoint_dir="")
    done = store.add_job(time.time(), user="ann", project="b", name="", gpus=1000,
                         priority=0, command=["true"], env={}, checkpoint_dir="")
    store.finish(done.id, time.time(), "succeeded")
    assert store.pending_counts() == {"a": 3}
    assert store.state_counts("ann") == {"pending": 3, "succeeded": 1}
    assert len(store.jobs(user="ann", limit=2)) == 2
