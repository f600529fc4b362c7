"""The admin dashboard's content, built by pure functions from the API's answers and tested
whole (as the Kubernetes manifests are): the charts, the pool map, the tables, the page and
the refusal page. The browser test (test_dashboard_browser.py) shows it in a real hub."""

import re
from html import unescape
from html.parser import HTMLParser

import pytest

from jupyter_gpushare import __version__
from jupyter_gpushare.charts import Frame, Series, line_chart, sparkline, stacked_chart, time_ticks
from jupyter_gpushare.dashboard import WINDOWS, BadWindow, Window, choose_window, refusal, render
from jupyter_gpushare.dashboard import audit, poolmap, tables, usage
from jupyter_gpushare.dashboard.page import form_page

GiB = 2**30
NOW = 1_763_650_000.0  # 2025-11-20 14:46:40 UTC


def job_holder(**kw):
    return {"kind": "job", "gpus": 1.0, "sm": 0.9, "memory_bytes": 20 * GiB, "idle_for_s": None,
            **kw}


def gpu(node, index, pool, util, holders=(), memory=20 * GiB, **kw):
    return {"node": node, "index": index, "uuid": f"GPU-{node}-{index}", "pool": pool,
            "name": "sim", "lost": False, "utilization": util, "memory_used_bytes": memory,
            "memory_total_bytes": 80 * GiB, "held": sum(h["gpus"] for h in holders),
            "holders": list(holders), "outside": {"processes": 0, "memory_bytes": 0}, "at": NOW,
            **kw}


BUSY = job_holder(project="vision", user="alice", job="j-1", attempt=1)
IDLE = job_holder(sm=0.02, memory_bytes=30 * GiB, idle_for_s=1500, project="nlp", user="bob",
                  job="j-2", attempt=1)
SLICES = [{"kind": "slice", "gpus": 0.25, "sm": 0.2, "memory_bytes": 3 * GiB,
           "idle_for_s": None, "user": "alice", "slice": "s-1"},
          {"kind": "slice", "gpus": 0.25, "sm": 0.0, "memory_bytes": GiB, "idle_for_s": 700,
           "user": "bob", "slice": "s-2"}]
CULL_REASON = "no GPU use and no activity for 11m; it will be stopped in 5m unless used"


