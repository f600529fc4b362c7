"""The cycle's steps one at a time: the fit memo, the two orders of step 3, the reclaim
rules, the ledger that owns every change of a cycle (the collector held off in every step's
module: test_policy_scenarios); and, read from the source, that no module of the policy
changes another's state and that the within-share rule is written once."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from builders import GPU, cluster, pending, project

from jupyter_gpushare.policy import Preempt, PreemptKind, Project, TrainJob
from jupyter_gpushare.policy.fits import NEVER, FitMemo, Way
from jupyter_gpushare.policy.ledger import LEAST, Ledger
from jupyter_gpushare.policy.order import Order
from jupyter_gpushare.policy.placement import FreeMap
from jupyter_gpushare.policy.preemption import Reclaim
from jupyter_gpushare.policy.queues import Queues

POLICY = Path(__file__).resolve().parents[1] / "jupyter_gpushare" / "policy"


# -- fits.py --------------------------------------------------------------------------------

def test_the_memo_says_a_gang_as_large_as_one_that_failed_fails():
    memo = FitMemo()
    assert memo.smallest(Way.BORROWING, False, 1) == NEVER
    memo.failed(Way.BORROWING, False, 1, 4 * GPU)
    assert memo.fails(Way.BORROWING, False, 1, 4 * GPU)
    assert memo.fails(Way.BORROWING, False, 1, 6 * GPU)
    assert not memo.fails(Way.BORROWING, False, 1, 2 * GPU)


@pytest.mark.parametrize("way, excluded, nodes", [
    (Way.WITHIN_QUOTA, False, 1),  # another way
    (Way.UNRESERVED, False, 1),
    (Reclaim.FAIR, False, 1),  # a reclaim rule
    (Way.BORROWING, True, 1),  # kept out of reserved nodes
    (Way.BORROWING, False, 2),  # on more nodes
])
def test_the_memo_keeps_failures_apart(way, excluded, nodes):
    memo = FitMemo()
    memo.failed(Way.BORROWING, False, 1, 1 * GPU)
    assert not memo.fails(way, excluded, nodes, 8 * GPU)


def test_ways_and_reclaim_rules_never_share_a_memo_key():
    assert not {w.value for w in Way} & {r.value for r in Reclaim}


# -- order.py -------------------------------------------------------------------------------

def _order(snap, usage=None):
    view = Queues(snap.jobs).view()
    projects = {p.name: p for p in snap.projects}
    deserved = {name: p.quota for name, p in projects.items()}
    ledger = Ledger({**dict.fromkeys(projects, 0), **(usage or {})}, projects, deserved)
    return Order(view.pending, view.smallest, projects, ledger), ledger


def test_within_quota_goes_by_project_priority_then_submit_time_and_reads_the_room_as_it_goes():
    snap = (cluster(nodes=2)
            .projects(project("a").quota(4), project("b").quota(4).priority(1))
            .jobs(pending("a1", "a", 2, submitted=1), pending("a2", "a", 2, submitted=2),
                  pending("a3", "a", 2, submitted=3), pending("b1", "b", 4, submitted=5),
                  pending("b2", "b", 1, submitted=6))
            .at(10))
    order, ledger = _order(snap)
    seen = []
    for job in order.within_quota():
        seen.append(job.id)
        if job.id == "a1":  # admitted: a's room shrinks before a2 is asked for
            ledger.claim("a", 3 * GPU)
    # b first (its priority; b1 was not admitted here, so b2 still fits); then a1 takes 3 of
    # a's 4 GPUs, and a2 and a3 no longer keep a within its quota.
    assert seen == ["b1", "b2", "a1"]
    assert order.seen == {"b1", "b2", "a1"}


def test_borrowers_go_by_fair_share_and_parked_projects_are_explained_in_order():
    snap = (cluster(nodes=2)
            .projects(project("a").quota(1), project("b").quota(1), project("c").quota(1))
            .jobs(*(pending(f"{p}{i}", p, 1, submitted=i) for p in "abc" for i in range(2)))
            .at(10))
    order, _ = _order(snap, usage={"a": 2 * GPU})  # a is furthest beyond its share: last
    turn = order.borrowers()
    visited = []
    for name, i in turn:
        visited.append(order.queues[name][i].id)
        if name == "c":
            turn.park()
        else:
            turn.go_on(name, i + 1)
    assert visited == ["b0", "b1", "c0", "a0", "a1"]
    assert [job.id for job in turn.unvisited()] == ["c0", "c1"]


# -- preemption.py --------------------------------------------------------------------------

def test_a_reclaim_rule_is_the_kind_a_preemption_reports():
    assert [r.value for r in Reclaim] == ["guarantee", "fair", "priority", "move"]
    assert [r.kind for r in Reclaim] == [PreemptKind.GUARANTEE, PreemptKind.FAIR,
                                         PreemptKind.PRIORITY, PreemptKind.MOVE]
    assert Preempt("j", "p", "c", "why").kind is PreemptKind.GUARANTEE


def test_a_preemption_kind_is_a_named_type_that_reads_as_its_word():
    taken = Preempt("j", "p", "", "why", "take back")  # a caller with the word alone
    assert taken.kind is PreemptKind.TAKE_BACK
    assert PreemptKind.MOVE == "move" and f"{PreemptKind.TAKE_BACK}" == "take back"
    assert {"guarantee": 1}[PreemptKind.GUARANTEE] == 1
    assert PreemptKind.GUARANTEE == Reclaim.GUARANTEE  # what the simulator compares
    with pytest.raises(ValueError):
        Preempt("j", "p", "c", "why", "evicted")


def test_reclaim_rules_set_their_floors():
    projects = {"p": Project("p", quota=4 * GPU)}
    deserved = {"p": 6 * GPU}
    guarantee = Reclaim.GUARANTEE.floor(projects, deserved)
    fair = Reclaim.FAIR.floor(projects, deserved)
    priority = Reclaim.PRIORITY.floor(projects, deserved)
    assert (guarantee.above("p"), guarantee.keep("p"), guarantee.prefer("p")) == (4000, 0, 4000)
    assert (fair.above("p"), fair.keep("p"), fair.prefer("p")) == (6000, 6000, 6000)
    assert (priority.above("p"), priority.keep("p"), priority.prefer("p")) == (-1, 0, 4000)


# -- ledger.py ----------------------------------------------------------------------------------

def _running(job_id, project, placement, gpus=None):
    return TrainJob(job_id, project, gpus or sum(placement.values()), placement=placement)


class Watcher:
    """An index that follows the free and releasing GPUs, as reclaim's victim pools do."""

    def __init__(self):
        self.told = []

    def moved(self, names):
        self.told.append(set(names))


