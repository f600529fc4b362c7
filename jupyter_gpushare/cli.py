"""The ``gpushare`` command."""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from .cli_base import CommandError, UsageError, _Parser, say
from .cli_pool import add_pool_commands, connection_options
from .policy.admission import never_fits_gpus
from .policy.model import DEFAULT_MIN_RUNTIME_S, GPU, PolicyConfig, Project
from .policy.quotas import overbooking
from .policy.settings import DEFAULT_GRACE_S
from .sim.activity import PROFILES


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _capacity(text):
    """GPUs (a whole number from 1), or with --from-pool a change: +K or -K."""
    if text[:1] in "+-" and text[1:].isascii() and text[1:].isdigit():
        return text
    return str(_positive_int(text))


def _seconds(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, not {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text!r}")
    return value


def _scenario(text):
    if text != "team":
        raise argparse.ArgumentTypeError(f"the one scenario is team, not {text!r}")
    return text


def _seeds(text):
    from .sim.scenario import MAX_SEEDS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_SEEDS:
        raise argparse.ArgumentTypeError(f"must be a whole number of teams from 1 to "
                                         f"{MAX_SEEDS}, not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpushare", description="Share GPUs in JupyterHub: build slices "
                     "for notebooks, a guaranteed-quota train pool for jobs.")
    parser.add_argument("--version", action="version", version=f"gpushare {__version__}",
                        help="print the version of jupyter-gpushare and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser,
                                metavar="COMMAND")
    sim = sub.add_parser("simulate", help="replay a GPU-cluster trace under a scheduling policy",
                         parents=[connection_options()],
                         description="Replay a trace (CSV: job_id,submit_time,duration,gpus,"
                         "project[,user,priority,kind,util]) on a simulated train pool; or, with "
                         "--from-pool, the pool's own recorded jobs under today's settings and "
                         "under changed ones, side by side (admins); or, with --scenario team, "
                         "a modelled team under static GPUs, a pool and gpushare.")
    sim.add_argument("--trace", metavar="FILE", help="trace CSV, may be gzipped")
    sim.add_argument("--scenario", type=_scenario, metavar="team",
                     help="instead of a trace, the team scenario: 20 researchers in 4 projects "
                     "on 32 GPUs over 4 weeks, building in notebooks and training in a closed "
                     "loop, under static GPUs per researcher, a pool, and gpushare (culling, "
                     "idle-first reclaim, lent build GPUs), over a sweep of demand; with "
                     "--activity (default philly), --json and --plot")
    sim.add_argument("--seeds", type=_seeds, metavar="N", help="with --scenario team: the "
                     "mean over N teams drawn with seeds 21 onwards (each a closed loop whose "
                     "figures move by points from one team to the next), and gpushare minus "
                     "pooled per team; N times as long (default 1)")
    sim.add_argument("--from-pool", action="store_true", help="replay the pool service's "
                     "recorded train jobs (api/history, admins) instead of a trace: under "
                     "today's projects, quotas and nodes, and under the --capacity and "
                     "--quotas given")
    sim.add_argument("--since", metavar="WHEN", help="with --from-pool: the jobs submitted "
                     "since then: 30d (default), 12h, epoch seconds or a date 2026-10-01")
    sim.add_argument("--until", metavar="WHEN", help="with --from-pool: and before then "
                     "(default: now)")
    sim.add_argument("--quotas", metavar="FILE|proportional",
                     help="CSV project,quota (GPUs), or 'proportional' to derive quotas from each "
                     "project's share of the trace's GPU-hours; projects left out have quota 0 "
                     "(with --from-pool: the changed quotas; projects left out keep theirs)")
    sim.add_argument("--departments", metavar="FILE",
                     help="CSV department,quota,limit,projects (GPUs; an empty limit is none; "
                     "projects space-separated), optionally over_quota_weight: a second level "
                     "of quotas over the projects, for --policy guaranteed. Its quotas are "
                     "never scaled: where --scale-quotas or proportional quotas give a "
                     "department's projects more than its quota, the quota (and a lower "
                     "limit) is raised to what they add up to, and the run says so on stderr")
    sim.add_argument("--capacity", type=_capacity, metavar="GPUS", help="GPUs in the train pool (default: the "
                     "sum of the quotas file); with --from-pool the changed capacity: +K "
                     "(K more GPUs), -K, or N GPUs in all")
    sim.add_argument("--gpus-per-node", type=_positive_int, default=8, metavar="N",
                     help="GPUs per node (default 8)")
    sim.add_argument("--policy", choices=("guaranteed", "static", "fifo"), default="guaranteed",
                     help="guaranteed (ours), static (each project confined to its quota) or "
                     "fifo (one queue, no quotas, no preemption)")
    sim.add_argument("--scale-quotas", action="store_true",
                     help="scale the quotas to add up to exactly the capacity (whole GPUs)")
    sim.add_argument("--json", action="store_true", help="print one JSON object")
    sim.add_argument("--events", metavar="FILE.jsonl", help="write every submit/start/preempt/"
                     "finish as one JSON object per line, in time order")
    sim.add_argument("--plot", metavar="FILE.png", help="draw allocated GPUs per project and "
                     "the queue over time (needs matplotlib)")
    sim.add_argument("--grace-period", type=_seconds, default=DEFAULT_GRACE_S, metavar="S",
                     help=f"seconds a preempted job keeps its GPUs before it is killed "
                          f"(default {DEFAULT_GRACE_S:g})")
    sim.add_argument("--checkpoint-interval", type=_seconds, default=1800.0, metavar="S",
                     help="seconds of run time between a job's checkpoints; a preempted job loses "
                     "the work since its last one (default 1800; 0: no checkpoints)")
    sim.add_argument("--min-runtime", type=_seconds, default=DEFAULT_MIN_RUNTIME_S, metavar="S",
                     help="seconds a job runs before it may be preempted (default "
                     f"{DEFAULT_MIN_RUNTIME_S:g}, as the pool service; 0: any time)")
    sim.add_argument("--reserve-after", type=_seconds, default=PolicyConfig().reserve_after_s,
                     metavar="S", help="seconds a job waits before nodes are reserved for it "
                     f"(default {PolicyConfig().reserve_after_s:g})")
    sim.add_argument("--cycle-interval", type=_seconds, default=0.0, metavar="S",
                     help="least seconds between scheduling cycles (default 0: after every event)")
    sim.add_argument("--fair-share-half-life", type=_seconds, default=0.0, metavar="S",
                     help="fair share over time, as PoolService.fair_share_half_life: seconds "
                     "after which borrowed GPU-time counts half when idle GPUs are divided "
                     "(default 0: off)")
    sim.add_argument("--reclaim-fair-share", action="store_true",
                     help="as PoolService.reclaim_fair_share: a borrower below its deserved share "
                     "of idle GPUs may preempt borrowers above theirs (default: off). With "
                     "--fair-share-half-life the shares count recent borrowing")
    sim.add_argument("--no-consolidate", dest="consolidate", action="store_false",
                     help="as PoolService.consolidate = False: a gang within its project's "
                     "quota that finds GPUs, but not on few enough nodes, and no borrower to "
                     "take back, waits for jobs to end instead of moving jobs within quota to "
                     "other GPUs (default: it moves them)")
    sim.add_argument("--activity", choices=sorted(PROFILES), metavar="PROFILE",
                     help="model each train job's GPU utilization: from the trace's util column "
                     "where it has one, else drawn from the published per-GPU utilization CDF "
                     "of philly (median 48 %%) or llm (an LLM cluster's, median 99 %%); "
                     "reports average GPU utilization over time and idle-allocated GPU time")
    sim.add_argument("--fair-share-window", type=_seconds, default=7 * 86400.0, metavar="S",
                     help="seconds of borrowing fair share over time looks back on (default "
                     "604800, a week)")
    sim.set_defaults(func=cmd_simulate)
    add_pool_commands(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CommandError as e:
        say(f"gpushare {args.command}: {e}", sys.stderr)  # may echo the service's sentence
        return e.status
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``gpushare logs JOB | head``): no error, and none at exit
        # when Python flushes stdout again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0


def cmd_simulate(args) -> int:
    if args.scenario:
        return cmd_scenario(args)
    if args.seeds:
        raise UsageError("--seeds is for --scenario team; a trace is replayed as it is")
    if args.from_pool:
        if args.departments:
            raise UsageError("--departments is for a trace (--trace FILE); --from-pool replays "
                             "the pool's own projects")
        from .cli_whatif import cmd_from_pool
        return cmd_from_pool(args)
    for name in ("since", "until"):
        if getattr(args, name):
            raise UsageError(f"--{name} is for --from-pool; a trace file is replayed whole")
    if not args.trace:
        raise UsageError("say what to replay: --trace FILE, or --from-pool for the pool's own "
                         "recorded jobs")
    if args.capacity is not None:
        if args.capacity[:1] in "+-":
            raise UsageError(f"--capacity {args.capacity} is a change, for --from-pool; give "
                             f"the train pool's GPUs, like --capacity 64")
        args.capacity = int(args.capacity)
    from .policy.past_use import FairShareTime
    from .sim.engine import SimConfig, Simulator
    from .sim.metrics import summarize
    from .sim.trace import (TraceError, apportion, departments_problem, hold_projects,
                            proportional_quotas, read_departments, read_quotas, read_trace)

    try:
        jobs = read_trace(args.trace)
        if args.quotas == "proportional":
            quotas = None
        elif args.quotas:
            quotas = read_quotas(args.quotas)
        else:
            quotas = {}
        departments = read_departments(args.departments) if args.departments else {}
    except TraceError as e:
        raise UsageError(str(e)) from None
    given = sum(1 for j in jobs if j.kind == "train" and j.util is not None)
    trains = sum(1 for j in jobs if j.kind == "train")
    if given and given < trains and not args.activity:
        raise UsageError(f"{args.trace}: {trains - given} of {trains} train jobs have no util; "
                         f"fill the column in, or give --activity philly or llm to draw theirs")
    capacity = args.capacity
    if capacity is None:
        if not quotas:
            raise UsageError("say how many GPUs the train pool has with --capacity GPUS")
        total = sum(quotas.values())
        if total % GPU:
            raise UsageError("the quotas add up to a fraction of a GPU; give --capacity GPUS")
        capacity = total // GPU
    derived = quotas is None or (args.scale_quotas and sum(quotas.values()) > 0)
    if quotas is None:
        quotas = proportional_quotas(jobs, capacity)
    elif args.scale_quotas and sum(quotas.values()) > 0:
        quotas = apportion({p: q for p, q in quotas.items()}, capacity)
    elif problem := overbooking(quotas.values(), capacity * GPU):
        raise UsageError(f"{problem}: lower them, raise --capacity or pass --scale-quotas")
    if departments:
        if args.policy != "guaranteed":
            raise UsageError("--departments divides quotas on two levels: it is for --policy "
                             "guaranteed")
        raised = []
        if derived:  # the projects' quotas moved; each department still holds its own
            departments, raised = hold_projects(departments, quotas)
        if problem := departments_problem(departments, quotas, capacity * GPU):
            raise UsageError(f"{args.departments}: {problem}")
        for sentence in raised:  # on stderr: --json keeps stdout one JSON object
            print(sentence, file=sys.stderr)
    for job in jobs:  # the policy's own rule, as a submit to the pool meets it
        never = job.kind == "train" and never_fits_gpus(job.gpus, Project(job.project, 0),
                                                        capacity * GPU)
        if never:
            raise UsageError(f"{args.trace}, line {job.line}: job {job.id}: {never}; or raise "
                             f"--capacity, or remove the job")
    fair_share = None
    if args.fair_share_half_life:
        if args.policy != "guaranteed":
            raise UsageError("--fair-share-half-life divides idle GPUs among projects: it is "
                             "for --policy guaranteed")
        try:
            fair_share = FairShareTime(args.fair_share_half_life, args.fair_share_window)
        except ValueError as e:
            raise UsageError(f"{e}: fix --fair-share-half-life or --fair-share-window") from None
    if args.reclaim_fair_share and args.policy != "guaranteed":
        raise UsageError("--reclaim-fair-share preempts borrowers for others: it is for --policy "
                         "guaranteed (the baselines never borrow)")
    if not args.consolidate and args.policy != "guaranteed":
        raise UsageError("--no-consolidate is about moving jobs for a gang within its quota: "
                         "it is for --policy guaranteed (the baselines never preempt)")
    config = SimConfig(
        capacity_gpus=capacity, gpus_per_node=args.gpus_per_node, policy=args.policy,
        grace_s=args.grace_period, checkpoint_interval_s=args.checkpoint_interval,
        cycle_interval_s=args.cycle_interval, fair_share=fair_share, activity=args.activity,
        policy_config=PolicyConfig(min_runtime_s=args.min_runtime,
                                   reserve_after_s=args.reserve_after,
                                   reclaim_fair_share=args.reclaim_fair_share,
                                   consolidate=args.consolidate))
    events = _open_out(args.events)
    try:
        run = Simulator(jobs, quotas, config, events=events, timeline=bool(args.plot),
                        departments=departments).run()
    finally:
        if events is not None:
            events.close()
    summary = summarize(run)
    summary["departments_file"] = args.departments
    if args.plot:
        from .sim.plot import plot_run
        _plot(plot_run, run, args.plot)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        say(format_summary(summary))  # the trace's project names
    for what, path in (("events", args.events), ("plot", args.plot)):
        if path:  # on stderr: --json keeps stdout one JSON object
            print(f"wrote the {what} to {os.path.abspath(path)}", file=sys.stderr)
    return 0


def _plot(draw, what, path: str) -> None:
    """``draw(what, path)``, its failures (no matplotlib, a path it cannot write) in one
    sentence."""
    try:
        draw(what, path)
    except RuntimeError as e:
        raise UsageError(str(e)) from None
    except OSError as e:
        raise UsageError(f"cannot write {path} ({e.strerror})") from None


def cmd_scenario(args) -> int:
    given = [f"--{name.replace('_', '-')}" for name in ("trace", "from_pool", "quotas",
                                                        "departments", "capacity", "events")
             if getattr(args, name)]
    if given:
        raise UsageError(f"--scenario team makes its own demand, pool and quotas; leave out "
                         f"{', '.join(given)}")
    from .sim.scenario import scenario
    from .sim.team import TeamParameters
    profile = args.activity or "philly"

    def done(row):  # on stderr, a line per level as it is done: the sweep takes a while
        print(f"demand {row['demand']:g} ({row['demand_gpus']:g} GPUs) done", file=sys.stderr,
              flush=True)

    result = scenario(TeamParameters(), profile, on_level=done, seeds=args.seeds or 1)
    if args.plot:
        from .sim.plot import plot_team
        _plot(plot_team, result, args.plot)
    if result["calibration"]:
        for config in ("static", "pooled", "gpushare"):
            result["calibration"][config].pop("series")
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        from .sim.team_text import format_team
        print(format_team(result))
    if args.plot:
        print(f"wrote the plot to {os.path.abspath(args.plot)}", file=sys.stderr)
    return 0


def _open_out(path):
    if not path:
        return None
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write {path} ({e.strerror}); check the directory") from None


def _activity_line(s: dict) -> str:
    if s["avg_utilization"] is None:
        return "  GPU activity not modelled (give the trace a util column, or --activity)"
    where = f"the trace's util column ({s['jobs_with_util']} jobs)" if s["jobs_with_util"] else ""
    if s["activity"]:
        where += (", else " if where else "") + f"drawn from profile {s['activity']}"
    return (f"  average GPU utilization {s['avg_utilization']:.1%} (of what was allocated "
            f"{s['utilization']:.1%}, idle-allocated {s['idle_allocated']:.1%}); job activity: "
            f"{where}")


def format_summary(s: dict) -> str:
    hours = lambda sec: f"{sec / 3600:.2f} h"  # noqa: E731
    lines = [
        f"policy {s['policy']} on {s['capacity_gpus']} GPUs ({s['gpus_per_node']} per node)",
        f"  jobs {s['jobs']}, completed {s['completed']}, unschedulable {s['unschedulable']}",
        f"  allocation {s['allocation']:.1%} over {s['span_s'] / 86400:.1f} days "
        f"({s['allocation_to_last_submit']:.1%} until the last submit)",
        _activity_line(s),
        f"  JCT avg {hours(s['avg_jct_s'])}, p50 {hours(s['p50_jct_s'])}, p99 {hours(s['p99_jct_s'])}",
        f"  queueing avg {hours(s['avg_queue_s'])}, p99 {hours(s['p99_queue_s'])}",
        f"  preemptions {s['preemptions']} ({s['within_quota_preemptions']} within quota"
        + (f", {s['moves']} moved" if s.get("consolidate") else "") + "), "
        f"lost {s['lost_gpu_hours']:.1f} GPU-hours, p99 reclaim {s['p99_reclaim_s']:.0f} s",
        *([f"  guarantee wait p99 {s['guarantee_wait_p99_s']:.0f} s, max "
           f"{s['guarantee_wait_max_s']:.0f} s (bound {s['guarantee_bound_s']:g} s; "
           f"{s['guarantee_waits_over_bound']} of {s['guarantee_waits']} beyond it)"]
          if s["policy"] == "guaranteed" else []),  # the baselines promise no bound
        *([f"  borrowing against weights: weekly gap max {s['borrow_gap_max']:.1%}, mean "
           f"{s['borrow_gap_mean']:.1%} (fair share over time "
           + (f"half-life {s['fair_share_half_life_s']:g} s" if s['fair_share_half_life_s']
              else "off")
           + (", fair-share reclaim)" if s.get("reclaim_fair_share") else ")")]
          if s["policy"] == "guaranteed" and s["borrow_gap_weeks"] else []),
        f"  decision ms p50 {s['decision_ms']['p50']}, p99 {s['decision_ms']['p99']}, "
        f"max {s['decision_ms']['max']}; wall {s['wall_s']} s",
        "",
        f"  {'project':<12}{'quota':>7}{'jobs':>7}{'done':>7}{'GPU-h':>10}{'avg queue':>12}"
        f"{'preempted':>11}",
    ]
    for name, p in s["per_project"].items():
        lines.append(f"  {name:<12}{p['quota_gpus']:>7g}{p['jobs']:>7}{p['completed']:>7}"
                     f"{p['gpu_hours']:>10.1f}{hours(p['avg_queue_s']):>12}{p['preemptions']:>11}")
    if s.get("departments"):
        lines += ["", f"  departments of {s['departments_file']}",
                  f"  {'department':<12}{'quota':>7}{'limit':>7}{'jobs':>7}{'GPU-h':>10}"
                  f"{'avg GPUs':>10}{'avg queue':>12}{'preempted':>11}"]
        for name, d in s["departments"].items():
            limit = "-" if d["limit_gpus"] is None else f"{d['limit_gpus']:g}"
            lines.append(f"  {name:<12}{d['quota_gpus']:>7g}{limit:>7}{d['jobs']:>7}"
                         f"{d['gpu_hours']:>10.1f}{d['avg_allocated_gpus']:>10.1f}"
                         f"{hours(d['avg_queue_s']):>12}{d['preemptions']:>11}")
    return "\n".join(lines)