def sample() -> dict:
    """What pool/web/dashboard_pages.py gathers, for a pool of 4 train GPUs and 1 build GPU."""
    pool = {
        "capacity": 4, "in_use": 3.0, "simulated": True, "usage_source": "standin",
        "nodes": [{"name": "sim-0", "gpus": 4, "pool": "train", "labels": {},
                   "drained": False}],
        "build": {"capacity": 1, "in_use": 0.5, "allowance": 0.25,
                  "nodes": [{"name": "sim-build-0", "gpus": 1}]},
        "gpus": [gpu("sim-0", 0, "train", 0.9, [BUSY]),
                 gpu("sim-0", 1, "train", 0.7, [{**BUSY, "sm": 0.7}]),
                 gpu("sim-0", 2, "train", 0.02, [IDLE], memory=30 * GiB,
                     outside={"processes": 2, "memory_bytes": 11 * GiB}),
                 gpu("sim-0", 3, "train", 0.0, memory=0),
                 gpu("sim-build-0", 0, "build", 0.2, SLICES, memory=4 * GiB)],
        "usage_notes": ["GPU 2 of sim-0: 2 processes outside gpushare, 11 GiB."],
        "culling": {"after": 600, "warning": 300, "culled": 1, "events": [
            {"at": NOW - 900, "kind": "warn", "user": "carol", "server": "exp", "slice": "s-9",
             "reason": "no GPU use and no activity for 10m; it will be stopped in 5m "
                       "unless used"},
            {"at": NOW - 600, "kind": "cull", "user": "carol", "server": "exp", "slice": "s-9",
             "reason": "no GPU use and no activity for 15m, warned 5m ago"},
            {"at": NOW - 60, "kind": "warn", "user": "bob", "server": "", "slice": "s-2",
             "reason": CULL_REASON}]}}
    window = choose_window("6h", NOW)
    series = []
    for k in range(72):
        t = (NOW - window.span) // 300 * 300 + k * 300
        if k > 20:
            series.append({"t": t, "project": "vision", "allocation": 0.5,
                           "utilization": 0.8 if k % 10 else 0.5})
        if k > 40:
            series.append({"t": t, "project": "nlp", "allocation": 0.25, "utilization": 0.02})
    figures = {"capacity_gpu_seconds": 86400, "allocation": 0.6, "utilization": 0.55,
               "average_utilization": 0.33, "idle_ratio": 0.2}
    return {
        "now": NOW, "offset": 0, "zone": "UTC", "user": "admin", "window": window,
        "refresh_s": 15, "pool": pool,
        "projects": [{"name": "vision", "quota": 2, "in_use": 2, "borrowed": 0, "pending": 1,
                      "limit": None},
                     {"name": "nlp", "quota": 2, "in_use": 1, "borrowed": 0, "pending": 1,
                      "limit": None}],
        "usage": {"since": NOW - window.span, "until": NOW, "step": 300, "idle_threshold": 0.05,
                  "pools": {"train": figures},
                  "rows": [{"project": "vision", "allocated_gpu_seconds": 36000,
                            "allocation": 0.42, "utilization": 0.77, "idle_ratio": 0.0,
                            "memory_peak_bytes": 40 * GiB},
                           {"project": "nlp", "allocated_gpu_seconds": 7200, "allocation": 0.08,
                            "utilization": 0.02, "idle_ratio": 1.0,
                            "memory_peak_bytes": 30 * GiB}],
                  "series": series},
        "idle_jobs": [{"job": "j-2", "project": "nlp", "user": "bob", "idle_gpu_seconds": 7000,
                       "idle_ratio": 0.97, "utilization": 0.02},
                      {"job": "j-1", "project": "vision", "user": "alice",
                       "idle_gpu_seconds": 0}],
        "idle_slices": [{"slice": "s-2", "user": "bob", "idle_gpu_seconds": 1800,
                         "idle_ratio": 1.0, "utilization": 0.0},
                        {"slice": "s-7", "user": "carol", "idle_gpu_seconds": 900,
                         "idle_ratio": 1.0, "utilization": 0.0}],
        "jobs": [{"id": "j-1", "name": "resnet", "user": "alice", "project": "vision",
                  "gpus": 2.0, "state": "running", "attempt": 1, "submitted": NOW - 7000,
                  "queue_position": None, "reason": "", "usage": {"idle_for_s": None}},
                 {"id": "j-2", "name": "bert <b>", "user": "bob", "project": "nlp", "gpus": 1.0,
                  "state": "running", "attempt": 1, "submitted": NOW - 4000,
                  "queue_position": None, "reason": "", "usage": {"idle_for_s": 1500}},
                 {"id": "j-3", "name": "big", "user": "alice", "project": "vision", "gpus": 4.0,
                  "state": "pending", "attempt": 1, "submitted": NOW - 120,
                  "queue_position": 1, "reason": "waiting for 4 GPUs on one node; 1 is free"},
                 {"id": "j-4", "name": "", "user": "bob", "project": "nlp", "gpus": 2.0,
                  "state": "pending", "attempt": 2, "submitted": NOW - 3000,
                  "queue_position": 2, "reason": "waiting behind job j-3"}],
        "slices": [{"id": "s-1", "user": "alice", "server": "", "gpus": 0.25,
                    "usage": {"idle_for_s": None}, "cull": None},
                   {"id": "s-2", "user": "bob", "server": "", "gpus": 0.25,
                    "usage": {"idle_for_s": 700},
                    "cull": {"warned_at": NOW - 60, "cull_at": NOW + 240,
                             "reason": CULL_REASON}}],
        "audit": AUDIT, "audit_next": 7,
    }


# The newest entries of api/audit, as the dashboard gathers them
AUDIT = [{"id": 9, "at": NOW - 30, "who": "admin", "action": "drain node", "target": "sim-0",
          "before": {"drained": False}, "after": {"drained": True, "requeued": ["j-1", "j-2"]},
          "via": "dashboard", "address": "10.0.0.1"},
         {"id": 8, "at": NOW - 600, "who": "admin", "action": "change project",
          "target": "vision", "before": {"quota": 4.0}, "after": {"quota": 6.0},
          "via": "dashboard", "address": None},
         {"id": 7, "at": NOW - 7200, "who": "root <x>", "action": "cancel job", "target": "j-9",
          "before": {"state": "pending", "user": "alice", "project": "vision"},
          "after": {"state": "cancelled"}, "via": "api", "address": None}]


# -- charts ----------------------------------------------------------------------------------