def test_the_ledger_books_a_start_a_claim_and_its_victims():
    projects = {"a": Project("a", quota=4 * GPU), "b": Project("b", quota=0)}
    ledger = Ledger({"a": 0, "b": 4 * GPU}, projects, {"a": 4 * GPU, "b": 2 * GPU},
                    free=FreeMap({"n0": 1 * GPU, "n1": 0}, 4 * GPU), releasing={"n1": 1 * GPU})
    watcher = Watcher()
    ledger.watch(watcher)
    assert ledger.room.free == {"n0": 1 * GPU, "n1": 1 * GPU}

    ledger.start(_running("a1", "a", {}, 1 * GPU), {"n0": 1 * GPU})
    assert (ledger.usage["a"], ledger.free.free["n0"], ledger.room.free["n0"]) == (1 * GPU, 0, 0)

    # a2 needs 3 GPUs on n1: the one releasing there, and two of b's job b1 there
    taken = ledger.hold({"n1": 3 * GPU})
    assert taken == {"n1": 2 * GPU} and ledger.releasing["n1"] == 0
    victim = _running("b1", "b", {"n1": 3 * GPU})
    ledger.evict([victim], "a2", PreemptKind.GUARANTEE, "for a2", taken)
    ledger.claim("a", 3 * GPU)
    assert ledger.preemptions == [Preempt("b1", "b", "a2", "for a2", PreemptKind.GUARANTEE)]
    assert ledger.evicted == {"b1"} and taken == {"n1": 0}
    assert (ledger.usage["b"], ledger.kept["b"]) == (1 * GPU, 1 * GPU)
    assert ledger.releasing["n1"] == 1 * GPU  # b1's third GPU: for others
    assert ledger.room.free["n1"] == 1 * GPU
    assert ledger.committed("a") == 4 * GPU and not ledger.within_quota("a", LEAST)
    assert [s.job for s in ledger.starts] == ["a1"]
    assert watcher.told == [{"n0"}, {"n1"}, {"n1"}]


def test_a_moved_job_keeps_its_projects_gpus_where_it_goes():
    projects = {"a": Project("a", quota=2 * GPU)}
    ledger = Ledger({"a": 1 * GPU}, projects, free=FreeMap({"n0": 0, "n1": 1 * GPU}, 2 * GPU))
    ledger.keep_for(_running("a1", "a", {"n0": 1 * GPU}), {"n1": 1 * GPU})
    assert ledger.committed("a") == 2 * GPU
    assert (ledger.held, ledger.free.free["n1"]) == ({"n1": 1 * GPU}, 0)


def test_within_share_is_what_a_project_commits_against_its_deserved_share():
    projects = {"a": Project("a", quota=1 * GPU), "b": Project("b")}
    ledger = Ledger({"a": 1 * GPU, "b": 0}, projects, {"a": 3 * GPU})
    ledger.claim("a", 1 * GPU)
    assert ledger.within_share("a", 1 * GPU) and not ledger.within_share("a", 1 * GPU + 1)
    assert ledger.within_share("a", LEAST)  # below its share
    ledger.claim("a", 1 * GPU)
    assert not ledger.within_share("a", LEAST)  # at its share
    assert not ledger.within_share("b", LEAST)  # no share at all


# -- read from the source ---------------------------------------------------------------------

