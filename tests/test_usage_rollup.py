"""Rolling GPU use up: what a reading adds, minute and hour rows in a real store, the figures
of a window, retention, and the meter's live view (idle streaks, the last hour)."""

import asyncio

import pytest

from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.usage_rollups import Scope, UsageStore
from jupyter_gpushare.usage.attribution import GPUUse, HolderUse, Owner, Stray
from jupyter_gpushare.usage.meter import UsageMeter, UsageSettings
from jupyter_gpushare.usage.report import BY
from jupyter_gpushare.usage.rollup import DAY, HOUR, MINUTE, spans
from jupyter_gpushare.usage.rollup import RowKey, Totals, figures, reading_totals

GiB = 2**30
JOB = Owner("job", "j-1/1", "carol", "vision", "j-1")
IDLE_JOB = Owner("job", "j-2/1", "dave", "nlp", "j-2")
SLICE = Owner("slice", "s-1", "alice")


def gpu(index, holders, utilization, pool="train", node="n0", memory=GiB):
    return GPUUse(node, pool, index, f"GPU-{node}-{index}", "", 80 * GiB, memory, utilization,
                  tuple(holders), Stray(), Stray(), ())


def scenario():
    """Three GPUs: a busy job (90 %), an idle job (1 %), and a build GPU with a ¼ slice that
    uses 20 % of its GPU (80 % of the slice)."""
    return (gpu(0, [HolderUse(JOB, 1000, 90.0, 4 * GiB, 1)], 90.0, memory=4 * GiB),
            gpu(1, [HolderUse(IDLE_JOB, 1000, 1.0, GiB, 1)], 1.0),
            gpu(0, [HolderUse(SLICE, 250, 20.0, 2 * GiB, 1)], 20.0, pool="build", node="b0",
                memory=2 * GiB))


def test_what_one_reading_adds():
    rows = reading_totals(scenario(), 10.0, idle_threshold=5.0)
    job = rows[RowKey("job", "j-1/1", "", "vision", "carol", "j-1")]
    assert (job.allocated, job.measured, job.utilized, job.idle, job.memory_peak) == \
        (10_000, 10_000, 9_000, 0, 4 * GiB)
    idle = rows[RowKey("project", "nlp", project="nlp")]
    assert (idle.allocated, idle.utilized, idle.idle) == (10_000, 100, 10_000)
    sl = rows[RowKey("slice", "s-1", user="alice")]
    assert (sl.allocated, sl.utilized, sl.idle) == (2_500, 2_000, 0)
    assert figures(sl, 10_000)["utilization"] == 0.8  # its share ÷ its fraction
    train = rows[RowKey("pool", "train")]
    assert (train.capacity, train.allocated, train.measured, train.utilized, train.idle) == \
        (20_000, 20_000, 20_000, 9_100, 10_000)
    assert train.memory_peak == 5 * GiB  # both GPUs at that moment
    build = rows[RowKey("pool", "build")]
    assert (build.capacity, build.allocated, build.utilized) == (10_000, 2_500, 2_000)


def test_spans_read_days_and_hours_whole_and_minutes_at_the_edges():
    day = DAY
    assert spans(day + 90, day + 3 * HOUR + 30, 0) == [
        (HOUR, day + HOUR, day + 3 * HOUR), (MINUTE, day + 60, day + HOUR),
        (MINUTE, day + 3 * HOUR, day + 3 * HOUR + 60)]
    assert spans(day + 90, day + 600, 0) == [(MINUTE, day + 60, day + 600)]
    assert spans(day + 90, 4 * day + 30, 0) == [
        (DAY, 2 * day, 4 * day), (HOUR, day + HOUR, 2 * day), (MINUTE, day + 60, day + HOUR),
        (MINUTE, 4 * day, 4 * day + 60)]
    # a series by the hour reads no day rows
    assert spans(day, 3 * day, 0, finest=HOUR) == [(HOUR, day, 3 * day)]
    # minute rows before day + 2 h are gone: the edge is read from its whole hour
    assert spans(day + 90, day + 3 * HOUR, day + 2 * HOUR) == [(HOUR, day, day + 3 * HOUR)]
    assert spans(day + HOUR + 90, 3 * day + 90, 2 * day) == [
        (DAY, 2 * day, 3 * day), (HOUR, day + HOUR, 2 * day), (MINUTE, 3 * day, 3 * day + 120)]
    # a series by the minute reads hours where minutes are gone
    assert spans(day + 90, day + 3 * HOUR, day + 2 * HOUR, finest=MINUTE) == [
        (HOUR, day, day + 2 * HOUR), (MINUTE, day + 2 * HOUR, day + 3 * HOUR)]

    # hour and day rows only where summed: the open hour (or one not summed yet) from minutes
    assert spans(day + 90, day + 3 * HOUR, 0, rolled=(day + 2 * HOUR, 0)) == [
        (HOUR, day + HOUR, day + 2 * HOUR), (MINUTE, day + 60, day + HOUR),
        (MINUTE, day + 2 * HOUR, day + 3 * HOUR)]
    assert spans(day + 90, 3 * day + 30, 0, rolled=(3 * day, 2 * day)) == [
        (HOUR, day + HOUR, 3 * day), (MINUTE, day + 60, day + HOUR),
        (MINUTE, 3 * day, 3 * day + 60)]
    # nothing summed yet (no minute dropped either): minutes throughout
    assert spans(day + 90, day + 3 * HOUR, day + 2 * HOUR, rolled=(0, 0)) == [
        (MINUTE, day + 60, day + 3 * HOUR)]