def test_a_sparkline_breaks_at_gaps_and_dots_its_last_value():
    assert sparkline([0.5, None, 0.2, 0.4, 1.2], width=20, height=10, title="a<b") == (
        '<svg class="gpushare-spark" width="20" height="10" viewBox="0 0 20 10" role="img" '
        'aria-label="a&lt;b"><title>a&lt;b</title><line x1="0" y1="9.5" x2="20" y2="9.5" '
        'stroke="#c8c8c8" stroke-width="1"/><circle cx="1.5" cy="5" r="1" fill="#0072b2"/>'
        '<polyline fill="none" stroke="#0072b2" stroke-width="1.5" '
        'points="10,7.1 14.2,5.7 18.5,1.5"/><circle cx="18.5" cy="1.5" r="2" fill="#0072b2"/>'
        '</svg>')
    assert sparkline([None, None]) == (
        '<svg class="gpushare-spark" width="80" height="18" viewBox="0 0 80 18" role="img" '
        'aria-label=""><line x1="0" y1="17.5" x2="80" y2="17.5" stroke="#c8c8c8" '
        'stroke-width="1"/></svg>')


FRAME = Frame(0, 600, 300, 0, width=100, height=50, left=10, right=0, top=10, bottom=10)
AXES = ('<line x1="10" y1="40" x2="10" y2="44" stroke="#9e9e9e"/><text x="10" y="46" '
        'text-anchor="middle">00:00</text><line x1="55" y1="40" x2="55" y2="44" '
        'stroke="#9e9e9e"/><text x="55" y="46" text-anchor="middle">00:05</text><line x1="100" '
        'y1="40" x2="100" y2="44" stroke="#9e9e9e"/><text x="100" y="46" '
        'text-anchor="middle">00:10</text><line x1="10" y1="40" x2="100" y2="40" '
        'stroke="#9e9e9e"/>')


def test_stacked_areas_are_steps_one_bucket_wide_on_top_of_each_other():
    svg = stacked_chart(FRAME, [Series("a", ((0, 1.0), (300, 2.0)), "#111"),
                                Series("b", ((300, 1.0),), "#222")], 4, title="t",
                        y_ticks=[(0, "0"), (4, "4")], ceiling=(4, "pool"))
    assert svg == (
        '<svg class="gpushare-chart" viewBox="0 0 100 50" role="img" aria-label="t" '
        'preserveAspectRatio="xMidYMid meet"><title>t</title>'
        '<line x1="10" y1="40" x2="100" y2="40" stroke="#e0e0e0"/><text x="6" y="40" '
        'text-anchor="end" dominant-baseline="middle">0</text><line x1="10" y1="10" x2="100" '
        'y2="10" stroke="#e0e0e0"/><text x="6" y="10" text-anchor="end" '
        'dominant-baseline="middle">4</text>' + AXES +
        # a: 1 GPU in the first bucket, 2 in the second; b: 1 on top of a in the second
        '<polygon fill="#111" fill-opacity="0.8" stroke="#111" stroke-width="0.5" '
        'points="10,32.5 55,32.5 55,25 100,25 100,40 55,40 55,40 10,40"><title>a</title>'
        '</polygon><polygon fill="#222" fill-opacity="0.8" stroke="#222" stroke-width="0.5" '
        'points="10,32.5 55,32.5 55,17.5 100,17.5 100,25 55,25 55,32.5 10,32.5"><title>b'
        '</title></polygon><line x1="10" y1="10" x2="100" y2="10" stroke="#424242" '
        'stroke-dasharray="4 3"><title>pool</title></line></svg>')


def test_lines_go_through_bucket_middles_and_a_lone_bucket_is_a_dot():
    svg = line_chart(FRAME, [Series("a", ((0, 0.5), (300, None)), "#111"),
                             Series("b", ((0, 0.2), (300, 0.4)), "#222")], 1, title="u",
                     y_ticks=[], threshold=(0.05, "idle"))
    assert svg == (
        '<svg class="gpushare-chart" viewBox="0 0 100 50" role="img" aria-label="u" '
        'preserveAspectRatio="xMidYMid meet"><title>u</title>' + AXES +
        '<line x1="10" y1="38.5" x2="100" y2="38.5" stroke="#d55e00" stroke-dasharray="2 3">'
        '<title>idle</title></line><circle cx="32.5" cy="25" r="2.5" fill="#111"><title>a'
        '</title></circle><polyline fill="none" stroke="#222" stroke-width="2" '
        'points="32.5,34 77.5,28"><title>b</title></polyline></svg>')


def test_a_bucket_larger_than_the_window_is_drawn_within_it():
    frame = Frame(30, 45, 60, 0, width=100, height=50, left=10, right=0, top=10, bottom=10)
    svg = line_chart(frame, [Series("a", ((0, 0.5),), "#111")], 1, title="u", y_ticks=[])
    assert '<circle cx="55" cy="25" r="2.5" fill="#111">' in svg  # the window's middle


