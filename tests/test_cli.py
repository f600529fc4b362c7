"""`gpushare simulate` as a person and a script use it: figures, files, and clear refusals."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clirun import refused, run

HEADER = "job_id,submit_time,duration,gpus,project\n"


def test_json_and_human_output(capsys, example):
    trace, quotas = example
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas), "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["policy"] == "guaranteed" and summary["capacity_gpus"] == 32
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--policy", "fifo")
    assert code == 0 and "policy fifo on 32 GPUs" in out and "vision" in out


def test_fair_share_over_time_and_the_borrowing_gap(capsys, example):
    trace, quotas = example
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas))
    assert code == 0 and "borrowing against weights: weekly gap max" in out
    assert "(fair share over time off)" in out
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--fair-share-half-life", "86400", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["fair_share_half_life_s"] == 86400
    assert 0 <= summary["borrow_gap_max"] <= 1 and summary["borrow_gap_weeks"]
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--fair-share-half-life", "86400", "--fair-share-window", "5")
    assert code == 2 and "window must be 60 seconds to a year: fix --fair-share-half-life" in err
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--fair-share-half-life", "86400", "--policy", "fifo")
    assert code == 2 and "it is for --policy guaranteed" in err and "Traceback" not in err
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--fair-share-half-life", "86400", "--reclaim-fair-share")
    assert code == 0 and "(fair share over time half-life 86400 s, fair-share reclaim)" in out
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--reclaim-fair-share", "--json")
    assert code == 0 and json.loads(out)["reclaim_fair_share"] is True
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--reclaim-fair-share", "--policy", "static")
    assert code == 2 and "--reclaim-fair-share preempts borrowers for others: it is for --policy " \
        "guaranteed" in err and "Traceback" not in err


def test_consolidate_keeps_the_bound_where_a_gangs_shape_broke_it(capsys, example):
    """On the small example with fair-share reclaim an 8-GPU job within quota found 16 GPUs
    free, 4 on each node, all other GPUs held by projects within their quotas: without moves
    it waited 2,302 s against a bound of 60 s. Moving one job within quota gives it a node."""
    trace, quotas = example
    args = ("simulate", "--trace", str(trace), "--quotas", str(quotas), "--reclaim-fair-share")
    code, out, _ = run(capsys, *args, "--no-consolidate", "--json")
    before = json.loads(out)
    assert code == 0 and before["consolidate"] is False and before["moves"] == 0
    assert before["guarantee_waits_over_bound"] > 0
    code, out, _ = run(capsys, *args, "--json")
    after = json.loads(out)
    assert code == 0 and after["consolidate"] is True
    assert after["guarantee_waits_over_bound"] == 0
    assert after["guarantee_wait_max_s"] <= after["guarantee_bound_s"]
    assert after["moves"] >= 1 and after["within_quota_preemptions"] == 0
    code, out, _ = run(capsys, *args)
    assert code == 0 and f"(0 within quota, {after['moves']} moved)" in out
    code, out, _ = run(capsys, *args, "--no-consolidate")
    assert code == 0 and "(0 within quota), " in out
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--no-consolidate", "--policy", "fifo")
    assert code == 2 and "--no-consolidate is about moving jobs for a gang" in err
    assert "Traceback" not in err


def test_events_and_plot_files(capsys, example, tmp_path):
    trace, quotas = example
    events, plot = tmp_path / "e.jsonl", tmp_path / "p.png"
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--events", str(events), "--plot", str(plot), "--json")
    assert code == 0
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    assert {e["event"] for e in lines} == {"submit", "start", "preempt", "finish"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Where the files went, on stderr (stdout stays one JSON object).
    assert err.splitlines() == [f"wrote the events to {events}",
                                                     f"wrote the plot to {plot}"]


def test_proportional_and_scaled_quotas(capsys, example):
    trace, quotas = example
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", "proportional",
                       "--capacity", "24", "--json")
    per = json.loads(out)["per_project"]
    assert code == 0 and sum(p["quota_gpus"] for p in per.values()) == 24
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--capacity", "16", "--scale-quotas", "--json")
    per = json.loads(out)["per_project"]
    assert code == 0 and [per[p]["quota_gpus"] for p in ("vision", "nlp", "speech")] == [8, 4, 4]


@pytest.mark.parametrize("extra, words", [
    (["--capacity", "0"], "--capacity: must be 1 or more"),
    (["--capacity", "lots"], "--capacity: must be a whole number"),
    (["--gpus-per-node", "-8"], "--gpus-per-node: must be 1 or more"),
    (["--policy", "lottery"], "invalid choice: 'lottery'"),
    (["--grace-period", "soon"], "--grace-period: must be a number of seconds"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
], ids=["zero-capacity", "word-capacity", "negative-node", "unknown-policy", "bad-seconds",
        "unknown-option"])
def test_bad_options_get_one_sentence(capsys, example, extra, words):
    code, err = refused(capsys, "simulate", "--trace", str(example[0]), *extra)
    assert code == 2 and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("setup, words", [
    ("a,0,-5,1,p\n", "t.csv, line 2: duration must be more than 0 seconds, not -5"),
    ("a,0,10,x,p\n", "t.csv, line 2: gpus must be a number, not 'x'"),
    ("a,0,10,64,p\n", "t.csv, line 2: job a: the job asks for 64 GPUs but the train pool has "
                      "only 8 GPUs; ask for fewer GPUs; or raise --capacity"),
], ids=["negative-duration", "non-numeric-gpus", "larger-than-pool"])
def test_bad_trace_gets_file_line_and_exit_2(capsys, tmp_path, setup, words):
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + setup)
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--capacity", "8")
    assert code == 2 and words in err and err.count("\n") == 1


def test_quotas_beyond_capacity_are_refused_unless_scaled(capsys, example):
    trace, quotas = example
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--capacity", "16")
    assert code == 2
    assert "quotas add up to 32 GPUs but the train pool has 16" in err and "--scale-quotas" in err


def test_capacity_is_needed_without_a_quota_file(capsys, example):
    code, _, err = run(capsys, "simulate", "--trace", str(example[0]))
    assert code == 2 and "--capacity GPUS" in err


def test_console_script_exit_status_and_no_traceback(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submit_time,gpus,project\n")
    exe = Path(sys.executable).with_name("gpushare")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "jupyter_gpushare"]
    proc = subprocess.run([*cmd, "simulate", "--trace", str(trace), "--capacity", "8"],
                          capture_output=True, text=True, env={**os.environ})
    assert proc.returncode == 2
    assert "the header lacks column(s) duration" in proc.stderr
    assert "Traceback" not in proc.stderr


DEPARTMENTS = "department,quota,limit,projects\n"


def test_departments_file_runs_and_is_named_in_the_summary(capsys, example, tmp_path):
    trace, quotas = example
    departments = tmp_path / "d.csv"
    departments.write_text(DEPARTMENTS + "ml,24,,vision nlp\naudio,8,16,speech\n")
    code, out, _ = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--departments", str(departments), "--json")
    summary = json.loads(out)
    assert code == 0 and summary["departments_file"] == str(departments)
    assert summary["within_quota_preemptions"] == 0
    assert summary["departments"]["audio"]["limit_gpus"] == 16
    assert summary["departments"]["ml"]["projects"] == ["vision", "nlp"]
    assert summary["departments"]["ml"]["jobs"] == 300  # vision's 60 and nlp's 240
    code, out, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                         "--departments", str(departments))
    assert code == 0 and f"departments of {departments}" in out and err == ""


def test_scaled_quotas_raise_a_department_that_no_longer_holds_its_projects(capsys, example,
                                                                            tmp_path):
    # At 16 GPUs the quotas scale to vision 8, nlp 4, speech 4: ml's 10 cannot hold 12.
    trace, quotas = example
    departments = tmp_path / "d.csv"
    departments.write_text(DEPARTMENTS + "ml,10,11,vision nlp\naudio,4,,speech\n")
    code, out, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                         "--capacity", "16", "--scale-quotas", "--departments",
                         str(departments), "--json")
    assert code == 0 and json.loads(out)["departments"]["ml"]["quota_gpus"] == 12
    assert err == ("raised department ml's quota from 10 GPUs to 12 GPUs (and its limit from "
                   "11 GPUs), what its projects' quotas add up to once apportioned to the "
                   "capacity\n")


@pytest.mark.parametrize("body, words", [
    ("ml,lots,,vision\n", "d.csv, line 2: quota must be a number, not 'lots'"),
    ("ml,-1,,vision\n", "d.csv, line 2: quota must be 0 or more GPUs, not -1"),
    ("ml,8,4,vision\n", "d.csv, line 2: limit (4 GPUs) is below the quota (8 GPUs)"),
    ("ml,8,,vision nlp\naudio,8,,nlp\n",
     "d.csv, line 3: project 'nlp' is named in department 'ml' too; a project belongs to "
     "one department"),
    ("ml,8,,vision\nml,8,,nlp\n", "d.csv, line 3: department 'ml' appears twice"),
    ("ml,8,,vision,extra\n", "d.csv, line 2: does not have the header's 4 fields"),
    ("".join(f"d{i},0,,\n" for i in range(1001)), "d.csv, line 1002: has more than 1000 "
                                                     "departments"),
    ("ml,8,,vision " + "n" * 200_000 + "\n", "d.csv, line 2: cannot be read as CSV (field "
                                               "larger than field limit"),
    ("", "d.csv: has no departments"),
    ("ml,10,,vision nlp\naudio,8,,speech\n",
     "d.csv: the quotas of department ml's projects add up to 24 GPUs, more than its quota "
     "of 10 GPUs; raise the department's quota or lower its projects'"),
    ("ml,24,,vision nlp\naudio,9,,speech\n",
     "d.csv: the quotas add up to 33 GPUs but the train pool has 32"),
], ids=["bad-number", "negative-quota", "limit-below-quota", "project-in-two",
        "duplicate-department", "extra-field", "too-many-rows", "too-long-field",
        "header-only", "projects-beyond-department", "departments-beyond-pool"])
def test_bad_departments_file_gets_one_sentence_and_exit_2(capsys, example, tmp_path, body,
                                                           words):
    departments = tmp_path / "d.csv"
    departments.write_text(DEPARTMENTS + body)
    code, out, err = run(capsys, "simulate", "--trace", str(example[0]), "--quotas",
                         str(example[1]), "--departments", str(departments))
    assert code == 2 and out == "" and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_departments_refused_where_they_mean_nothing(capsys, example, tmp_path):
    trace, quotas = example
    departments = tmp_path / "d.csv"
    departments.write_text(DEPARTMENTS + "ml,24,,vision nlp\n")
    for extra, words in [
        (["--policy", "fifo"], "--departments divides quotas on two levels: it is for "
                               "--policy guaranteed"),
        (["--from-pool"], "--departments is for a trace (--trace FILE)"),
    ]:
        code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                           "--departments", str(departments), *extra)
        assert code == 2 and words in err and err.count("\n") == 1
    departments.write_text("department,quota,projects\nml,24,vision\n")
    code, _, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                       "--departments", str(departments))
    assert code == 2 and "d.csv, line 1: the header lacks column(s) limit; it needs " \
        "department,quota,limit,projects" in err


KINDS = {"guarantee", "fair", "priority", "move", "take back"}


def test_every_preemption_in_the_events_log_names_its_kind(capsys, example, tmp_path):
    """An outsider's check of --events: each preempt names the rule that stopped the job, and
    a job whose project held no more than its quota when it stopped was stopped only as a
    move (which the documentation allows), never by a reclaim."""
    trace, quotas = example
    quota = {row.split(",")[0]: float(row.split(",")[1]) for row in
             quotas.read_text().splitlines()[1:] if row.strip()}
    events = tmp_path / "events.jsonl"
    code, out, err = run(capsys, "simulate", "--trace", str(trace), "--quotas", str(quotas),
                         "--reclaim-fair-share", "--events", str(events), "--json")
    assert code == 0, err
    held, kinds, running, within = {}, [], {}, 0
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e["event"] == "start":  # held from its start until it is stopped or ends
            lent = any(node.endswith("/lent") for node in e["placement"])
            running[e["job"]] = (e["project"], 0 if lent else e["gpus"])
            held[e["project"]] = held.get(e["project"], 0) + running[e["job"]][1]
        elif e["event"] == "preempt":
            assert e.get("kind") in KINDS, e
            kinds.append(e["kind"])
            project, gpus = running.pop(e["job"])
            if gpus and held[project] <= quota.get(project, 0):
                assert e["kind"] == "move", e  # within quota: only a move stops it
                within += 1
            held[project] -= gpus
        elif e["event"] == "finish" and e["job"] in running:
            project, gpus = running.pop(e["job"])
            held[project] -= gpus
    assert "move" in kinds and {"guarantee", "fair"} & set(kinds), sorted(set(kinds))
    assert kinds.count("move") == json.loads(out)["moves"] == within  # moves are within quota


def test_the_version_is_the_packages():
    """From git's tags when the package is built (pyproject.toml, hatch-vcs): a clone's build
    is a release or a dev version after one, never the fallback of a tree never built."""
    from jupyter_gpushare import __version__

    done = subprocess.run([str(Path(sys.executable).with_name("gpushare")), "--version"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, f"gpushare {__version__}\n")
    assert __version__ != "0.0.0+unknown" and __version__.split(".")[0].isdigit()
