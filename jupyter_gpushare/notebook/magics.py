"""IPython magics: ``%%train`` and ``%train script.py`` send work to the train pool,
``%gpushare`` shows the panel or does a quick action. ``%load_ext jupyter_gpushare``.

A thin layer over ``job.py``: parse the options, submit, follow. Whatever the user can get
wrong (an option, a project, the kernel's credentials, a pool that is down) ends the cell with
one sentence and submits nothing; a job that fails or is interrupted ends the cell with an
error too, so that "Run All" stops there.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.display import display

from ..client import ClientError, InvalidInput, NoCredentials, add_job_options
from ..text import status_line
from ..trainjob import CANCELLED, SUCCEEDED, BadField, default_project
from .job import Job, JobError, notebook_client, submit

USAGE = ("%%train [--gpus N] [--project P] [--name NAME] [--priority P] [--env K=V ...] "
         "[--per-gpu] [--all-ranks] [--with VAR,...] [--out VAR,...] [--no-wait]")
SCRIPT_USAGE = ("%train [--gpus N] [--project P] [--name NAME] [--priority P] [--env K=V ...] "
                "[--per-gpu] [--all-ranks] [--no-wait] script.py [args...]")
GPUSHARE_USAGE = ("%gpushare (the panel), %gpushare jobs, %gpushare logs JOB [RANK] or "
                  "%gpushare cancel JOB")
# The option that gives each submit() argument, for sentences about a bad value.
_OPTION = {"gpus": "--gpus", "priority": "--priority", "name": "--name", "env": "--env",
           "project": "--project", "with_vars": "--with", "out": "--out", "source": "the cell"}


class TrainError(Exception):
    """Ends a cell with one line, no traceback (IPython calls ``_render_traceback_``); the
    cell still counts as failed, so the cells after it do not run."""

    def _render_traceback_(self):
        return [f"\x1b[0;31mgpushare:\x1b[0m {self}"]


class _Done(Exception):
    """``--help`` was printed: nothing more to do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise TrainError(_sentence(message, self))

    def exit(self, status=0, message=None):
        if status:
            raise TrainError((message or "bad options").strip())
        raise _Done()


def _sentence(message: str, parser: argparse.ArgumentParser) -> str:
    """argparse's words, made into a sentence that says what to do."""
    usage = parser.usage.replace("%%", "%")
    if message.startswith("unrecognized arguments: "):
        unknown = message.split(": ", 1)[1]
        return f"unknown option {unknown}; use {usage}"
    if message.startswith("the following arguments are required"):
        return f"give the script to run: {usage}"
    if message.startswith("argument "):
        option, _, problem = message[len("argument "):].partition(": ")
        option = option.split("/")[-1]
        if problem == "expected one argument":
            return f"{option} needs a value; use {usage}"
        return f"{option}: {problem}"
    return message


def _var_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"give variable names separated by commas, not "
                                         f"{text!r}")
    return names


def build_parser(script: bool) -> _Parser:
    usage = SCRIPT_USAGE if script else USAGE
    parser = _Parser(prog="%train" if script else "%%train", add_help=True,
                     usage=usage.replace("%", "%%"), allow_abbrev=False,
                     description="Run the script as a train job." if script else
                     "Run the cell as a train job, in a fresh Python process in this "
                     "notebook's working directory and Python environment.")
    add_job_options(parser)
    if not script:
        parser.add_argument("--with", dest="with_vars", type=_var_names, action="extend",
                            default=[], metavar="VAR,...", help="notebook variables to send "
                            "along (picklable)")
        parser.add_argument("--out", type=_var_names, action="extend", default=[],
                            metavar="VAR,...", help="variables to bring back into the "
                            "notebook when the job succeeds")
    parser.add_argument("--all-ranks", action="store_true", help="follow the output of every "
                        "rank of a distributed job, each line after [rank N] (default: rank "
                        "0's)")
    parser.add_argument("--no-wait", action="store_true", help="return the Job at once "
                        "instead of following it")
    if script:
        parser.add_argument("script", help="the Python script to run")
        parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def parse(line: str, script: bool) -> argparse.Namespace | None:
    """The options of ``%%train`` (``script=False``) or ``%train``; None after ``--help``."""
    try:
        words = shlex.split(line)
    except ValueError as e:
        raise TrainError(f"the options cannot be read ({str(e).lower()})") from None
    try:
        return build_parser(script).parse_args(words)
    except _Done:
        return None


def credentials_sentence(e: NoCredentials) -> str:
    if e.detail:
        return f"{e.detail}; set the right one with %env {e.variable}=..."
    if e.missing == "url":
        return ("this kernel does not know the pool service's address (GPUSHARE_URL is not "
                "set): ask your JupyterHub admin to set it in c.Spawner.environment, or use "
                "%env GPUSHARE_URL=https://<hub>/services/gpushare/")
    return ("this kernel has no JupyterHub token (JUPYTERHUB_API_TOKEN is not set): start "
            "the notebook from JupyterHub, or use %env JUPYTERHUB_API_TOKEN=<a token from the "
            "hub's Token page>")


def one_sentence(e: ClientError) -> str:
    """A client error as the sentence for the cell, naming the magic's options."""
    if isinstance(e, NoCredentials):
        return credentials_sentence(e)
    if isinstance(e, InvalidInput) and e.problem and e.field in _OPTION:
        return f"{_OPTION[e.field]}: {e.problem}"
    return str(e)