@pytest.mark.parametrize("span, offset, first, labels", [
    (600, 0, 0, ["00:00", "00:05", "00:10"]),
    (6 * 3600, 3600, 0, ["01:00", "02:00", "03:00", "04:00", "05:00", "06:00", "07:00"]),
    (7 * 86400, 0, 0, ["Jan 01", "Jan 02", "Jan 03", "Jan 04", "Jan 05", "Jan 06", "Jan 07",
                       "Jan 08"]),
])
def test_time_ticks_are_round_in_the_services_zone(span, offset, first, labels):
    ticks = time_ticks(Frame(first, first + span, 60, offset))
    assert [label for _, label in ticks] == labels


# -- sections --------------------------------------------------------------------------------

def test_the_pool_map_shows_every_gpu_its_holders_and_their_use_now():
    d = sample()
    small = {"nodes": [{"name": "n0", "gpus": 2}], "build": {"nodes": [{"name": "b0", "gpus": 1}]},
             "usage_source": "standin",
             "usage_notes": ["GPU 1 of n0: 2 processes outside gpushare, 11 GiB."],
             "gpus": [d["pool"]["gpus"][2] | {"node": "n0", "index": 0},
                      d["pool"]["gpus"][4] | {"node": "b0"}]}
    assert poolmap.pool_map(small, {j["id"]: j for j in d["jobs"]}, 0.05) == (
        '<p class="source">GPU use is played by the NVML stand-in: the GPUs are simulated, there '
        'is no GPU on this machine.</p><ul class="notes"><li>GPU 1 of n0: 2 processes outside '
        'gpushare, 11 GiB.</li></ul>'
        '<div class="node" data-node="n0"><h3>n0 <span class="muted">train pool · 2 GPUs, 1 '
        'held</span></h3><div class="gpus">'
        # held, and idle: under 5 % of what it holds, for 25 minutes
        '<div class="gpu held idle" data-gpu="n0/0" title="sim GPU-sim-0-2"><div '
        'class="gpu-head"><b>GPU 0</b> <span class="util">2%</span></div><div class="bar" '
        'title="SM utilization now"><span style="width:2%"></span></div><div class="mem">30 GiB '
        'of 80 GiB</div><ul class="holders"><li class="job">job <b>bert &lt;b&gt;</b> · bob · '
        'nlp · SM 2% <span class="flag">idle 25m</span></li><li class="outside">2 processes '
        'outside gpushare, 11 GiB</li></ul></div>'
        # no reading of it
        '<div class="gpu unread" data-gpu="n0/1"><div class="gpu-head"><b>GPU 1</b> <span '
        'class="util">–</span></div><div class="muted">not measured</div></div></div></div>'
        '<div class="node" data-node="b0"><h3>b0 <span class="muted">build pool · 1 GPU, 1 held'
        '</span></h3><div class="gpus"><div class="gpu held" data-gpu="b0/0" '
        'title="sim GPU-sim-build-0-0"><div class="gpu-head"><b>GPU 0</b> <span class="util">'
        '20%</span></div><div class="bar" title="SM utilization now"><span style="width:20%">'
        '</span></div><div class="mem">4.0 GiB of 80 GiB</div><ul class="holders">'
        # 20 % of the GPU is 80 % of a ¼ slice
        '<li class="slice">¼ slice · <b>alice</b> · SM 80%</li><li class="slice">¼ slice · '
        '<b>bob</b> · SM 0% <span class="flag">idle 11m</span></li></ul></div></div></div>')


def test_a_drained_node_says_by_whom_and_since_when_and_admins_may_undrain_it():
    pool = {"nodes": [{"name": "n 0/x", "gpus": 1, "pool": "train", "drained": True,
                       "drained_by": "admin", "drained_since": NOW - 600},
                      {"name": "n1", "gpus": 1, "pool": "train", "drained": False}],
            "build": {"nodes": [{"name": "b0", "gpus": 1}]}, "gpus": []}
    page = poolmap.pool_map(pool, {}, 0.05, base="/s/", offset=3600)
    assert ('<div class="node drained" data-node="n 0/x"><h3>n 0/x <span class="muted">train '
            'pool · 1 GPU, 0 held</span> <span class="flag drained">drained by admin since '
            'Nov 20 15:36</span> <a class="drain" href="/s/dashboard/nodes/n%200%2Fx/drain" '
            'aria-label="Undrain node n 0/x">undrain</a></h3>') in page
    assert ('<h3>n1 <span class="muted">train pool · 1 GPU, 0 held</span> <a class="drain" '
            'href="/s/dashboard/nodes/n1/drain" aria-label="Drain node n1">drain…</a></h3>'
            ) in page
    assert '<h3>b0 <span class="muted">build pool · 1 GPU, 0 held</span></h3>' in page
    # without the admin's links (no base), the drain is still said
    plain = poolmap.pool_map(pool, {}, 0.05)
    assert "drained by admin since Nov 20 14:36" in plain and "<a" not in plain