OWNERS = {
    "ledger.py": {"usage", "kept", "claimed", "free", "lent", "releasing", "held", "room",
                  "starts", "preemptions", "evicted"},
    "order.py": {"seen"},
}
"""What each owner's objects hold; only its own module changes them (an object's own
attributes, ``self.x``, are its own wherever they are named alike)."""
MUTATORS = {"add", "append", "clear", "discard", "extend", "give", "insert", "pop", "popitem",
            "remove", "set", "setdefault", "take", "update"}


def _names(node) -> set[str]:
    """The names and attribute names an expression reads."""
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
            if isinstance(n, (ast.Name, ast.Attribute))}


def _bindings(function) -> dict[str, list[ast.expr]]:
    """Each local name with the values assigned to it (``free, held = x.free, x.held``)."""
    bound: dict[str, list[ast.expr]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts))
                for t, v in pairs:
                    if isinstance(t, ast.Name):
                        bound.setdefault(t.id, []).append(v)
    return bound


def _owned(target, owned: set[str], bound: dict[str, list[ast.expr]]) -> str | None:
    """The owned state ``target`` is, if it is another object's: ``x.free`` (not
    ``self.free``), or a local name bound to such an attribute."""
    while isinstance(target, ast.Subscript):
        target = target.value
    if isinstance(target, ast.Attribute) and target.attr in owned:
        if not (isinstance(target.value, ast.Name) and target.value.id == "self"):
            return ast.unparse(target)
    if isinstance(target, ast.Name):
        for value in bound.get(target.id, ()):
            if _owned(value, owned, {}):
                return f"{target.id} (= {ast.unparse(value)})"
    return None


def _changes(tree: ast.AST, owned: set[str]) -> list[str]:
    """Where ``tree`` changes ``owned`` state of another object."""
    found = []
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.Lambda))]
    for function in functions or [tree]:
        bound = _bindings(function)
        for node in ast.walk(function):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) \
                    else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name) and not isinstance(node, ast.AugAssign):
                        continue  # binding a local name changes nothing
                    what = _owned(target, owned, bound)
                    if what:
                        found.append(f"line {node.lineno}: {what}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in MUTATORS:
                what = _owned(node.func.value, owned, bound)
                if what:
                    found.append(f"line {node.lineno}: {what}.{node.func.attr}()")
    return sorted(set(found))


@pytest.mark.parametrize("source", [
    "def f(self): self.ledger.usage[p] += 1",
    "def f(self): self.c.free.take(placement)",
    "def f(self): self.c.lending.free.take(placement)",
    "def f(self):\n    free, releasing = self.c.free, self.c.releasing\n    releasing[n] -= 1",
    "def f(self):\n    seen = self.order.seen\n    seen.add(job.id)",
    "def f(self): self.ledger.claimed = {}",
    "def f(ledger): ledger.held.pop(name)",
])
def test_the_source_check_finds_a_change_of_another_objects_state(source):
    owned = set().union(*OWNERS.values())
    assert _changes(ast.parse(source), owned)


@pytest.mark.parametrize("source", [
    "def f(self): self.free[name] = new",  # an object's own attribute
    "def f(self):\n    used = dict(pool.used)\n    used[p] -= 1",  # a copy
    "def f(self): self.ledger.start(job, placement)",  # through the owner
    "def f(room): room.give(placement)",  # a map handed to it
])
def test_the_source_check_lets_an_object_change_its_own_state(source):
    owned = set().union(*OWNERS.values())
    assert not _changes(ast.parse(source), owned)


def test_no_module_of_the_policy_changes_another_s_state():
    """Only the owner of a cycle's changes (the ledger, and the order its ``seen``) changes
    them; every other module asks it, as KAI-Scheduler's actions ask its Statement."""
    found = {}
    for path in sorted(POLICY.glob("*.py")):
        owned = set().union(*(attrs for owner, attrs in OWNERS.items() if owner != path.name))
        changes = _changes(ast.parse(path.read_text()), owned)
        if changes:
            found[path.name] = changes
    assert not found, f"these change state another object owns; ask its owner: {found}"


def _reads_committed_against_share(tree: ast.AST) -> list[str]:
    """Comparisons of what a project committed with its deserved share."""
    found = []
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        bound = _bindings(function)
        for node in ast.walk(function):
            if isinstance(node, ast.Compare):
                names = _names(node)
                for name in list(names):
                    for value in bound.get(name, ()):
                        names |= _names(value)
                if names & {"committed", "claimed"} and "deserved" in names:
                    found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_within_share_rule_is_written_once():
    """``Ledger.within_share`` is the rule; every step asks it, none says it again."""
    example = ("def f(self):\n    share = self.deserved.get(p, 0)\n"
               "    return self.ledger.committed(p) >= share")
    assert _reads_committed_against_share(ast.parse(example))
    found = {path.name: lines for path in sorted(POLICY.glob("*.py")) if path.name != "ledger.py"
             if (lines := _reads_committed_against_share(ast.parse(path.read_text())))}
    assert not found, f"ask ledger.within_share instead: {found}"
