"""The ``gpushare`` commands that talk to the pool service: submit, jobs, logs, cancel, quota,
pool, usage; and for admins audit, drain and undrain.

Each command is argument parsing, one or two calls of :class:`~.client.PoolClient`, and text for
people (or ``--json`` for scripts). The client's errors become one line and an exit status:
2 for what the user can fix (bad arguments, no credentials, the service's 4xx), 1 when the
service cannot be reached or fails (5xx).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time
from datetime import date, timedelta

from .cli_base import CommandError, UsageError, say, write_csv
from .client import (DEFAULT_RETRY_S, InvalidInput, NoCredentials, PoolClient, PoolError,
                     PoolUnreachable, add_job_options, argument_type, job_spec)
from .text import (describe, format_audit, format_jobs, format_pool, format_quota, format_usage,
                   no_jobs, visible)
from .trainjob import ACTIVE, CANCELLED, RUNNING, STATES, SUCCEEDED
from .usage import showback
from .usage.showback import STEPS
from .validate import digits

# The option that gives each job-spec field, for sentences about a bad value.
_OPTION = {"gpus": "--gpus", "priority": "--priority", "name": "--name", "env": "--env",
           "project": "--project", "per_gpu": "--per-gpu", "rank": "--rank"}
POLL_S = 5.0  # the most seconds between looks at a pending job while waiting for it
_NO_COMMAND = "give the command to run after --, e.g. gpushare submit --gpus 2 -- python train.py"


def connection_options() -> argparse.ArgumentParser:
    """--url, --token and --retry, for every command that talks to the pool service."""
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--url", metavar="URL", help="the pool service's address, e.g. "
                            "http://127.0.0.1:8000/services/gpushare/ (default: $GPUSHARE_URL)")
    connection.add_argument("--token", metavar="TOKEN", help="a JupyterHub API token (default: "
                            "$JUPYTERHUB_API_TOKEN, which is better: options show in the process "
                            "list)")
    connection.add_argument("--retry", type=argument_type(_retry), metavar="SECONDS",
                            help="while the pool service is not answering (it restarts within "
                            "seconds), keep trying reads and submits this long (default "
                            f"$GPUSHARE_RETRY, else {DEFAULT_RETRY_S:g}; 0: fail at once); a "
                            "submit is never made twice")
    return connection


def add_pool_commands(sub) -> None:
    """Add the pool commands to the ``gpushare`` subparsers ``sub``."""
    connection = connection_options()
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON for scripts")

    p = sub.add_parser("submit", parents=[connection, as_json], help="submit a train job",
                       usage="gpushare submit [--gpus N] [--project P] [--name NAME] "
                       "[--priority P] [--env K=V ...] [--per-gpu] [--wait] [--json] [--url URL] "
                       "[--token TOKEN] -- CMD...",
                       description="Submit a command as a train job to the train pool. With "
                       "--wait, its output goes to stdout and the state lines to stderr; the exit "
                       "status is 0 if the job succeeded, 1 if it failed or was cancelled. With "
                       "--wait --json, the output goes to stderr and the finished job, as JSON, "
                       "to stdout.")
    add_job_options(p)
    p.add_argument("--wait", action="store_true", help="follow the job's output until it ends")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD...",
                   help="the command to run, after --")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("jobs", parents=[connection, as_json], help="list jobs",
                       description="Your jobs; with --project, that project's queue; with --all, "
                       "every job (admins).")
    p.add_argument("--project", metavar="P", help="a project's queue (you must be a member)")
    p.add_argument("--all", action="store_true", help="every job (admins)")
    p.add_argument("--state", choices=STATES, metavar="S", help="only jobs in this state: "
                   + ", ".join(STATES))
    p.add_argument("--limit", type=argument_type(_limit), metavar="N",
                   help="the newest N jobs, 1 to 1000 (default 100)")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("logs", parents=[connection], help="print a job's output",
                       description="Print a job's output; with -f, keep printing until it ends.")
    p.add_argument("job", metavar="JOB", help="the job's id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job "
                   "ends, through its next attempts if it is preempted (state changes go to "
                   "stderr)")
    p.add_argument("--attempt", type=argument_type(_attempt), metavar="N",
                   help="the output of this attempt only (default: the latest)")
    p.add_argument("--rank", type=argument_type(_rank), default=0, metavar="N",
                   help="the output of this rank of a distributed job (default 0; the job's "
                   "ranks are 0 to its ranks - 1)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", parents=[connection], help="cancel a job",
                       description="Cancel one of your jobs.")
    p.add_argument("job", metavar="JOB", help="the job's id")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("quota", parents=[connection, as_json], help="your projects' quotas and use",
                       description="Your projects' guaranteed quotas, their use, and your jobs.")
    p.set_defaults(func=cmd_quota)

    p = sub.add_parser("pool", parents=[connection, as_json], help="the train pool's GPUs",
                       description="The train pool: its nodes, GPUs and their use.")
    p.set_defaults(func=cmd_pool)

    p = sub.add_parser("usage", parents=[connection], help="allocation and utilization "
                       "of the GPUs over a window",
                       description="GPU-hours held, allocation (share of the pool held), "
                       "utilization (share of what was held that was used) and idle-allocated "
                       "share, by project (yours; admins: all), user, job, slice or GPU (admins). "
                       "With --step, one row per calendar day, week or month and group "
                       "(showback), each period asked of api/usage itself.")
    p.add_argument("--by", choices=("project", "department", "user", "job", "slice", "gpu"),
                   default="project", help="one row per project (default), user, job, slice "
                   "or GPU")
    p.add_argument("--since", default="7d", metavar="WHEN", help="start of the window: 7d "
                   "(default: 7 days ago), 12h, 30m, epoch seconds, a date 2026-10-01 or "
                   "2026-11-20T09:00")
    p.add_argument("--until", metavar="WHEN", help="end of the window (default: now)")
    p.add_argument("--step", choices=STEPS, help="one row per calendar day, week (from Monday) "
                   "or month and group; --since (and --until, default now) must be dates "
                   "like 2026-10-01")
    p.add_argument("--format", choices=("table", "csv", "json"), help="table (default), csv "
                   "(GPU-hours and GPU-seconds, for spreadsheets) or json")
    p.add_argument("--json", action="store_const", const="json", dest="format",
                   help="the same as --format json")
    p.add_argument("--sort", choices=("allocated", "idle", "utilization", "name"),
                   help="allocated (default), idle (the most idle-allocated first), "
                   "utilization or name")
    p.add_argument("--limit", type=argument_type(_limit), metavar="N",
                   help="at most N rows, 1 to 1000 (default 100)")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser("audit", parents=[connection, as_json], help="who changed what in the "
                       "pool, and when (admins)",
                       description="The audit trail, newest first: project changes, cancels of "
                       "other users' jobs, drained nodes and culled servers, with who did it, "
                       "through which door (api, dashboard, cli, config or culling) and the "
                       "values before and after.")
    p.add_argument("--since", metavar="WHEN", help="only entries from then on: 7d (7 days "
                   "ago), 24h, 30m, epoch seconds or 2026-11-20T09:00 (default: all kept)")
    p.add_argument("--limit", type=argument_type(_limit), metavar="N",
                   help="the newest N entries, 1 to 1000 (default 100)")
    p.set_defaults(func=cmd_audit)

    p = sub.add_parser("drain", parents=[connection], help="start no new jobs on a node "
                       "(admins)", description="Drain a train node before maintenance: no new "
                       "train job starts there; the jobs that run there finish, or with "
                       "--requeue are stopped as a preemption stops them (their grace period, "
                       "then requeued to resume from their checkpoints on other nodes). "
                       "gpushare undrain NODE gives the node back.")
    p.add_argument("node", metavar="NODE", help="the node's name, as gpushare pool lists it")
    p.add_argument("--requeue", action="store_true", help="stop the jobs that run there now "
                   "and requeue them")
    p.set_defaults(func=cmd_drain)

    p = sub.add_parser("undrain", parents=[connection], help="let new jobs start on a drained "
                       "node again (admins)", description="Undrain a train node: new train "
                       "jobs may start there again.")
    p.add_argument("node", metavar="NODE", help="the node's name, as gpushare pool lists it")
    p.set_defaults(func=cmd_undrain)


def _retry(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise InvalidInput("retry", f"must be 0 to 3600 seconds, not {text!r}")
    return value


def _attempt(text):
    if not digits(text) or int(text) < 1:
        raise InvalidInput("attempt", f"must be 1 or more, not {text!r}")
    return int(text)


def _rank(text):
    if not digits(text):
        raise InvalidInput("rank", f"must be a whole number from 0, not {text!r}")
    return int(text)


def _limit(text):
    if not digits(text, 4) or not 1 <= int(text) <= 1000:
        raise InvalidInput("limit", f"must be a whole number from 1 to 1000, not {text!r}")
    return int(text)


def pool_command(run):
    """Give ``run(args, client)`` a client and turn the client's errors into one line."""
    @functools.wraps(run)
    def command(args):
        client = PoolClient(args.url or None, args.token or None, retry_s=args.retry,
                            on_retry=lambda sentence: say(f"gpushare {args.command}: "
                                                          f"{sentence}", sys.stderr, flush=True),
                            via="cli")
        try:
            return run(args, client)
        except InvalidInput as e:
            raise UsageError(f"{_OPTION[e.field]}: {e.problem}" if e.field in _OPTION
                             else str(e)) from None
        except NoCredentials as e:
            raise UsageError(e.sentence(f"--{e.missing}")) from None
        except PoolError as e:
            raise CommandError(e.message, 2 if 400 <= e.status < 500 else 1) from None
        except PoolUnreachable as e:
            raise CommandError(str(e), 1) from None
    return command