def test_the_audit_trail_says_who_changed_what_in_words():
    section = audit.audit_section("/s/", AUDIT, 7, NOW, 0)
    c = check(section)
    rows = [" ".join(unescape(re.sub("<[^>]+>", " ", r)).split())
            for r in re.findall("<tr>(.*?)</tr>", section)]
    assert rows == [
        "When Who What Target Before → after Via",
        "just now admin drain node sim-0 drained no → yes, requeued j-1, j-2 dashboard",
        "10 min ago admin change project vision quota 4 → 6 dashboard",
        "Nov 20 12:46 root <x> cancel job j-9 state pending → cancelled (user alice, project "
        "vision) api"]
    assert c.links == ["/s/dashboard/audit?before=7"]
    assert "root &lt;x&gt;" in audit.audit_table(AUDIT, NOW, 0)
    assert audit.audit_section("/s/", AUDIT[:1], None, NOW, 0).endswith("</table>")
    assert "Nothing recorded yet" in audit.audit_section("/s/", [], None, NOW, 0)
    title, body = audit.audit_page("/s/", "admin", AUDIT[2:], None, 8, NOW, 0, "UTC")
    page = check(form_page((title, body)))
    assert page.links == ["/s/dashboard", "/s/dashboard/audit"]  # back, newest; no older
    assert "Audit trail: entries before #8" in body and page.scripts == []


def test_a_lost_gpu_and_one_free_say_so():
    lost = poolmap.gpu_tile(gpu("n", 0, "train", None, lost=True), "n", 0, {}, 0.05)
    assert '<div class="gpu lost free"' in lost and "n/a" in lost
    assert '<li class="bad">lost: the GPU no longer answers</li><li class="muted">free</li>' \
        in lost


def test_the_queue_in_order_with_its_reasons():
    assert tables.queue_table(sample()["jobs"], NOW) == (
        "<table class='queue'><thead><tr><th class=num>#</th><th>Job</th><th>User</th><th>"
        "Project</th><th class=num>GPUs</th><th class=num>Waiting</th><th>Why it waits</th>"
        "</tr></thead><tbody><tr><td class=num>1</td><td><b>big</b> <span class=\"muted\">j-3"
        "</span></td><td>alice</td><td>vision</td><td class=num>4</td><td class=num>2m</td>"
        "<td>waiting for 4 GPUs on one node; 1 is free</td></tr><tr><td class=num>2</td><td>"
        "<b>j-4</b> <span class=\"muted\">j-4</span> <span class=\"flag\">requeued, attempt 2"
        "</span></td><td>bob</td><td>nlp</td><td class=num>2</td><td class=num>50m</td><td>"
        "waiting behind job j-3</td></tr></tbody></table>")
    assert tables.queue_table([], NOW) == (
        '<p class="empty">Nothing waits: every job that was submitted runs or has ended.</p>')
    many = [{"id": f"j{i}", "state": "pending", "queue_position": i} for i in range(1, 6)]
    assert tables.queue_table(many, NOW, most=3).endswith(
        '</table><p class="muted">… and 2 more waiting.</p>')


def test_culls_say_the_rule_who_is_warned_and_what_was_done():
    d = sample()
    assert tables.culls(None, [], 0) == ('<p class="empty">Culling of idle build sessions is off '
                                         '(c.GPUUsage.cull_idle_slices_after = 0).</p>')
    assert tables.culls(d["pool"]["culling"], d["slices"], 0) == (
        "<p>Notebook servers whose build slice shows no GPU use and that the hub saw no activity "
        "from for 10m are warned, then stopped 5m later unless used; never while a kernel "
        "is busy or a train job's output is followed. Stopped so far: <b>1</b>.</p>"
        "<h3>Warned now</h3><table class='warned'><thead><tr><th>User</th><th>Server</th><th>"
        "Holds</th><th>Stopped at</th><th>Why</th></tr></thead><tbody><tr><td><b>bob</b></td>"
        f"<td>(default)</td><td>¼ slice</td><td>14:50</td><td>{CULL_REASON}</td></tr></tbody>"
        "</table><h3>Warnings and stops</h3><table class='culls'><thead><tr><th>When</th><th>"
        "What</th><th>User</th><th>Server</th><th>Why</th></tr></thead><tbody>"
        # newest first
        "<tr><td>Nov 20 14:45</td><td><span class=\"event-warn\">warned</span></td><td><b>bob"
        f"</b></td><td>(default)</td><td>{CULL_REASON}</td></tr>"
        "<tr><td>Nov 20 14:36</td><td><span class=\"event-cull\">stopped</span></td><td><b>"
        "carol</b></td><td>exp</td><td>no GPU use and no activity for 15m, warned 5m ago"
        "</td></tr><tr><td>Nov 20 14:31</td><td><span class=\"event-warn\">warned</span></td>"
        "<td><b>carol</b></td><td>exp</td><td>no GPU use and no activity for 10m; it will be "
        "stopped in 5m unless used</td></tr></tbody></table>")


