"""The job book (pool/store/job_book.py): lists from memory are the lists the database gives,
through every kind of write, a rollback, a restart, and a book too small to hold every job."""

import random
import time

import pytest
from sqlalchemy import select

from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.models import JobRow

FIELDS = dict(name="", gpus=1000, priority=0, command=["true"], env={"A": "1"},
              checkpoint_dir="")
COLUMNS = [c.key for c in JobRow.__table__.columns]


def from_database(store, user=None, project=None, states=None, limit=1000):
    q = select(JobRow)
    if user is not None:
        q = q.where(JobRow.user == user)
    if project is not None:
        q = q.where(JobRow.project == project)
    if states is not None:
        q = q.where(JobRow.state.in_(list(states)))
    q = q.order_by(JobRow.submitted.desc(), JobRow.id).limit(limit)
    with store.session() as s:
        return [{c: getattr(r, c) for c in COLUMNS} for r in s.scalars(q)]


def listed(rows):
    return [{c: getattr(r, c) for c in COLUMNS} for r in rows]


QUERIES = [dict(), dict(user="ann"), dict(user="bob", states=["pending"]),
           dict(project="p1"), dict(project="p2", states=["running", "failed"], limit=3),
           dict(states=["succeeded"], limit=5), dict(user="ann", limit=1)]


def check_all(store):
    for q in QUERIES:
        assert listed(store.jobs.newest(**q)) == from_database(store, **q), q


def churn(store, rng, n, t0):
    """Submits (some at equal times), starts, preemptions, requeues and ends, as the loop
    makes them, some of the ends in one batch."""
    ids = []
    for i in range(n):
        user, project = rng.choice(["ann", "bob", "cy"]), rng.choice(["p1", "p2"])
        ids.append(store.jobs.add(t0 + i // 2, user=user, project=project, **FIELDS).id)
    store.jobs.start_many([(j, {"n0": 1000}) for j in ids[::2]], t0 + n)
    store.jobs.set_handles({j: {"pid": 1} for j in ids[::4]})
    store.jobs.mark(ids[2], t0 + n, preempting=True, detail="for p2")
    store.jobs.requeue(ids[2], t0 + n, "preempted", "requeued")
    with store.batch():
        for j in ids[4::4]:
            store.jobs.finish(j, t0 + n + 1, rng.choice(["succeeded", "failed"]), 0)
    store.jobs.finish(ids[1], t0 + n + 1, "cancelled", message="cancelled by its user")
    return ids


def test_the_book_lists_what_the_database_does(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    store, rng = Store(url), random.Random(1)
    check_all(store)  # empty
    churn(store, rng, 40, 1000.0)
    check_all(store)
    # A session that rolls back leaves the book as it was.
    before = store.book.version
    with pytest.raises(RuntimeError):
        with store.session() as s:
            s.get(JobRow, store.jobs.newest(limit=1)[0].id).state = "failed"
            s.flush()
            raise RuntimeError
    assert store.book.version == before
    check_all(store)
    # So does a rolled-back change in a session that then commits something else.
    victim = store.jobs.newest(limit=1)[0]
    with store.session() as s:
        s.get(JobRow, victim.id).state = "failed"
        s.flush()
        s.rollback()
        s.add(JobRow(id="j-after-rollback", submitted=5000.0, user="ann", project="p1",
                     state="pending", pending_since=5000.0, **FIELDS))
        s.commit()
    assert store.book.get(victim.id).state == victim.state
    check_all(store)
    # A restart loads the book from the database.
    again = Store(url)
    check_all(again)
    assert len(again.book) == 41


def test_a_small_book_forgets_ended_jobs_and_asks_the_database(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    store, rng = Store(url, book_size=15), random.Random(2)
    ids = churn(store, rng, 40, 1000.0)
    assert len(store.book) <= 15 + len(store.book.active())
    assert all(store.book.get(j) is not None for j in ids
               if store.jobs.get(j).state in ("pending", "running"))
    check_all(store)
    churn(store, rng, 30, 5000.0)
    check_all(store)
    again = Store(url, book_size=15)  # loaded from the database, not all of it
    check_all(again)


def test_copies_handed_out_do_not_change_under_the_reader(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    job = store.jobs.add(time.time(), user="ann", project="p1", **FIELDS)
    seen = store.jobs.newest(user="ann")[0]
    store.jobs.start(job.id, {"n0": 1000}, time.time())
    assert seen.state == "pending"
    assert store.jobs.newest(user="ann")[0].state == "running"


def test_a_write_in_a_worker_thread_reaches_the_book_before_its_caller_resumes(tmp_path):
    import asyncio
    import threading

    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")

    async def main():
        seen = []
        original = store.book.committed
        store.book.committed = lambda copies: (seen.append(threading.get_ident()),
                                               original(copies))
        job = await store.in_thread(store.jobs.add, time.time(), user="ann", project="p1",
                                    **FIELDS)
        assert [j.id for j in store.jobs.newest(user="ann")] == [job.id]
        await store.in_thread(store.jobs.start_many, [(job.id, {"n0": 1000})], time.time())
        assert store.jobs.newest(user="ann")[0].state == "running"
        return seen

    seen = asyncio.run(main())
    assert seen == [threading.get_ident()] * 2  # applied on the loop's thread, not the worker's
    check_all(store)


def test_a_book_within_its_bytes_keeps_big_jobs_only_while_they_are_active(tmp_path):
    url = f"sqlite:///{tmp_path / 'pool.sqlite'}"
    store = Store(url, book_bytes=200_000)
    big = dict(FIELDS, env={"DATA": "x" * 60_000})
    ids = [store.jobs.add(1000.0 + i, user="ann", project="p1", **big).id for i in range(6)]
    assert len(store.book) == 6  # all waiting: kept, whatever they weigh
    for j in ids:
        store.jobs.finish(j, 2000.0, "succeeded", 0)
    assert store.book.bytes <= 200_000 and len(store.book) < 6
    check_all(store)
