"""Which build slices the pool releases when it starts (pool/housekeeping.py): the pure choice."""

from jupyter_gpushare.pool.housekeeping import UNKNOWN, stale
from jupyter_gpushare.pool.store.models import SliceRow


def _slice(id, user, server):
    return SliceRow(id=id, user=user, server=server, milli=250, node="b", gpu=0, created=0.0)


def test_only_slices_of_servers_the_hub_says_do_not_run_are_stale():
    slices = [_slice("a", "alice", ""), _slice("b", "alice", "big"), _slice("c", "bob", ""),
              _slice("d", "gone", ""), _slice("e", "carol", "")]
    servers = {"alice": {"big"},      # her default server stopped, "big" runs
               "bob": {""},            # runs
               "gone": set(),          # the hub does not know this user: nothing runs
               "carol": UNKNOWN}       # the hub could not say: keep
    assert [s.id for s in stale(slices, servers)] == ["a", "d"]
    assert stale(slices, {}) == []  # nobody asked: nothing released


def test_the_sweep_forgets_audit_entries_older_than_their_retention(tmp_path, caplog):
    import asyncio
    import logging
    import time

    from jupyter_gpushare.pool.store.database import Store
    from jupyter_gpushare.pool.housekeeping import prune_audit

    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    now = time.time()
    for days in (400, 366, 364, 1):
        store.audit.add(now - days * 86400, "admin", "change project", "vision", None, {},
                        "api")

    async def one_sweep():
        task = asyncio.ensure_future(prune_audit(store, 365, logging.getLogger("test"),
                                                 every_s=3600))
        # until the sweep has said what it did: the entries go at its commit, in a worker
        # thread, and its line comes after (cancelled at the commit, it said nothing)
        while "Forgot" not in caplog.text:
            await asyncio.sleep(0.01)
        task.cancel()

    with caplog.at_level(logging.INFO):
        asyncio.run(asyncio.wait_for(one_sweep(), 10))
    assert [round((now - e.at) / 86400) for e in store.audit.newest()] == [1, 364]
    assert "Forgot 2 audit entries older than 365 days" in caplog.text