def test_the_idlest_jobs_and_slices_with_what_they_do_now():
    d = sample()
    assert usage.idle_jobs_table(d["idle_jobs"], {j["id"]: j for j in d["jobs"]}) == (
        "<table class='idle-jobs'><thead><tr><th>Job</th><th>User</th><th>Project</th><th "
        "class=num>Idle GPU time</th><th class=num>Idle share</th><th class=num>Utilization"
        "</th><th>Now</th></tr></thead><tbody><tr><td><b>bert &lt;b&gt;</b> <span "
        "class=\"muted\">j-2</span></td><td>bob</td><td>nlp</td><td class=num>1h 56m</td><td "
        "class=num>97%</td><td class=num>2%</td><td>idle 25m</td></tr></tbody></table>")
    assert usage.idle_slices_table(d["idle_slices"], {s["id"]: s for s in d["slices"]}, 0) == (
        "<table class='idle-slices'><thead><tr><th>Slice</th><th>User</th><th class=num>Idle "
        "GPU time</th><th class=num>Idle share</th><th class=num>Utilization</th><th>Now</th>"
        "</tr></thead><tbody><tr><td>¼ slice <span class=\"muted\">s-2</span></td><td><b>bob"
        "</b></td><td class=num>30m</td><td class=num>100%</td><td class=num>0%</td><td>idle "
        "11m, stopped at 14:50 unless used</td></tr><tr><td>slice <span class=\"muted\">s-7"
        "</span></td><td><b>carol</b></td><td class=num>15m</td><td class=num>100%</td><td "
        "class=num>0%</td><td>released</td></tr></tbody></table>")
    busy = {"id": "j-2", "name": "b", "state": "running", "usage": {"idle_for_s": None}}
    assert usage.idle_jobs_table(d["idle_jobs"][:1], {"j-2": busy}).endswith(
        "<td>in use</td></tr></tbody></table>")
    just = {**busy, "usage": {"idle_for_s": 20}}
    assert usage.idle_jobs_table(d["idle_jobs"][:1], {"j-2": just}).endswith(
        "<td>idle under 5m</td></tr></tbody></table>")
    assert usage.idle_jobs_table(d["idle_jobs"][:1], {}).endswith(
        "<td>ended</td></tr></tbody></table>")
    assert usage.idle_jobs_table([], {}) == (
        '<p class="empty">No job held GPUs idle in this window.</p>')


def test_projects_over_the_window_in_the_apis_figures():
    d = sample()
    assert usage.project_table(d["usage"], d["projects"]) == (
        "<table class='projects'><thead><tr><th>Project</th><th class=num>Quota</th><th "
        "class=num>In use now</th><th class=num>GPU-hours</th><th class=num>Allocation</th><th "
        "class=num>Utilization</th><th class=num>Idle-allocated</th><th class=num>Peak memory"
        "</th></tr></thead><tbody><tr><td>nlp</td><td class=num>2</td><td class=num>1</td><td "
        "class=num>2.00</td><td class=num>8%</td><td class=num>2%</td><td class=num>100%</td>"
        "<td class=num>30 GiB</td></tr><tr><td>vision</td><td class=num>2</td><td class=num>2"
        "</td><td class=num>10.00</td><td class=num>42%</td><td class=num>77%</td><td class=num>"
        "0%</td><td class=num>40 GiB</td></tr></tbody></table>")
    assert usage.pools_line(d["usage"]) == (
        '<div class="figures" data-pool="train"><b>train pool</b>: allocation <b>60%</b>, '
        'utilization <b>55%</b> of what was allocated (average GPU utilization 33%), '
        'idle-allocated <b>20%</b></div>')
    charts = usage.charts(d["usage"], d["projects"], 4, d["window"], 0)
    # one colour per project, in name order; vision holds 2 GPUs of 4, nlp 1 on top
    assert charts.startswith(
        '<div class="legend"><span class="key"><i style="background:#0072b2"></i>nlp</span>'
        '<span class="key"><i style="background:#e69f00"></i>vision</span></div>')
    assert charts.count("<polygon") == 2 and charts.count("<polyline") == 2
    assert '<title>the train pool: 4 GPUs</title>' in charts
    assert '<title>idle below 5%</title>' in charts