@magics_class
class GPUShareMagics(Magics):
    """``%%train``, ``%train`` and ``%gpushare``."""

    def __init__(self, shell=None, client_factory=notebook_client):
        super().__init__(shell)
        self.client_factory = client_factory  # made per call: the environment may change

    @line_cell_magic
    def train(self, line, cell=None):
        """%%train: run the cell as a train job; %train script.py [args]: run a script.

        Options: --gpus N, --project P, --name NAME, --priority P, --env K=V (repeat),
        --per-gpu (one rank per GPU), --all-ranks (follow every rank's output),
        --with VAR,... and --out VAR,... (cells only), --no-wait (return the Job at once).
        """
        args = parse(line, script=cell is None)
        if args is None:
            return None
        try:
            job = self._submit(args, cell)
        except ClientError as e:
            raise TrainError(one_sentence(e)) from None
        if args.no_wait:
            return job
        self._follow(job, load_out=cell is not None, all_ranks=args.all_ranks)
        return None

    @line_magic
    def gpushare(self, line):
        """%gpushare: the quota-and-queue panel. %gpushare jobs | logs JOB | cancel JOB."""
        try:
            words = shlex.split(line)
        except ValueError as e:
            raise TrainError(f"the command cannot be read ({str(e).lower()})") from None
        try:
            if not words or words == ["panel"]:
                return self._panel()
            client = self.client_factory()
            if words == ["jobs"]:
                from ..text import format_jobs, no_jobs
                jobs = client.jobs()
                print(format_jobs(jobs, width=None) if jobs else no_jobs())
                return None
            if len(words) in (2, 3) and words[0] == "logs" and all(w.isdigit()
                                                                    for w in words[2:]):
                for text in client.logs(words[1], rank=int(words[2]) if words[2:] else None):
                    sys.stdout.write(text)
                sys.stdout.flush()
                return None
            if len(words) == 2 and words[0] == "cancel":
                job = client.cancel(words[1])
                print(f"job {job['id']} cancelled" if job.get("state") == CANCELLED else
                      f"job {job['id']} is being cancelled (it got SIGTERM)")
                return None
        except ClientError as e:
            raise TrainError(one_sentence(e)) from None
        raise TrainError(f"unknown command %gpushare {line.strip()}; use {GPUSHARE_USAGE}")

    # -- helpers -----------------------------------------------------------------------------

    def _submit(self, args, cell) -> Job:
        client = self.client_factory()
        env = {k: v for item in args.env for k, v in item.items()}
        common = dict(gpus=args.gpus, name=args.name, priority=args.priority, env=env,
                      workdir=os.getcwd(), per_gpu=args.per_gpu, client=client)
        if cell is None:
            script = os.path.join(os.getcwd(), args.script)
            if not os.path.isfile(script):
                raise TrainError(f"there is no script {args.script} in {os.getcwd()}; give "
                                 f"its path relative to the notebook's directory")
            common["name"] = args.name or os.path.basename(args.script)
            return submit([sys.executable, "-u", args.script, *args.args],
                          project=self._project(args, client), **common)
        if not cell.strip():
            raise TrainError("the cell is empty; put the code to run below %%train")
        user_ns = self.shell.user_ns
        missing = [n for n in args.with_vars if n not in user_ns]
        if missing:
            raise TrainError(f"--with {missing[0]}: the notebook has no variable "
                             f"{missing[0]}; define it first or leave it out")
        with_vars = {n: user_ns[n] for n in args.with_vars}
        project = self._project(args, client)
        return submit(source=cell, project=project, with_vars=with_vars, out=args.out,
                      **common)

    @staticmethod
    def _project(args, client) -> str:
        """The project asked for, or the user's only one (refusing with the list if several)."""
        if args.project:
            return args.project
        names = [p["name"] for p in client.quota().get("projects", [])]
        try:
            return default_project(names)
        except BadField as e:
            raise TrainError(f"{e}; choose one with --project NAME" if names else str(e)) \
                from None

    def _follow(self, job: Job, load_out: bool, all_ranks: bool = False) -> None:
        """One live status line and the job's output as it is printed, until it ends."""
        shown = [status_line(job._info)]
        status = display({"text/plain": shown[0]}, raw=True, display_id=True)

        def on_update(info, problem=None):
            text = status_line(info) + (f" · {problem}" if problem else "")
            if text != shown[0] and status is not None:
                shown[0] = text
                status.update({"text/plain": text}, raw=True)

        def on_output(text):
            sys.stdout.write(text)
            sys.stdout.flush()

        try:
            info = job.watch(on_output, on_update, all_ranks=all_ranks)
        except KeyboardInterrupt:
            try:
                on_update(job.cancel())
                said = f"interrupted: job {job.id} was cancelled in the pool"
            except ClientError as e:
                said = f"interrupted, but job {job.id} could not be cancelled: {one_sentence(e)}"
            raise TrainError(said) from None
        except ClientError as e:
            raise TrainError(one_sentence(e)) from None
        if info["state"] != SUCCEEDED:
            raise TrainError(f"{job.failure()}; its output is above")
        if load_out:
            try:
                values = job.result()
            except JobError as e:
                raise TrainError(str(e)) from None
            self.shell.user_ns.update(values)
            if values:
                on_update(info, f"{', '.join(values)} back in the notebook")

    def _panel(self):
        try:
            from .panel import Panel
        except ImportError:
            print("the gpushare panel is not installed in this kernel; %gpushare jobs lists "
                  "your jobs")
            return None
        try:
            panel = Panel(client=self.client_factory())
        except ClientError as e:
            raise TrainError(one_sentence(e)) from None
        display(panel)
        return None


def load_ipython_extension(ipython) -> None:
    """``%load_ext jupyter_gpushare``."""
    ipython.register_magics(GPUShareMagics(ipython))
