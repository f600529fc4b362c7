"""The pool client and the pool commands of ``gpushare``, without the pool service.

A small HTTP server stands in for the service where a test needs answers; its routes are
canned replies keyed by (method, path under the service's address)."""

import http.server
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from jupyter_gpushare import cli_pool
from clirun import refused, run
from jupyter_gpushare.cli_pool import follow_job
from jupyter_gpushare.client import (InvalidInput, NoCredentials, PoolClient, PoolError,
                                     PoolUnreachable, job_spec)
from jupyter_gpushare.text import format_jobs

TOKEN = "s3cr3t-t0ken-8f2a"
PREFIX = "/services/gpushare/"


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    monkeypatch.delenv("GPUSHARE_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a stand-in for the service ----------------------------------------------------------------

class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _answer(self):
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        parts = urlsplit(self.path)
        path = parts.path[len(PREFIX):] if parts.path.startswith(PREFIX) else parts.path
        self.server.requests.append({"method": self.command, "path": path,
                                     "query": parse_qs(parts.query), "headers": self.headers,
                                     "body": json.loads(body) if body else None})
        route = self.server.routes.get((self.command, path), (404, {"error": "no such path"}))
        if callable(route):
            return route(self)
        status, payload, *headers = route
        data = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
        self.send_response(status)
        headers = headers[0] if headers else {"Content-Type": "application/json"}
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _answer

    def log_message(self, *args):
        pass


def chunked(*pieces, between=None):
    """A route answering text/plain in chunks, calling ``between()`` after the first."""
    def answer(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for i, piece in enumerate(pieces):
            data = piece.encode() if isinstance(piece, str) else piece
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            handler.wfile.flush()
            if i == 0 and between:
                between()
        handler.wfile.write(b"0\r\n\r\n")
    return answer


@pytest.fixture
def service():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.routes, server.requests = {}, []
    server.url = f"http://127.0.0.1:{server.server_address[1]}{PREFIX}"
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def env(monkeypatch, service):
    monkeypatch.setenv("GPUSHARE_URL", service.url.rstrip("/"))
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    return service


# -- bad arguments: one sentence, exit 2, before any request ------------------------------------

@pytest.mark.parametrize("argv, words", [
    # The same sentences as the server's (validate.py), before any request.
    (["--gpus", "0", "--", "x"], "argument --gpus: must be 1 or more, not 0; a train job needs "
                                 "at least one GPU"),
    (["--gpus", "0.5", "--", "x"], "argument --gpus: must be a whole number of GPUs (1 or more), "
                                   "not 0.5"),
    (["--gpus", "four", "--", "x"], "argument --gpus: must be a whole number of GPUs (1 or "
                                    "more), not 'four'"),
    (["--env", "FOO", "--", "x"], "argument --env: entries must be NAME=VALUE, not 'FOO'"),
    (["--env", "1X=2", "--", "x"], "argument --env: name '1X' is not a valid variable name"),
    (["--env", "CUDA_VISIBLE_DEVICES=0", "--", "x"], "argument --env: may not set "
                                                     "CUDA_VISIBLE_DEVICES: the pool sets it"),
    (["--priority", "500", "--", "x"], "argument --priority: must be between -100 and 100, "
                                       "not 500"),
    (["--name", "n" * 101, "--", "x"], "argument --name: must be a string of at most 100 "
                                       "characters"),
    (["--frobnicate", "--", "x"], "unrecognized arguments: --frobnicate"),
    (["--env", "MASTER_PORT=1", "--", "x"], "argument --env: may not set MASTER_PORT: the pool "
                                            "sets it for each rank"),
], ids=["zero-gpus", "fraction", "word-gpus", "env-without-equals", "env-bad-name",
        "env-reserved", "priority-range", "long-name", "unknown-option", "env-rank"])
def test_bad_submit_arguments_get_one_sentence(capsys, env, argv, words):
    code, err = refused(capsys, "submit", *argv)
    assert code == 2 and words in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert env.requests == []


@pytest.mark.parametrize("argv", [["--gpus", "2"], ["--gpus", "2", "--"]], ids=["none", "dashes"])
def test_submit_needs_a_command(capsys, env, argv):
    code, _, err = run(capsys, "submit", *argv)
    assert (code, err) == (2, "gpushare submit: give the command to run after --, e.g. "
                              "gpushare submit --gpus 2 -- python train.py\n")
    assert env.requests == []


def test_job_spec_checks_like_the_server():
    assert job_spec(["python", "t.py"], gpus="2", env=["A=1", "B=x=y"], priority=-3) == {
        "command": ["python", "t.py"], "gpus": 2, "env": {"A": "1", "B": "x=y"}, "priority": -3}
    assert job_spec(source="print(1)", project="vision", name="n") == {
        "source": "print(1)", "gpus": 1, "project": "vision", "name": "n"}
    assert job_spec(["x"], workdir="/home/a/p")["workdir"] == "/home/a/p"
    assert job_spec(["x"], path="/opt/env/bin:/usr/bin")["env"] == {"PATH": "/opt/env/bin:/usr/bin"}
    assert job_spec(["x"], env=["PATH=/mine"], path="/opt/env/bin")["env"] == {"PATH": "/mine"}
    assert job_spec(["x"], per_gpu=True)["per_gpu"] is True
    assert "per_gpu" not in job_spec(["x"])
    for kwargs, words in [({"workdir": "rel/dir"}, "workdir must be an absolute path"),
                          ({"workdir": 3}, "workdir must be an absolute path"),
({"gpus": 0}, "gpus must be 1 or more, not 0"),
                          ({"gpus": True}, "gpus must be a whole number of GPUs"),
                          ({"env": {"A-B": "1"}}, "env name 'A-B' is not a valid variable name"),
                          ({"command": "python t.py"}, "command must be a non-empty list"),
                          ({"command": None}, "give either command"),
                          ({"source": "x"}, "give either command"),
                          ({"per_gpu": "yes"}, "per_gpu must be True or False")]:
        with pytest.raises(InvalidInput, match=words):
            job_spec(**{"command": ["x"], **kwargs})


@pytest.mark.parametrize("argv, words", [
    (["jobs", "--state", "bogus"], "argument --state: invalid choice: 'bogus'"),
    (["jobs", "--limit", "0"], "argument --limit: must be a whole number from 1 to 1000"),
    (["logs", "j1", "--attempt", "0"], "argument --attempt: must be 1 or more, not '0'"),
    (["logs", "j1", "--rank", "-1"], "argument --rank: must be a whole number from 0, not '-1'"),
    (["cancel"], "the following arguments are required: JOB"),
    (["audit", "--limit", "1001"], "argument --limit: must be a whole number from 1 to 1000"),
    (["drain"], "the following arguments are required: NODE"),
    (["undrain", "n0", "--requeue"], "unrecognized arguments: --requeue"),
], ids=["state", "limit", "attempt", "rank", "no-job", "audit-limit", "drain-no-node",
        "undrain-requeue"])
def test_bad_arguments_of_the_other_commands(capsys, env, argv, words):
    code, err = refused(capsys, *argv)
    assert code == 2 and words in err and err.count("\n") == 1
    assert env.requests == []


# -- credentials and reachability ---------------------------------------------------------------

def test_no_url_and_no_token_say_what_to_set(capsys, monkeypatch):
    code, out, err = run(capsys, "jobs")
    assert code == 2 and out == ""
    assert err == ("gpushare jobs: no pool service address: set GPUSHARE_URL (e.g. "
                   "http://127.0.0.1:8000/services/gpushare/) or pass --url\n")
    monkeypatch.setenv("GPUSHARE_URL", "http://127.0.0.1:8000/services/gpushare/")
    code, _, err = run(capsys, "quota")
    assert code == 2 and err.startswith("gpushare quota: no JupyterHub token: set "
                                        "JUPYTERHUB_API_TOKEN") and err.endswith("pass --token\n")
    with pytest.raises(NoCredentials, match="set JUPYTERHUB_API_TOKEN .* or pass token="):
        PoolClient().pool()
    with pytest.raises(NoCredentials, match="not an http:// or https:// address"):
        PoolClient("127.0.0.1:8000/services/gpushare/", TOKEN).pool()


def test_closed_port_is_unreachable(capsys, monkeypatch):
    url = f"http://127.0.0.1:{closed_port()}/services/gpushare/"
    with pytest.raises(PoolUnreachable) as e:
        PoolClient(url.rstrip("/"), TOKEN, retry_s=0).jobs()
    assert str(e.value) == (f"the pool service at {url} cannot be reached (connection refused); "
                            f"is JupyterHub running and the URL right?")
    monkeypatch.setenv("GPUSHARE_URL", url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", TOKEN)
    code, out, err = run(capsys, "pool", "--retry", "0")
    assert code == 1 and out == ""
    assert err == (f"gpushare pool: the pool service at {url} cannot be reached (connection "
                   f"refused); is JupyterHub running and GPUSHARE_URL right?\n")


def test_console_script_unreachable_has_no_traceback():
    exe = Path(sys.executable).with_name("gpushare")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "jupyter_gpushare"]
    proc = subprocess.run([*cmd, "jobs", "--retry", "0", "--url",
                           f"http://127.0.0.1:{closed_port()}/"],
                          capture_output=True, text=True,
                          env={**os.environ, "JUPYTERHUB_API_TOKEN": TOKEN})
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert "cannot be reached" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("route, kind, words", [
    ((403, {"error": "job 7 is not yours"}), PoolError, "job 7 is not yours"),
    ((403, b"<html>Forbidden</html>", {"Content-Type": "text/html"}), PoolError,
     "the hub did not accept the token (HTTP 403)"),
    ((302, b"", {"Location": "/hub/login?next=%2Fservices%2Fgpushare%2Fapi%2Fjobs"}), PoolError,
     "redirected to its login page"),
    ((404, b"<html>nope</html>", {"Content-Type": "text/html"}), PoolError,
     "has no api/jobs (HTTP 404); is the URL the pool service's address"),
    ((503, b"<html>down</html>", {"Content-Type": "text/html"}), PoolUnreachable,
     "is not answering (HTTP 503 Service Unavailable from the hub)"),
    ((500, {"error": "the store is locked"}), PoolError, "the store is locked"),
    ((200, b"<html>a login form</html>", {"Content-Type": "text/html"}), PoolError,
     "answered api/jobs with something that is not JSON"),
], ids=["json-403", "hub-403", "login-redirect", "html-404", "proxy-503", "json-500", "html-200"])
def test_error_answers_are_sentences_without_the_token(service, route, kind, words):
    service.routes[("GET", "api/jobs")] = route
    client = PoolClient(service.url + f"?token={TOKEN}", TOKEN, retry_s=0)
    with pytest.raises(kind) as e:
        client.jobs()
    assert words in str(e.value) and TOKEN not in str(e.value) and TOKEN not in repr(client)
    assert len(service.requests) == 1  # a redirect is not followed with the token


def test_a_token_that_cannot_be_a_header_is_refused_unshown(service):
    bad = TOKEN + "\nX-Evil: 1"
    with pytest.raises(NoCredentials) as e:
        PoolClient(service.url, bad).pool()
    assert "not a JupyterHub token" in str(e.value) and TOKEN not in str(e.value)
    assert service.requests == []


def restarting(times, then):
    """A route that answers 503 from the hub's proxy ``times`` times, then ``then``."""
    tries = []

    def answer(handler):
        tries.append(1)
        status, payload = (503, b"<html>down</html>") if len(tries) <= times else then
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "text/html" if status == 503 else
                            "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    return answer


def test_a_submit_survives_a_restart_with_one_line_and_one_key(capsys, env):
    env.routes[("POST", "api/jobs")] = restarting(2, (201, {"id": "j-1", "state": "pending"}))
    code, out, err = run(capsys, "submit", "--", "python", "t.py")
    assert code == 0 and "j-1" in out
    assert err == ("gpushare submit: the pool service is not answering (it may be restarting); "
                   "trying again for up to 60 s\n")
    keys = {r["headers"]["Idempotency-Key"] for r in env.requests}
    assert len(env.requests) == 3 and len(keys) == 1 and None not in keys


def test_reads_are_retried_and_give_up_after_the_retry_time(capsys, env):
    env.routes[("GET", "api/quota")] = restarting(1, (200, {"user": "u", "projects": []}))
    assert run(capsys, "quota", "--json")[0] == 0
    env.routes[("GET", "api/pool")] = restarting(1000, (200, {}))
    code, out, err = run(capsys, "pool", "--retry", "0.5")
    assert code == 1 and "trying again for up to 0.5 s" in err and "not answering" in err
    assert err.count("\n") == 2  # the notice, then the failure


def test_a_cancel_is_not_retried(env):
    env.routes[("DELETE", "api/jobs/j-1")] = restarting(1, (200, {"id": "j-1"}))
    with pytest.raises(PoolUnreachable):
        PoolClient(env.url, TOKEN).cancel("j-1")
    assert len(env.requests) == 1


@pytest.mark.parametrize("status, code", [(409, 2), (400, 2), (500, 1)])
def test_cli_prints_the_server_sentence(capsys, env, status, code):
    env.routes[("POST", "api/jobs")] = (status, {"error": "project vision is at its limit"})
    got, out, err = run(capsys, "submit", "--gpus", "4", "--", "python", "t.py")
    assert (got, out, err) == (code, "", "gpushare submit: project vision is at its limit\n")


def test_a_non_admins_all_is_refused_in_the_clis_words(capsys, env):
    env.routes[("GET", "api/jobs")] = (403, {"error": "only admins can list every job; leave "
                                                     "out all=1 for yours"})
    got, out, err = run(capsys, "jobs", "--all")
    assert (got, out) == (2, "")
    assert err == "gpushare jobs: only admins can list every job; leave out --all to list yours\n"


# -- paths, headers and bodies: the contract of pool/web/openapi.py
# ----------------------------------

def test_each_method_calls_its_path(service):
    job = {"id": "a/1", "state": "pending"}
    service.routes.update({
        ("GET", "api/pool"): (200, {"capacity": 8}), ("GET", "api/quota"): (200, {"user": "u"}),
        ("GET", "api/jobs"): (200, {"jobs": [job]}), ("POST", "api/jobs"): (201, job),
        ("GET", "api/jobs/a%2F1"): (200, job), ("DELETE", "api/jobs/a%2F1"): (200, job),
        ("GET", "api/projects"): (200, {"projects": [{"name": "p"}]}),
        ("PUT", "api/projects/p"): (200, {"name": "p", "quota": 4}),
        ("GET", "api/openapi.json"): (200, {"openapi": "3.0.3"}),
    })
    client = PoolClient(service.url.rstrip("/"), TOKEN)
    assert client.pool() == {"capacity": 8} and client.quota() == {"user": "u"}
    assert client.jobs(project="vision", all=True, state="pending") == [job]
    assert client.submit({"command": ["x"], "gpus": 2}) == job
    assert client.job("a/1") == job and client.cancel("a/1") == job
    assert client.projects() == [{"name": "p"}]
    assert client.update_project("p", quota=4, limit=None) == {"name": "p", "quota": 4}
    assert PoolClient(service.url).openapi() == {"openapi": "3.0.3"}  # needs no token
    seen = [(r["method"], r["path"]) for r in service.requests]
    assert seen == [("GET", "api/pool"), ("GET", "api/quota"), ("GET", "api/jobs"),
                    ("POST", "api/jobs"), ("GET", "api/jobs/a%2F1"), ("DELETE", "api/jobs/a%2F1"),
                    ("GET", "api/projects"), ("PUT", "api/projects/p"), ("GET", "api/openapi.json")]
    assert service.requests[2]["query"] == {"project": ["vision"], "all": ["1"],
                                            "state": ["pending"]}
    assert service.requests[3]["body"] == {"command": ["x"], "gpus": 2}
    assert service.requests[7]["body"] == {"quota": 4, "limit": None}
    assert all(r["headers"]["Authorization"] == f"token {TOKEN}" for r in service.requests[:-1])
    assert "Authorization" not in service.requests[-1]["headers"]


def test_a_whatif_is_started_followed_and_cancelled_at_its_paths(service):
    run = {"id": "w-1/2", "state": "replaying"}
    service.routes.update({
        ("POST", "api/whatif"): (202, run), ("GET", "api/whatif/w-1%2F2"): (200, run),
        ("DELETE", "api/whatif/w-1%2F2"): (200, {**run, "state": "stopped"})})
    client = PoolClient(service.url, TOKEN)
    assert client.start_whatif("30d", capacity="+8") == run and client.whatif("w-1/2") == run
    assert client.cancel_whatif("w-1/2")["state"] == "stopped"
    assert [(r["method"], r["path"]) for r in service.requests] == [
        ("POST", "api/whatif"), ("GET", "api/whatif/w-1%2F2"), ("DELETE", "api/whatif/w-1%2F2")]
    assert service.requests[0]["body"] == {"since": "30d", "capacity": "+8"}


def test_the_admins_console_calls_its_paths_and_says_its_door(service):
    service.routes.update({
        ("GET", "api/audit"): (200, {"entries": [], "next": None}),
        ("PUT", "api/nodes/n%2F0"): (200, {"name": "n/0", "drained": True, "requeued": []}),
    })
    client = PoolClient(service.url, TOKEN, via="cli")
    assert client.audit(since="7d", limit=5, before=9) == {"entries": [], "next": None}
    assert client.set_drained("n/0", True, requeue=True)["drained"]
    client.set_drained("n/0", False)
    assert [(r["method"], r["path"]) for r in service.requests] == [
        ("GET", "api/audit"), ("PUT", "api/nodes/n%2F0"), ("PUT", "api/nodes/n%2F0")]
    assert service.requests[0]["query"] == {"since": ["7d"], "limit": ["5"], "before": ["9"]}
    assert [r["body"] for r in service.requests[1:]] == [{"drained": True, "requeue": True},
                                                         {"drained": False}]
    assert all(r["headers"]["Gpushare-Via"] == "cli" for r in service.requests)
    PoolClient(service.url, TOKEN).audit()  # the API's own callers say no door
    assert "Gpushare-Via" not in service.requests[-1]["headers"]


def test_followed_logs_arrive_as_they_are_sent(service):
    first_read = threading.Event()
    split = "café\n".encode()
    service.routes[("GET", "api/jobs/7/logs")] = chunked(
        "epoch 1\n", split[:4], split[4:], between=lambda: first_read.wait(5))
    chunks = PoolClient(service.url, TOKEN).logs("7", follow=True, attempt=2)
    assert next(chunks) == "epoch 1\n"  # before the server sends more
    first_read.set()
    assert "".join(chunks) == "café\n"  # a character split across chunks is kept whole
    assert service.requests[0]["query"] == {"follow": ["1"], "attempt": ["2"]}


def test_logs_prints_and_follows_a_job(capsys, env):
    env.routes[("GET", "api/jobs/j1")] = (200, {"id": "j1", "state": "succeeded", "attempt": 2})
    env.routes[("GET", "api/jobs/j1/logs")] = chunked("line 1\n", "line 2\n")
    assert run(capsys, "logs", "j1") == (0, "line 1\nline 2\n", "")
    assert run(capsys, "logs", "-f", "j1") == (0, "line 1\nline 2\n", "")
    assert run(capsys, "logs", "--rank", "3", "j1") == (0, "line 1\nline 2\n", "")
    assert run(capsys, "logs", "-f", "--rank", "1", "j1") == (0, "line 1\nline 2\n", "")
    assert [r["query"] for r in env.requests if r["path"].endswith("logs")] == [
        {}, {"attempt": ["2"]}, {"rank": ["3"]}, {"attempt": ["2"], "rank": ["1"]}]


# -- submit --wait and following a job ------------------------------------------------------------

class ScriptedPool(PoolClient):
    """A client whose job goes through given states; ``output[attempt]`` lists what each
    successive read of that attempt's logs returns (a stream may close early)."""

    def __init__(self, states, output):
        super().__init__("http://pool.invalid/", TOKEN)
        self.states, self.output, self.reads = list(states), output, []

    def job(self, job_id):
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def logs(self, job_id, follow=False, attempt=None, rank=None):
        self.reads.append((attempt, follow))
        texts = self.output[attempt]
        return iter(texts.pop(0) if len(texts) > 1 else texts[0])


def _job(state, attempt):
    return {"id": "j", "state": state, "attempt": attempt}


def test_follow_job_across_preemption_writes_each_line_once():
    client = ScriptedPool(
        states=[_job("running", 1), _job("running", 1),
                {**_job("pending", 2), "requeued": "preempted; requeued to resume from its "
                 "checkpoint"}, _job("running", 2), _job("succeeded", 2)],
        output={1: [["a\n", "b\n"], ["a\nb\nc\n"]], 2: [["x\n"], ["x\ny\n"]]})
    out, notes = io.StringIO(), []
    final = follow_job(client, _job("pending", 1), out, note=notes.append, poll_s=0,
                       sleep=lambda s: None)
    # Attempt 1's stream closed early and was reopened: nothing twice, nothing lost.
    assert final["state"] == "succeeded" and out.getvalue() == "a\nb\nc\nx\ny\n"
    assert notes[0].startswith("job j running") and any("pending" in n for n in notes)
    # --wait says so when the job is preempted, not only that it waits again.
    assert "job j preempted; requeued to resume from its checkpoint (attempt 2)" in notes
    assert client.reads[-1] == (2, False)


@pytest.mark.parametrize("final, code, said", [
    ({"state": "succeeded"}, 0, "job j1 succeeded"),
    ({"state": "failed", "exit_code": 3}, 1, "job j1 failed (exit code 3)"),
    ({"state": "cancelled"}, 1, "job j1 cancelled"),
], ids=["succeeded", "failed", "cancelled"])
def test_submit_wait_streams_output_and_exits_with_the_outcome(capsys, env, monkeypatch,
                                                                final, code, said):
    monkeypatch.setattr(cli_pool, "POLL_S", 0.01)
    pending = {"id": "j1", "state": "pending", "gpus": 2, "project": "vision",
               "queue_position": 1, "reason": "waiting for 2 GPUs on one node", "attempt": 1}
    states = [{**pending, "state": "running", "placement": {"node-a": 2}, "reason": "",
               "queue_position": None},
              {**pending, **final, "queue_position": None, "reason": ""}]
    env.routes[("POST", "api/jobs")] = (201, pending)
    env.routes[("GET", "api/jobs/j1")] = lambda handler: _reply(
        handler, states.pop(0) if len(states) > 1 else states[0])
    env.routes[("GET", "api/jobs/j1/logs")] = chunked("step 1\n", "step 2\n")
    got, out, err = run(capsys, "submit", "--wait", "--gpus", "2", "--env", "A=1", "--per-gpu",
                        "--", "python", "t.py")
    assert got == code and out == "step 1\nstep 2\n"
    lines = err.splitlines()
    assert lines[0] == ("job j1 pending (2 GPUs, project vision, position 1): waiting for 2 GPUs "
                        "on one node")
    assert lines[1] == "job j1 running (2 GPUs on node-a, attempt 1)"
    assert lines[-1] == said
    # The job gets the submitting shell's PATH, so `python` is the one this terminal runs.
    assert env.requests[0]["body"] == {"command": ["python", "t.py"], "gpus": 2,
                                       "env": {"A": "1", "PATH": os.environ["PATH"]},
                                       "per_gpu": True}


def _reply(handler, payload):
    data = json.dumps(payload).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def test_submit_jobs_cancel_quota_pool_print_for_people_and_scripts(capsys, env):
    job = {"id": "j2", "state": "pending", "gpus": 1, "project": "nlp", "queue_position": 3,
           "reason": "project nlp is at its limit of 4 GPUs (4 GPUs in use)", "attempt": 0,
           "submitted": 0, "user": "ann", "name": "bert"}
    env.routes.update({
        ("POST", "api/jobs"): (201, job), ("GET", "api/jobs"): (200, {"jobs": [job]}),
        ("DELETE", "api/jobs/j2"): (200, {**job, "state": "cancelled"}),
        ("GET", "api/quota"): (200, {"user": "ann", "jobs": {"running": 2, "pending": 1},
                                     "projects": [{"name": "nlp", "quota": 4, "in_use": 4.25,
                                                   "borrowed": 0.25, "deserved": 4, "limit": None,
                                                   "over_quota_weight": 1, "priority": 0,
                                                   "pending": 1}]}),
        ("GET", "api/pool"): (200, {"capacity": 16, "in_use": 12.5, "simulated": True, "nodes": [
            {"name": "node-a", "gpus": 8, "pool": "train", "labels": {"gpushare.io/simulated":
                                                                      "true"}},
            {"name": "node-b", "gpus": 8, "pool": "train", "labels": {}}]}),
    })
    assert run(capsys, "submit", "--", "python", "t.py")[1] == (
        "job j2 pending (1 GPU, project nlp, position 3): project nlp is at its limit of 4 GPUs "
        "(4 GPUs in use)\n")
    assert json.loads(run(capsys, "submit", "--json", "--", "x")[1]) == job
    assert run(capsys, "jobs", "--project", "nlp")[1].splitlines()[0].split() == [
        "ID", "NAME", "STATE", "GPUS", "PROJECT", "POSITION", "REASON", "ATTEMPT", "AGE"]
    assert json.loads(run(capsys, "jobs", "--json")[1]) == {"jobs": [job]}
    assert run(capsys, "cancel", "j2")[1] == "job j2 cancelled\n"
    # the quota first (what is guaranteed, in use, waiting), the job counts after
    assert run(capsys, "quota")[1].splitlines() == [
        "PROJECT  QUOTA  IN USE  WAITING  BORROWED  DESERVED  LIMIT  WEIGHT  PRIORITY",
        "nlp          4    4.25        1      0.25         4      -       1         0",
        "jobs of ann: 2 running, 1 pending"]
    assert run(capsys, "pool")[1].splitlines() == [
        "12.5 of 16 GPUs in use, 3.5 idle (simulated inventory: no GPUs were found)",
        "NAME    GPUS  POOL   LABELS",
        "node-a     8  train  gpushare.io/simulated=true",
        "node-b     8  train  -"]
    assert json.loads(run(capsys, "pool", "--json")[1])["capacity"] == 16


def test_no_jobs_say_how_to_send_one_and_no_project_what_to_do(capsys, env):
    env.routes.update({("GET", "api/jobs"): (200, {"jobs": []}),
                       ("GET", "api/quota"): (200, {"user": "ann", "jobs": {},
                                                    "projects": []})})
    assert run(capsys, "jobs")[1] == (
        "no jobs yet: send one with %%train in a notebook cell, or gpushare submit --gpus 1 "
        "-- python train.py in a terminal\n")
    assert run(capsys, "jobs", "--state", "failed")[1] == "no jobs match\n"
    assert run(capsys, "quota")[1].splitlines() == [
        "you are in no project; ask an admin to add you to one", "jobs of ann: none yet"]


# -- the jobs table -----------------------------------------------------------------------------

JOBS = [
    {"id": "a1", "name": "resnet-sweep-with-a-very-long-name", "user": "ann", "state": "running",
     "gpus": 4, "project": "vision", "queue_position": None, "reason": "", "attempt": 2,
     "submitted": 1000.0, "preempting": True},
    {"id": "b22", "name": "bert", "user": "bob", "state": "pending", "gpus": 8,
     "project": "nlp", "queue_position": 1,
     "reason": "waiting for 8 GPUs on one node to borrow: this would take project nlp to 12 GPUs, "
               "beyond its quota of 4", "attempt": 0, "submitted": 1000.0 + 86400 * 2 - 7200},
    {"id": "c3", "name": None, "user": "ann", "state": "succeeded", "gpus": 0.25,
     "project": "vision", "attempt": 1, "submitted": 1000.0 + 172800 - 42},
]


def test_jobs_table_aligns_and_cuts_the_reason():
    text = format_jobs(JOBS, now=1000.0 + 172800, width=120)
    lines = text.splitlines()
    header = lines[0]
    assert header.split() == ["ID", "NAME", "USER", "STATE", "GPUS", "PROJECT", "POSITION",
                              "REASON", "ATTEMPT", "AGE"]
    assert max(len(line) for line in lines) == 120
    a1, b22, c3 = (line.split() for line in lines[1:])
    assert a1 == ["a1", "resnet-sweep-with-a-ver…", "ann", "preempting", "4", "vision", "-",
                  "-", "2", "2d"]
    assert b22[:7] == ["b22", "bert", "bob", "pending", "8", "nlp", "1"]
    assert b22[-2:] == ["0", "2h"] and lines[2].split("  0  ")[0].rstrip().endswith("…")
    assert c3 == ["c3", "-", "ann", "succeeded", "0.25", "vision", "-", "-", "1", "42s"]
    # Left columns start together; numbers end together.
    start = header.index("STATE")
    assert {line[start - 2:start] for line in lines} == {"  "}
    end = header.index("GPUS") + len("GPUS")
    assert [line[end - 4:end].strip() for line in lines] == ["GPUS", "4", "8", "0.25"]


def test_jobs_table_of_one_user_has_no_user_column_and_full_reasons_without_width():
    mine = [{**job, "user": "ann"} for job in JOBS]
    text = format_jobs(mine, now=1000.0 + 172800, width=None)
    assert "USER" not in text and JOBS[1]["reason"] in text


def test_slice_asks_the_server_extensions_path(service):
    answer = {"slice": {"gpus": 0.25}, "watchdog": None, "watchdog_off": "off"}
    service.routes[("GET", "api/slice")] = (200, answer)
    assert PoolClient(service.url, TOKEN).slice() == answer
    assert [(r["method"], r["path"]) for r in service.requests] == [("GET", "api/slice")]


def test_the_client_refuses_the_rank_variables_the_server_refuses():
    from jupyter_gpushare.client import parse_env
    from jupyter_gpushare.validate import Invalid, job_spec as server_spec
    from jupyter_gpushare.trainjob import RANK_VARIABLES
    for name in RANK_VARIABLES:
        with pytest.raises(InvalidInput) as client:
            parse_env([f"{name}=1"])
        with pytest.raises(Invalid) as server:
            server_spec({"command": ["x"], "env": {name: "1"}})
        assert str(client.value) == str(server.value) == \
            f"env may not set {name}: the pool sets it for each rank"


# -- names that would command the terminal ------------------------------------------------------

# What a pool member may name a job, and what reaches an admin's terminal through it: the title
# of the window set, then the rows below hidden; a project name that reads backwards.
RETITLE = "\x1b]0;PWNED\x07\x1b[8mhidden"
BACKWARDS = "\u202eevil"
# All a terminal obeys instead of showing, but the newlines between lines.
OBEYED = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                    "\u2066-\u2069]")


def shown_safely(text: str) -> str:
    """``text`` with nothing a terminal obeys, and the hostile names in it as escapes."""
    assert not OBEYED.search(text), repr(text)
    return text


def test_names_from_the_pool_reach_the_terminal_escaped(capsys, env):
    job = {"id": "j1", "state": "pending", "gpus": 1, "project": BACKWARDS, "queue_position": 1,
           "reason": "waits\x9b31m for\rGPUs\u2066", "attempt": 0, "submitted": 0,
           "user": "ann\x1b[2J", "name": RETITLE}
    other = {**job, "id": "j2", "user": "bob", "name": "plain"}
    entry = {"at": 0, "who": RETITLE, "action": "cancel", "target": BACKWARDS,
             "before": {"state": RETITLE}, "after": {"state": "cancelled"}, "via": "api\x7f"}
    usage = {"by": "user", "rows": [{"user": RETITLE, "allocated_gpu_seconds": 3600,
                                     "allocation": 0.5, "utilization": 0.25, "idle_ratio": 0.1}]}
    env.routes.update({
        ("POST", "api/jobs"): (201, job), ("GET", "api/jobs"): (200, {"jobs": [job, other]}),
        ("DELETE", "api/jobs/j1"): (200, {**job, "id": RETITLE, "state": "cancelled"}),
        ("DELETE", "api/jobs/j9"): (404, {"error": f"no job {RETITLE} here"}),
        ("GET", "api/quota"): (200, {"user": RETITLE, "jobs": {"pending": 1}, "projects": [
            {"name": BACKWARDS, "quota": 4, "in_use": 1, "department": RETITLE}],
            "departments": [{"name": RETITLE, "quota": 4, "projects": [BACKWARDS]}]}),
        ("GET", "api/pool"): (200, {"capacity": 8, "in_use": 1, "build": {"lent": [
            {"gpu": 0, "node": RETITLE, "job": BACKWARDS}]}, "nodes": [
            {"name": RETITLE, "gpus": 8, "pool": "train", RETITLE: BACKWARDS}]}),
        ("GET", "api/usage"): (200, usage),
        ("GET", "api/audit"): (200, {"entries": [entry]}),
        ("PUT", "api/nodes/n1"): (200, {"name": RETITLE, "requeued": [BACKWARDS]}),
    })
    said = {}
    for argv in (["jobs", "--all"], ["submit", "--", "x"], ["cancel", "j1"], ["cancel", "j9"],
                 ["quota"], ["pool"], ["usage", "--by", "user"],
                 ["usage", "--by", "user", "--step", "day", "--since", "2026-10-01", "--until",
                  "2026-10-02"], ["audit"], ["drain", "n1"]):
        code, out, err = run(capsys, *argv)
        said[argv[0] + (" --step" if "--step" in argv else "")] = shown_safely(out + err)
    # Still there to read, and the table still lines up.
    table = said["jobs"].splitlines()
    assert "\\x1b]0;PWNED\\x07\\x1b[8m…" in table[1] and "\\u202eevil" in table[1]
    assert "ann\\x1b[2J" in table[1] and "waits\\x9b31m for GPUs" in table[1]
    assert table[0].index("STATE") == table[1].index("pending") == table[2].index("pending")
    assert "project \\u202eevil" in said["submit"]
    assert run(capsys, "cancel", "j1")[1] == "job \\x1b]0;PWNED\\x07\\x1b[8mhidden cancelled\n"
    assert said["cancel"] == "gpushare cancel: no job \\x1b]0;PWNED\\x07\\x1b[8mhidden here\n"
    assert "jobs of \\x1b]0;PWNED\\x07\\x1b[8mhidden: 1 pending" in said["quota"]
    assert "GPU 0 of \\x1b]0;PWNED\\x07\\x1b[8mhidden: lent to job \\u202eevil" in said["pool"]
    assert "\\x1b]0;PWNED\\x07\\x1b[8mhidden" in said["usage"].splitlines()[1]
    assert "\\x1b]0;PWNED\\x07\\x1b[8mhidden" in said["usage --step"].splitlines()[1]
    assert "api\\x7f" in said["audit"] and "state=\\x1b]0;PWNED" in said["audit"]
    assert "requeued: \\u202eevil" in said["drain"]


def test_json_for_scripts_escapes_what_a_terminal_obeys(capsys, env):
    job = {"id": "j1", "state": "pending", "name": RETITLE + BACKWARDS + "\x9b\x7f"}
    env.routes[("GET", "api/jobs")] = (200, {"jobs": [job]})
    out = shown_safely(run(capsys, "jobs", "--json")[1])
    assert json.loads(out) == {"jobs": [job]}


def test_a_followed_jobs_state_lines_are_escaped_and_its_own_output_is_not(capsys, env):
    """State lines carry the service's words; the output is the job's own program's (its
    colours kept), which only its owner or an admin reads."""
    running = {"id": "j1", "state": "running", "gpus": 1, "attempt": 1,
               "placement": {RETITLE: [0]}, "reason": BACKWARDS}
    env.routes.update({
        ("POST", "api/jobs"): (201, {**running, "state": "pending", "project": BACKWARDS}),
        ("GET", "api/jobs/j1"): (200, {**running, "state": "succeeded", "reason": RETITLE}),
        ("GET", "api/jobs/j1/logs"): (200, b"\x1b[32mok\x1b[0m\n", {"Content-Type": "text/plain"}),
    })
    code, out, err = run(capsys, "submit", "--wait", "--", "x")
    assert code == 0 and out == "\x1b[32mok\x1b[0m\n"
    err = shown_safely(err)
    assert "project \\u202eevil" in err and "succeeded: \\x1b]0;PWNED\\x07" in err


def test_a_whatif_names_the_pools_projects_escaped(capsys, env):
    entry = {"job_id": "j1", "submit_time": 0, "duration": 60, "gpus": 1, "project": BACKWARDS,
             "user": RETITLE, "priority": 0, "kind": "train", "submitted": 1000.0,
             "held_s": 60, "queued_s": 0, "first_start_s": 0.1, "end_s": 60.1, "attempts": 1,
             "state": "succeeded", "utilization": None}
    env.routes.update({
        ("GET", "api/history"): (200, {"since": 1000.0, "until": 2000.0, "jobs": [entry],
                                       "settings": {}, "next": None}),
        ("GET", "api/pool"): (200, {"nodes": [{"name": RETITLE, "gpus": 8, "pool": "train"}]}),
        ("GET", "api/projects"): (200, {"projects": [{"name": BACKWARDS, "quota": 8}]}),
    })
    code, out, err = run(capsys, "simulate", "--from-pool", "--capacity", "+8")
    assert code == 0, err
    assert "project \\u202eevil (quota 8 → 8 GPUs)" in shown_safely(out)


@pytest.mark.parametrize("reader, tty, shown", [
    ("admin", True, "\\x1b]52;c;cHduZWQ=\\x07\\x1b[8mhidden\n"),  # another user's log: escaped
    ("alice", True, "\x1b]52;c;cHduZWQ=\x07\x1b[8mhidden\n"),  # her own: as it was written
    ("admin", False, "\x1b]52;c;cHduZWQ=\x07\x1b[8mhidden\n"),  # into a file: as written
])
def test_another_users_log_reaches_a_terminal_escaped(capsys, env, monkeypatch, reader, tty,
                                                      shown):
    """An admin reading a hostile user's log on a terminal: the log cannot write the admin's
    clipboard (OSC 52), retitle the terminal or hide what follows."""
    log = b"\x1b]52;c;cHduZWQ=\x07\x1b[8mhidden\n"
    env.routes.update({
        ("GET", "api/jobs/j1"): (200, {"id": "j1", "user": "alice", "state": "succeeded",
                                       "attempt": 1}),
        ("GET", "api/quota"): (200, {"user": reader, "admin": reader == "admin",
                                     "projects": [], "jobs": {}}),
        ("GET", "api/jobs/j1/logs"): (200, log, {"Content-Type": "text/plain"}),
    })
    monkeypatch.setattr(sys.stdout, "isatty", lambda: tty, raising=False)
    code, out, err = run(capsys, "logs", "j1")
    assert code == 0, err
    assert out == shown