# -- the page -------------------------------------------------------------------------------

VOID = {"meta", "br", "line", "circle", "input", "img", "hr"}


class Checker(HTMLParser):
    """Tags nest and close; collects ids, links, scripts and text."""

    def __init__(self):
        super().__init__()
        self.open, self.ids, self.links, self.scripts, self.text = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.append(a["id"])
        for key in ("href", "src"):
            if key in a:
                self.links.append(a[key])
        if tag == "script":
            self.scripts.append(a)
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.open.pop()

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self.open and self.open[-1] == tag, (tag, self.open[-5:])
        self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


def check(page: str) -> Checker:
    c = Checker()
    c.feed(page)
    c.close()
    assert c.open == [], c.open
    return c


def test_the_page_has_every_section_nothing_from_outside_and_escapes_what_people_typed():
    page = render(sample(), nonce="n0nce")
    c = check(page)
    assert f'<footer class="muted">jupyter-gpushare {__version__}</footer>' in page
    assert c.ids == ["refresh-note", "summary", "pool-map", "projects", "idle", "settings",
                     "new-project", "queue", "culls", "audit", "older"]
    windows = ["?window=1h", "?window=6h", "?window=24h", "?window=7d", "?window=30d"]
    # the admin's forms (forms.py, drain.py): a drain for the train node, a cancel for each
    # job holding a GPU (resnet holds two) and each waiting one; a change for each project,
    # and a new one; the audit trail's older entries
    assert c.links == windows + [
        "dashboard/usage.csv?since=1763628400&until=1763650000", "dashboard/whatif",
        "dashboard/nodes/sim-0/drain",
        "dashboard/jobs/j-1/cancel", "dashboard/jobs/j-1/cancel", "dashboard/jobs/j-2/cancel",
        "dashboard/project?name=nlp", "dashboard/project?name=vision", "dashboard/project",
        "dashboard/jobs/j-3/cancel", "dashboard/jobs/j-4/cancel", "dashboard/audit?before=7"]
    based = check(render({**sample(), "base": "/services/gpushare/"}))
    assert based.links[7] == "/services/gpushare/dashboard/nodes/sim-0/drain"
    assert c.scripts == [{"nonce": "n0nce"}]
    assert "bert &lt;b&gt;" in page and "bert <b>" not in page
    text = " ".join(" ".join(c.text).split())
    for words in ("3 of 4 GPUs allocated", "0.5 of 1 GPUs in slices", "2 running, 2 waiting",
                  "Train GPUs' utilization now 40%", "signed in as admin; times in UTC",
                  "Updated 14:46:40", "last 6h"):
        assert words in text, words
    assert '<a href="?window=6h" class=on>6h</a>' in page


def test_a_refusal_is_one_sentence_on_a_page():
    page = refusal(403, "Only <admins>.")
    check(page)
    assert page.endswith('<body><div class="refusal"><h1>Not allowed (403)</h1><p>Only '
                         '&lt;admins&gt;.</p><p><a href="/hub/home">Back to JupyterHub</a></p>'
                         '</div></body></html>\n')
    assert "<script" not in page