class Clock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


@pytest.fixture
def meter(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    clock = Clock(1_700_000_000.0 // HOUR * HOUR)
    m = UsageMeter(UsageStore(store), UsageSettings(sample_interval=10.0, idle_job_after=600,
                                                    rollup_after=2 * HOUR, retention=5 * HOUR),
                   clock=clock)
    return m, clock, store


def play(m, clock, seconds, uses=None):
    """Readings every 10 s for ``seconds``, written as minutes close."""
    for _ in range(int(seconds // 10)):
        clock.t += 10
        m.ingest("n0", clock.t, scenario() if uses is None else uses)
        asyncio.run(m.write())


def test_a_window_adds_up_from_minute_and_hour_rows(meter):
    m, clock, store = meter
    start = clock.t
    play(m, clock, 2 * HOUR + 30 * MINUTE)
    with store.engine.connect() as conn:
        steps = dict(conn.exec_driver_sql("SELECT step, count(*) FROM usage GROUP BY step").all())
    assert steps[HOUR] > 0 and steps[MINUTE] > 0
    answer = asyncio.run(m.query(start, clock.t + 1, BY["project"], Scope()))
    seconds = 2 * HOUR + 30 * MINUTE
    rows = {r["project"]: r for r in answer["rows"]}
    assert rows["vision"]["allocated_gpu_seconds"] == pytest.approx(seconds)
    assert rows["vision"]["allocation"] == pytest.approx(0.5)  # 1 of 2 train GPUs
    assert rows["vision"]["utilization"] == pytest.approx(0.9)
    assert rows["nlp"]["utilization"] == pytest.approx(0.01)
    assert rows["nlp"]["idle_ratio"] == pytest.approx(1.0)
    assert answer["pools"]["train"]["capacity_gpu_seconds"] == pytest.approx(2 * seconds)
    assert answer["pools"]["train"]["utilization"] == pytest.approx(0.455)
    assert answer["pools"]["train"]["average_utilization"] == pytest.approx(0.455)
    build = answer["pools"]["build"]  # ¼ of the build GPU held, at 80 %
    assert (build["allocation"], build["utilization"]) == (pytest.approx(0.25), pytest.approx(0.8))
    assert build["average_utilization"] == pytest.approx(0.2)
    users = {r["user"]: r for r in asyncio.run(m.query(start, clock.t + 1, BY["user"],
                                                       Scope()))["rows"]}
    assert users["alice"]["utilization"] == pytest.approx(0.8)
    assert users["alice"]["allocation"] == pytest.approx(0.25 / 3, abs=1e-6)  # of both pools' 3 GPUs
    # a series by hour adds up to the same
    by_hour = asyncio.run(m.query(start, clock.t + 1, BY["project"], Scope(), series_step=HOUR))
    vision = [p for p in by_hour["series"] if p["project"] == "vision"]
    assert len(vision) == 3
    assert sum(p["allocated_gpu_seconds"] for p in vision) == pytest.approx(seconds)
    assert all(p["utilization"] == pytest.approx(0.9) for p in vision)


def test_scopes_keep_other_peoples_rows_out(meter):
    m, clock, _ = meter
    start = clock.t
    play(m, clock, 5 * MINUTE)
    mine = Scope("carol", frozenset({"vision"}))
    for by, names in (("project", ["vision"]), ("job", ["j-1"]), ("user", ["carol"]),
                      ("slice", [])):
        rows = asyncio.run(m.query(start, clock.t + 1, BY[by], mine))["rows"]
        assert [r[BY[by].names[0]] for r in rows] == names, by
    alice = Scope("alice", frozenset())
    assert [r["slice"] for r in asyncio.run(m.query(start, clock.t + 1, BY["slice"],
                                                     alice))["rows"]] == ["s-1"]


def test_old_rows_become_hours_and_days_and_go(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    clock = Clock(1_700_000_000.0 // DAY * DAY + 20 * HOUR)
    m = UsageMeter(UsageStore(store), UsageSettings(sample_interval=60.0, rollup_after=2 * HOUR,
                                                    retention=30 * HOUR), clock=clock)
    for _ in range(int(36 * HOUR // 60)):  # 36 hours, a reading a minute
        clock.t += 60
        m.ingest("n0", clock.t, scenario())
        asyncio.run(m.write())
    with store.engine.connect() as conn:
        oldest = dict(conn.exec_driver_sql("SELECT step, min(t) FROM usage GROUP BY step").all())
    assert set(oldest) == {MINUTE, HOUR, DAY}
    assert oldest[MINUTE] >= clock.t - 3 * HOUR  # minute rows: kept 2 h (from the hour)
    assert oldest[HOUR] >= clock.t - 31 * HOUR  # hour rows: 30 h
    # a window over it all: the same whichever rows it is read from
    answer = asyncio.run(m.query(clock.t - 28 * HOUR, clock.t + 1, BY["project"], Scope()))
    vision = next(r for r in answer["rows"] if r["project"] == "vision")
    assert vision["allocated_gpu_seconds"] == pytest.approx(answer["until"] - answer["since"])
    assert vision["utilization"] == pytest.approx(0.9) and vision["allocation"] == 0.5
    by_hour = asyncio.run(m.query(clock.t - 28 * HOUR, clock.t + 1, BY["project"], Scope(),
                                  series_step=HOUR))
    assert len([p for p in by_hour["series"] if p["project"] == "vision"]) == 29


def test_the_live_view_says_now_the_last_hour_and_since_when_idle(meter):
    m, clock, _ = meter
    play(m, clock, 11 * MINUTE)
    busy = m.holder_now("job", "j-1/1")
    assert busy["sm_now"] == 0.9 and busy["memory_now_bytes"] == 4 * GiB
    assert busy["sm_last_hour"] == 0.9 and busy["idle_for_s"] is None and not busy["idle"]
    idle = m.holder_now("job", "j-2/1")
    assert idle["idle_for_s"] == 11 * MINUTE and idle["idle"]  # idle_job_after is 10 min
    assert m.idle_jobs() == {"j-2"}
    assert m.holder_now("slice", "s-1")["sm_now"] == 0.8
    minutes = busy["minutes"]  # for sparklines: each minute of the last hour
    assert 11 <= len(minutes) <= 12 and all(sm == 0.9 and peak == 4 * GiB
                                            for _, sm, peak in minutes)
    assert [t for t, _, _ in minutes] == sorted(t for t, _, _ in minutes)
    # the idle job gets busy: the streak ends at once
    uses = scenario()
    uses = (uses[0], gpu(1, [HolderUse(IDLE_JOB, 1000, 50.0, GiB, 1)], 50.0), uses[2])
    play(m, clock, 10, uses)
    assert m.idle_jobs() == set() and m.holder_now("job", "j-2/1")["idle_for_s"] is None


def test_a_reading_out_of_order_or_after_a_gap_is_not_extrapolated(meter):
    m, clock, _ = meter
    play(m, clock, 60)
    before = m.counters[("pool", "train")].capacity
    m.ingest("n0", clock.t - 5, scenario())  # older than the last: ignored
    clock.t += 3600  # a pause: counted as three intervals, not an hour
    m.ingest("n0", clock.t, scenario())
    assert m.counters[("pool", "train")].capacity - before == 2 * 1000 * 30


def test_totals_merge_keeps_peaks():
    a, b = Totals(allocated=1, memory_peak=5), Totals(allocated=2, memory_peak=3)
    a.merge(b)
    assert (a.allocated, a.memory_peak) == (3, 5)


def test_a_hung_driver_holds_up_nothing(meter):
    """A reading that never returns: the loop goes on, says so, and starts no second one."""
    import threading

    from jupyter_gpushare.usage.meter import LocalContext
    from jupyter_gpushare.usage.sampler import MachineReading
    m, _, _ = meter
    m.settings = UsageSettings(sample_interval=0.1)
    release, calls = threading.Event(), []

    class Hung:
        node = "n0"

        def read(self):
            calls.append(1)
            release.wait(30)
            return MachineReading("n0", 0.0)

    async def scenario_():
        task = asyncio.ensure_future(m.run_local([Hung()], lambda: LocalContext({}, {}, {}, {})))
        ticks = 0
        for _ in range(20):  # the event loop stays free meanwhile
            await asyncio.sleep(0.1)
            ticks += 1
        notes = m.notes()
        release.set()
        task.cancel()
        return ticks, notes

    ticks, notes = asyncio.run(scenario_())
    assert ticks == 20 and len(calls) == 1
    assert notes and notes[0].startswith("NVML on n0 has not answered for")


@pytest.mark.parametrize("into_next", [False, True])
def test_the_last_minute_of_an_hour_reads_the_hour_from_its_minutes(meter, into_next):
    """The hour is still open (or closed and not summed yet): no hour rows exist for it, so a
    window that ends with it is read from its minute rows (a dashboard refreshed at 10:59:50
    once showed the last hour empty)."""
    m, clock, _ = meter
    start = clock.t
    play(m, clock, 59 * MINUTE + 50)  # up to hh:59:50, written as minutes close
    if into_next:  # hh+1:00:05: a reading opens the next minute, the writer has not run
        clock.t += 15
        m.ingest("n0", clock.t, scenario())
    answer = asyncio.run(m.query(clock.t - HOUR, clock.t, BY["project"], Scope()))
    vision = next(r for r in answer["rows"] if r["project"] == "vision")
    assert vision["allocated_gpu_seconds"] == pytest.approx(clock.t - start)
    asyncio.run(m.write())  # the hour summed: read from its row, the same figures
    again = asyncio.run(m.query(clock.t - HOUR, clock.t, BY["project"], Scope()))
    assert next(r for r in again["rows"] if r["project"] == "vision") == vision