# -- commands -----------------------------------------------------------------------------------

@pool_command
def cmd_submit(args, client) -> int:
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        raise UsageError(_NO_COMMAND)
    env = {k: v for item in args.env for k, v in item.items()}
    spec = job_spec(command, gpus=args.gpus, project=args.project, name=args.name,
                    priority=args.priority, env=env, per_gpu=args.per_gpu,
                    path=os.environ.get("PATH"))
    job = client.submit(spec)
    if not args.wait:
        if args.json:
            print(json.dumps(job, indent=2))
        else:
            say(describe(job))
        return 0
    out = sys.stderr if args.json else sys.stdout
    say(describe(job), sys.stderr, flush=True)
    try:
        job = follow_job(client, job, out, poll_s=POLL_S,
                         note=lambda line: say(line, sys.stderr, flush=True))
    except KeyboardInterrupt:
        say(f"\nstopped following job {job['id']}; it goes on (gpushare cancel {job['id']} "
            f"stops it)", sys.stderr)
        return 130
    if args.json:
        print(json.dumps(job, indent=2))
    else:
        say(describe(job), sys.stderr)
    return 0 if job["state"] == SUCCEEDED else 1


@pool_command
def cmd_jobs(args, client) -> int:
    try:
        jobs = client.jobs(project=args.project, all=args.all, state=args.state,
                           limit=args.limit)
    except PoolError as e:
        if args.all and e.status == 403:  # the API's sentence names its parameter, all=1
            raise CommandError("only admins can list every job; leave out --all to list "
                               "yours", 2) from None
        raise
    if args.json:
        print(json.dumps({"jobs": jobs}, indent=2))
    elif jobs:
        say(format_jobs(jobs, now=time.time(), width=shutil.get_terminal_size((120, 24)).columns))
    else:
        print(no_jobs(filtered=bool(args.project or args.state)))
    return 0