def test_windows():
    assert choose_window(None, NOW) == Window("6h", NOW - 6 * 3600, NOW, 300)
    # a young pool opens on the time since its first reading, a quarter of an hour at least
    assert choose_window(None, NOW, first=NOW - 7 * 3600) == Window("6h", NOW - 6 * 3600, NOW, 300)
    assert choose_window(None, NOW, first=NOW - 3 * 3600) == \
        Window("", NOW - 3 * 3600, NOW, 300, young=True, first=NOW - 3 * 3600)
    assert choose_window(None, NOW, first=NOW - 300) == \
        Window("", NOW - 900, NOW, 60, young=True, first=NOW - 300)
    assert choose_window("6h", NOW, first=NOW - 300).name == "6h"  # asked for: as asked
    assert choose_window("7d", NOW).step == 7200
    for name, (span, step) in WINDOWS.items():  # about 60 to 120 buckets, whole minutes
        assert 60 <= span // step <= 120 and step % 60 == 0
    assert choose_window("", NOW, NOW - 600, NOW - 60) == Window("", NOW - 600, NOW - 60, 60)
    assert choose_window(None, NOW, NOW - 3 * 86400).step == 3600  # until now, 72 buckets
    for args, words in (
            (("2y", NOW), r"window must be one of 1h, 6h, 24h, 7d, 30d, not '2y'"),
            (("6h", NOW, NOW - 60), r"a window \(window=6h\) or a period"),
            ((None, NOW, None, NOW - 60), "a period needs since as well as until"),
            ((None, NOW, NOW, NOW - 60), "since must be before until")):
        with pytest.raises(BadWindow, match=words):
            choose_window(*args)
    page = render({**sample(), "window": choose_window(None, NOW, NOW - 600, NOW - 60)})
    assert "Allocation and utilization per project, Nov 20 14:36 to Nov 20 14:45" in page
    assert " class=on" not in page  # no preset is the period shown
    young = render({**sample(), "window": choose_window(None, NOW, first=NOW - 1200)})
    assert "per project, since the pool&#x27;s first reading, Nov 20 14:26 to Nov 20 14:46" in young
    # Younger than the shortest window (a quarter of an hour): the window starts before the
    # first reading, and says when that was instead of calling its start the first reading
    newborn = render({**sample(), "window": choose_window(None, NOW, first=NOW - 300)})
    assert ("per project, Nov 20 14:31 to Nov 20 14:46 (the pool&#x27;s first reading: "
            "Nov 20 14:41)") in newborn


def test_the_whatif_page_shows_the_form_the_progress_and_the_result():
    from jupyter_gpushare.dashboard import render_whatif

    data = {"now": 1763650000, "user": "admin", "pool": {"capacity": 16},
            "projects": [{"name": "vision", "quota": 8.0}, {"name": "<nlp>", "quota": 4.0}],
            "run": None}
    page = render_whatif(data, nonce="n0nce")
    assert 'data-project="&lt;nlp&gt;"' in page and "<nlp>" not in page
    assert "Choose a window" in page
    running = {"id": "w-1-1", "state": "replaying", "progress": 0.42, "request": {},
               "result": None, "error": None}
    page = render_whatif({**data, "run": running})
    assert "Replaying… 42%" in page and 'aria-valuenow="42"' in page
    block = {"capacity_gpus": 16, "allocation": 0.5, "utilization": None,
             "utilization_known": None, "queue_p50_s": 1.0, "queue_p95_s": 30.0,
             "guarantee_wait_p95_s": 0.0, "guarantee_waits": 0, "preemptions": 2,
             "per_project": {"vision": {"allocation": 0.3, "queue_p50_s": 1.0,
                                        "queue_p95_s": 9.0}}}
    result = {"jobs": 3, "span_s": 3600, "recorded": block, "today": block,
              "changed": {**block, "capacity_gpus": 24},
              "settings": {"today": {"quotas": {"vision": 8.0}},
                           "changed": {"quotas": {"vision": 12.0}}}}
    page = render_whatif({**data, "run": {**running, "state": "done", "result": result}})
    assert "Replayed, changed settings" in page and "vision (quota 8 → 12)" in page
    failed = {**running, "state": "error", "error": "the quotas add up to <20> GPUs"}
    assert "the quotas add up to &lt;20&gt; GPUs" in render_whatif({**data, "run": failed})
    cancelled = {**running, "state": "stopped", "error": "admin cancelled it before it finished"}
    page = render_whatif({**data, "run": cancelled})
    assert 'data-state="stopped"' in page and "admin cancelled it before it finished" in page


def test_departments_are_shown_with_their_projects_and_each_projects_department():
    data = sample()
    data["projects"][0]["department"] = "research <r>"
    data["departments"] = [{"name": "research <r>", "quota": 4, "limit": None,
                            "over_quota_weight": 1, "in_use": 2, "deserved": 4,
                            "projects": ["vision"]}]
    page = render(data, nonce="n0nce")
    check(page)
    settings = page[page.index('<section id="settings">'):page.index('<section id="queue">')]
    assert "research &lt;r&gt;" in settings and "<r>" not in settings
    text = unescape(re.sub(r"<[^>]+>", " ", settings))
    assert re.search(r"Departments\s+Department\s+Quota\s+Limit\s+Weight\s+In use now\s+"
                     r"Deserved\s+Projects\s+research <r>\s+4\s+none\s+1\s+2\s+4\s+vision",
                     text), text
    assert "Departments" not in render(sample(), nonce="n0nce")  # none: no table
