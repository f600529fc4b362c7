"""The pool's store: migrations build exactly the models, nothing accepted is lost, and each
part of the store keeps to its own kind of record."""

import ast
import importlib
import time

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from jupyter_gpushare.pool.store.database import Store, StoreError
from jupyter_gpushare.pool.store.models import Base, ProjectRow


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
    store.quotas.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=["vision"])])
    job = store.jobs.add(time.time(), user="alice", project="vision", name="t", gpus=2000,
                         priority=0, command=["true"], env={"A": "1"}, checkpoint_dir="")
    store.jobs.start(job.id, {"sim-node-0": 2000}, time.time())
    store.jobs.mark(job.id, time.time(), preempting=True, detail="for nlp")
    requeued = store.jobs.requeue(job.id, time.time(), "preempted")
    assert (requeued.id, requeued.attempt, requeued.state) == (job.id, 2, "pending")
    again = Store(url)  # a restart: the migration is a no-op and everything is there
    row = again.jobs.get(job.id)
    assert (row.attempt, row.state, row.env, row.placement) == (2, "pending", {"A": "1"}, {})
    assert [a.outcome for a in again.jobs.attempts(job.id)] == ["preempted"]
    assert [e.kind for e in again.jobs.events(job.id)] == ["submit", "start", "preempt", "requeue"]
    # Configured projects do not overwrite what admins changed since.
    again.quotas.update_project("vision", {"quota": 3000}, time.time())
    again.quotas.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=["vision"])])
    assert again.quotas.project("vision").quota == 3000


def test_a_database_of_a_newer_version_is_refused_with_a_sentence(tmp_path):
    """An older version started on a newer version's database (a downgrade) says so and
    changes nothing, instead of a traceback from alembic that the supervisor would repeat."""
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    Store(url).quotas.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=[])])
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    engine.dispose()
    with pytest.raises(StoreError) as refused:
        Store(url)
    assert str(refused.value) == (
        "The pool's database was made by a newer version of jupyter-gpushare (schema "
        "9999_from_the_future, which this version does not know): install that version "
        "again, or restore the backup made before the upgrade.")
    engine = create_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == \
            "9999_from_the_future"
        assert conn.exec_driver_sql("SELECT name FROM projects").scalars().all() == ["vision"]
    engine.dispose()