@pool_command
def cmd_logs(args, client) -> int:
    out = _log_output(client, args.job)
    if args.follow and args.attempt is None:
        # Across attempts: a preempted job's output goes on with its next attempt.
        follow_job(client, client.job(args.job), out, poll_s=POLL_S,
                   note=lambda line: say(line, sys.stderr, flush=True), rank=args.rank)
        return 0
    for text in client.logs(args.job, follow=args.follow, attempt=args.attempt, rank=args.rank):
        out.write(text)
        out.flush()
    return 0


class _Visible:
    """A terminal that shows what a log would make it do (``text.visible``)."""

    def __init__(self, out):
        self.out = out

    def write(self, text: str) -> None:
        self.out.write(visible(text, lines=True))

    def flush(self) -> None:
        self.out.flush()


def _log_output(client, job_id: str):
    """Where a job's output goes: as its program wrote it (colours, progress bars) into a
    file or a pipe, and onto the terminal of its owner; onto anyone else's terminal (an
    admin's: only they may read others' logs) with what a terminal would obey (a title, the
    clipboard, hidden text) shown as escapes."""
    if not sys.stdout.isatty():
        return sys.stdout
    if client.job(job_id).get("user") == client.quota().get("user"):
        return sys.stdout
    return _Visible(sys.stdout)


@pool_command
def cmd_cancel(args, client) -> int:
    job = client.cancel(args.job)
    if job.get("state") == CANCELLED:
        say(f"job {job['id']} cancelled")
    else:
        say(f"job {job['id']} is being cancelled (still {job.get('state')})")
    return 0


@pool_command
def cmd_quota(args, client) -> int:
    quota = client.quota()
    if args.json:
        print(json.dumps(quota, indent=2))
    else:
        say(format_quota(quota))
    return 0


@pool_command
def cmd_pool(args, client) -> int:
    pool = client.pool()
    if args.json:
        print(json.dumps(pool, indent=2))
    else:
        say(format_pool(pool))
    return 0


