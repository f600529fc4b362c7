"""Which build slices the pool releases when it starts (pool/sweep.py): the pure choice."""

from jupyter_gpushare.pool.models import SliceRow
from jupyter_gpushare.pool.sweep import UNKNOWN, stale


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