def test_the_service_stops_with_that_sentence(tmp_path, capsys):
    from jupyter_gpushare.pool.app import PoolService

    Store(f"sqlite:///{tmp_path / 'gpushare.sqlite'}")
    engine = create_engine(f"sqlite:///{tmp_path / 'gpushare.sqlite'}")
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    engine.dispose()
    service = PoolService()
    with pytest.raises(SystemExit) as stopped:
        service.initialize([f"--PoolService.state_dir={tmp_path}", "--PoolService.config_file=",
                            "--LocalBackend.simulate_gpus=True"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "made by a newer version of jupyter-gpushare" in err and "Traceback" not in err


def test_migrations_on_postgresql(postgresql):
    url = postgresql.database()
    store = Store(url)
    assert schema_diff(store) == []
    job = store.jobs.add(time.time(), user="bob", project="nlp", name="", gpus=1000,
                         priority=0, command=["true"], env={}, checkpoint_dir="")
    assert Store(url).jobs.get(job.id).user == "bob"
    store.past_use.add(3600, {("nlp", 5): 1.5}, forget_before=0)
    store.past_use.add(3600, {("nlp", 5): 1.0}, forget_before=0)
    assert Store(url).past_use.buckets(3600, 0) == [("nlp", 5, 2.5)]
    check_departments(store, url)
    check_request_ids(store)
    store.engine.dispose()


def check_request_ids(store: Store):
    fields = dict(project="a", name="", gpus=1000, priority=0, command=["true"], env={},
                  checkpoint_dir="")
    first, created = store.jobs.add_once(time.time(), "key-1", user="ann", **fields)
    again, created_again = store.jobs.add_once(time.time(), "key-1", user="ann", **fields)
    assert created and not created_again and again.id == first.id
    other, created = store.jobs.add_once(time.time(), "key-1", user="bob", **fields)
    assert created and other.id != first.id  # keys are per user
    plain = [store.jobs.add_once(time.time(), None, user="ann", **fields) for _ in range(2)]
    assert all(made for _, made in plain) and plain[0][0].id != plain[1][0].id
    with pytest.raises(IntegrityError):  # the constraint holds where two tries race
        store.jobs.add(time.time(), user="ann", request_id="key-1", **fields)


def check_departments(store: Store, url: str):
    from jupyter_gpushare.pool.admin.project_specs import ProjectSpec

    store.quotas.add_missing_projects([ProjectSpec(n, 2000).row()
                                       for n in ("alice", "bob", "carol")])
    store.quotas.put_department("research", {"quota": 4000, "limit": 6000}, ["alice", "bob"], 1.0)
    again = Store(url)
    assert again.quotas.members("research") == ["alice", "bob"]
    research = again.quotas.department("research")
    assert (research.quota, research.limit) == (4000, 6000)
    store.quotas.put_department("research", {"quota": 5000}, ["bob", "carol"], 2.0)  # alice leaves
    assert again.quotas.members("research") == ["bob", "carol"]
    assert again.quotas.project("alice").department is None
    assert again.quotas.department("research").limit == 6000  # unchanged fields stay
    store.quotas.put_department("research", {"limit": None}, None, 3.0)  # members stay
    assert again.quotas.members("research") == ["bob", "carol"]
    assert again.quotas.delete_department("research")
    assert not again.quotas.delete_department("research")
    assert again.quotas.departments() == [] and again.quotas.project("bob").department is None


def test_departments_are_kept_with_their_projects(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    check_departments(Store(url), url)


def test_a_request_id_makes_one_job_per_user(tmp_path):
    check_request_ids(Store(f"sqlite:///{tmp_path / 'pool.sqlite'}"))


def test_counts_are_not_capped_by_list_limits(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    for _ in range(3):
        store.jobs.add(time.time(), user="ann", project="a", name="", gpus=1000, priority=0,
                       command=["true"], env={}, checkpoint_dir="")
    done = store.jobs.add(time.time(), user="ann", project="b", name="", gpus=1000,
                          priority=0, command=["true"], env={}, checkpoint_dir="")
    store.jobs.finish(done.id, time.time(), "succeeded")
    assert store.jobs.pending_counts() == {"a": 3}
    assert store.jobs.state_counts("ann") == {"pending": 3, "succeeded": 1}
    assert len(store.jobs.newest(user="ann", limit=2)) == 2


def test_an_0006_database_is_upgraded_with_its_data_kept(tmp_path):
    """The audit trail and drained nodes (0007), the fair share's borrowed GPU-time (0008) and
    departments (0009) and each attempt's stop (0010) come to a database an older version
    made, and its projects and jobs stay."""
    from alembic import command
    from alembic.config import Config

    from jupyter_gpushare.pool.store.database import MIGRATIONS, make_engine

    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0006")
        conn.exec_driver_sql(
            "INSERT INTO projects (name, quota, over_quota_weight, priority, groups, updated, "
            "job_priority_min, job_priority_max) VALUES ('vision', 2000, 1, 0, '[]', 0, -100, 0)")
        conn.exec_driver_sql(
            "INSERT INTO jobs (id, user, project, name, gpus, priority, command, env, per_gpu, "
            "checkpoint_dir, state, attempt, submitted, pending_since, placement, handle, "
            "preempting, cancel_requested, message) VALUES ('j-1', 'ann', 'vision', '', 1000, "
            "0, '[\"true\"]', '{}', 0, '', 'pending', 1, 1, 1, '{}', '{}', 0, 0, '')")
    engine.dispose()
    store = Store(url)
    assert store.quotas.project("vision").quota == 2000 and store.jobs.get("j-1").user == "ann"
    assert store.audit.newest() == [] and store.drains.all() == {}
    assert store.past_use.buckets(3600, 0) == []
    assert store.quotas.departments() == [] and store.quotas.project("vision").department is None
    assert schema_diff(store) == []
    with store.engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_heads() == ("0010",)


def test_the_fair_shares_borrowed_gpu_time_adds_up_and_old_buckets_are_forgotten(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.past_use.add(3600, {("a", 10): 5.0, ("b", 11): 1.0}, forget_before=0)
    store.past_use.add(3600, {("a", 10): 2.0, ("a", 12): 4.0}, forget_before=0)
    assert sorted(store.past_use.buckets(3600, 0)) == [("a", 10, 7.0), ("a", 12, 4.0),
                                                       ("b", 11, 1.0)]
    store.past_use.add(3600, {}, forget_before=11)
    assert sorted(store.past_use.buckets(3600, 0)) == [("a", 12, 4.0), ("b", 11, 1.0)]
    store.past_use.add(60, {("a", 700): 1.0}, forget_before=0)  # the window was changed
    assert store.past_use.buckets(3600, 0) == []
    assert store.past_use.buckets(60, 0) == [("a", 700, 1.0)]


def test_the_audit_trail_pages_newest_first_and_forgets_old_entries(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    store = Store(url)
    for i in range(5):
        store.audit.add(1000.0 + i, "admin", "change project", "vision", {"quota": i},
                        {"quota": i + 1}, "api", "10.0.0.1")
    newest = store.audit.newest(limit=2)
    assert [e.before["quota"] for e in newest] == [4, 3]
    older = store.audit.newest(before_id=newest[-1].id, limit=2)
    assert [e.before["quota"] for e in older] == [2, 1]
    assert [e.at for e in store.audit.newest(since=1003.0)] == [1004.0, 1003.0]
    assert store.audit.prune(1002.0) == 2
    again = Store(url)  # kept across a restart, the pruned ones gone
    assert [e.at for e in again.audit.newest()] == [1004.0, 1003.0, 1002.0]
    assert again.audit.newest()[0].address == "10.0.0.1" and again.audit.newest()[0].via == "api"


def test_a_drain_is_kept_until_undrained(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    store = Store(url)
    store.drains.add("node-1", "admin", 100.0)
    store.drains.add("node-1", "other", 200.0)  # drained already: who and since stay
    row = Store(url).drains.all()["node-1"]
    assert (row.by, row.since) == ("admin", 100.0)
    assert store.drains.remove("node-1").by == "admin" and store.drains.remove("node-1") is None
    assert Store(url).drains.all() == {}


# Each part of the store, by its attribute: its class, and the only models its module may use.
PARTS = {
    "quotas": ("QuotaStore", {"ProjectRow", "DepartmentRow"}),
    "jobs": ("JobStore", {"JobRow", "AttemptRow", "EventRow"}),
    "slices": ("SliceStore", {"SliceRow"}),
    "audit": ("AuditStore", {"AuditRow"}),
    "drains": ("DrainStore", {"DrainRow"}),
    "past_use": ("PastUseStore", {"FairShareRow"}),
}


def store_imports(module_name: str) -> dict[str, set[str]]:
    """What a module of ``pool/store`` imports from its siblings: module → names."""
    module = importlib.import_module(f"jupyter_gpushare.pool.store.{module_name}")
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(open(module.__file__).read())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.setdefault(node.module, set()).update(a.name for a in node.names)
    return found


def test_each_part_of_the_store_touches_only_its_own_kind_of_record(tmp_path):
    """A part reads and writes only its own tables (it imports only their models, and no other
    part), so a new kind of record gets a part of its own instead of growing another; the
    ``Store`` itself holds no records but the job book's (its commit hooks)."""
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    for attribute, (cls, models) in PARTS.items():
        assert type(getattr(store, attribute)).__name__ == cls
        assert store_imports(attribute) == {"models": models}, attribute
    assert store_imports("database")["models"] == {"JobRow"}
    owned = set().union(*(models for _, models in PARTS.values())) | {"UsageRow"}
    assert owned == {m.class_.__name__ for m in Base.registry.mappers}  # every table has a part


def test_a_batch_holds_the_writes_of_every_part_in_one_transaction(tmp_path):
    """Parts never commit themselves: inside ``batch`` a change and its audit entry are
    stored together or not at all."""
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.quotas.add_missing_projects([ProjectRow(name="vision", quota=2000, groups=[])])

    def change():
        store.quotas.update_project("vision", {"quota": 3000}, 1.0)
        store.audit.add(1.0, "admin", "change project", "vision", {"quota": 2}, {"quota": 3},
                        "api")

    with pytest.raises(RuntimeError), store.batch():
        change()
        raise RuntimeError("fails half-way")
    assert store.quotas.project("vision").quota == 2000 and store.audit.newest() == []
    with store.batch():
        change()
    assert store.quotas.project("vision").quota == 3000 and len(store.audit.newest()) == 1