@pool_command
def cmd_usage(args, client) -> int:
    fmt = args.format or "table"
    if args.step:
        return _showback(args, client, fmt)
    answer = client.usage(since=args.since, until=args.until, by=args.by, sort=args.sort,
                          limit=args.limit)
    if fmt == "json":
        print(json.dumps(answer, indent=2))
    elif fmt == "csv":
        write_csv(showback.to_csv(showback.showback_rows(answer, args.by)))
    else:
        say(format_usage(answer))
    return 0


def _showback(args, client, fmt: str) -> int:
    """One api/usage answer per calendar period: the figures are the API's, to the second."""
    try:
        since = showback.parse_date(args.since, "--since")
        until = showback.parse_date(args.until, "--until") if args.until else None
        last = until or date.today() + timedelta(days=1)
        cuts = showback.periods(since, last, args.step)
    except ValueError as e:
        raise UsageError(str(e)) from None
    rows, answers = [], []
    for start, end in cuts:
        asked_end = end if until or end < date.today().isoformat() else "now"
        answer = client.usage(since=start, until=asked_end, by=args.by, sort=args.sort or "name",
                              limit=args.limit or 1000)
        answers.append({"period_start": start, "period_end": end, "usage": answer})
        rows += showback.showback_rows(answer, args.by, (start, end))
    if fmt == "json":
        print(json.dumps({"by": args.by, "step": args.step, "rows": rows, "periods": answers},
                         indent=2))
    elif fmt == "csv":
        write_csv(showback.to_csv(rows))
    else:
        say(showback.to_table(rows, args.by))
    return 0


@pool_command
def cmd_audit(args, client) -> int:
    answer = client.audit(since=args.since, limit=args.limit)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        say(format_audit(answer["entries"]))
    return 0


@pool_command
def cmd_drain(args, client) -> int:
    node = client.set_drained(args.node, True, requeue=args.requeue)
    line = f"node {node['name']} is drained: no new jobs start there"
    if node.get("requeued"):
        line += f"; {len(node['requeued'])} job(s) are being requeued: " + \
            ", ".join(node["requeued"])
    say(line)
    return 0


@pool_command
def cmd_undrain(args, client) -> int:
    node = client.set_drained(args.node, False)
    say(f"node {node['name']} takes new jobs again")
    return 0


# -- following a job ----------------------------------------------------------------------------

def follow_job(client, job: dict, out, note, poll_s: float = 5.0, sleep=time.sleep,
               rank: int = 0) -> dict:
    """Write the job's output (of rank ``rank``) to ``out`` until it ends; return the
    finished job.

    A running attempt's output is followed as it comes. A pending job is looked at again after
    0.2 s, then less and less often, up to every ``poll_s`` seconds: a job that starts at once
    shows its output at once, and a long wait in the queue costs the service little. A preempted
    job comes back as a new attempt, whose output follows; a stream that closes early is reopened
    and what was already written is skipped. ``note`` gets a line at each change of state."""
    job_id = job["id"]
    written: dict = {}  # attempt -> characters of its output already written
    said = (job.get("state"), job.get("attempt"))
    first = wait = min(0.2, poll_s)
    while True:
        state, attempt = job.get("state"), job.get("attempt")
        if state not in ACTIVE:
            try:
                _copy(client.logs(job_id, attempt=attempt, rank=rank), written, attempt, out)
            except PoolError as e:
                if e.status not in (400, 404):  # the outcome matters more than missing output
                    raise
            return job
        if not (state == RUNNING
                and _copy(client.logs(job_id, follow=True, attempt=attempt, rank=rank), written,
                          attempt, out)):
            sleep(wait)
            wait = min(wait * 2, poll_s)
        job = client.job(job_id)
        if (job.get("state"), job.get("attempt")) != said:
            if job.get("attempt") != said[1] and job.get("requeued"):
                note(f"job {job_id} {job['requeued']} (attempt {job.get('attempt')})")
            said, wait = (job.get("state"), job.get("attempt")), first
            if job.get("state") in ACTIVE:
                note(describe(job))


def _copy(chunks, written: dict, attempt, out) -> bool:
    """Write the chunks beyond what was written of this attempt's output; True if any."""
    done, seen, wrote = written.get(attempt, 0), 0, False
    for text in chunks:
        start = max(0, done - seen)
        seen += len(text)
        if start < len(text):
            out.write(text[start:])
            out.flush()
            wrote = True
    written[attempt] = max(done, seen)
    return wrote
