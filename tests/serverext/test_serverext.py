"""The jupyter_server extension in a real jupyter_server (pytest-jupyter), forwarding to the
real pool service behind a real JupyterHub and proxy: every route, the pool's refusals passed
through, a pool that is down, authentication on every handler, XSRF with cookie login, and the
slice watchdog's report, as the %gpushare panel shows it."""

import asyncio
import json
import logging
import os
import re
import time
import warnings

import pytest
from jupyter_server.auth import Authorizer
from jupyter_server.serverapp import JupyterServerAuthWarning
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from hubtest import free_port, running_hub
from jupyter_gpushare.client import PoolClient
from jupyter_gpushare.gpus import SimulatedInventory
from jupyter_gpushare.notebook import serverext
from jupyter_gpushare.notebook.panel import Panel

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 2, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.PoolService.build_nodes = {"sim-build-0": 1}
"""

GiB = 2**30


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("hub"), {"vision": ["alice"], "nlp": ["bob"]},
                     POOL_CONFIG) as hub:
        yield hub


@pytest.fixture
def extension_config(hub):
    return {"pool_url": hub.pool_url, "watchdog_interval": 0}


@pytest.fixture
def server_environment(hub, extension_config, monkeypatch):
    """What the hub gives a server: its token in the environment (not in the configuration,
    which jupyter_server logs at debug level)."""
    for name in ("GPUSHARE_URL", "GPUSHARE_SLICE_GPUS", "GPUSHARE_SLICE_UUID", "GPUSHARE_SLICE_MODE"):
        monkeypatch.delenv(name, raising=False)
    if "pool_token" in extension_config:
        monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    else:
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.token("alice"))


class ReadOnlyAuthorizer(Authorizer):
    """A server shared read-only (jupyter_server's resource-based authorization): whoever
    it lets in may read, nothing more."""

    def is_authorized(self, handler, user, action, resource):
        return action == "read"


@pytest.fixture
def authorizer():
    return None  # jupyter_server's default: an authenticated user may do everything


@pytest.fixture
def jp_server_config(extension_config, server_environment, authorizer):
    app = {"jpserver_extensions": {"jupyter_gpushare": True},
           "allow_unauthenticated_access": False}
    if authorizer is not None:
        app["authorizer_class"] = authorizer
    return {"ServerApp": app, "GPUShareExtension": extension_config}


@pytest.fixture
def call(jp_fetch, hub):
    """(status, JSON or text) of a request to the extension; never raises for a status, and
    checks that no answer carries the hub token."""
    token = hub.token("alice").encode()

    async def call(method, path, body=None, **kwargs):
        kwargs.setdefault("raise_error", False)
        if body is not None:
            kwargs["body"] = body if isinstance(body, (str, bytes)) else json.dumps(body)
        response = await jp_fetch("gpushare", *path.split("/"), method=method,
                                  allow_nonstandard_methods=True, **kwargs)
        assert token not in response.body and token not in str(response.headers).encode()
        try:
            return response.code, json.loads(response.body)
        except ValueError:
            return response.code, response.body.decode()
    return call


def without_volatile(obj):
    """The pool's answers with the fields that change between two reads taken out."""
    if isinstance(obj, dict):
        return {k: without_volatile(v) for k, v in obj.items()
                if k not in ("reason", "queue_position", "in_use", "borrowed", "deserved",
                             "pending", "jobs")}
    if isinstance(obj, list):
        return [without_volatile(v) for v in obj]
    return obj


def submit(hub, user, **spec):
    status, job = hub.api("POST", "api/jobs", user, spec)
    assert status == 201, job
    return job


async def wait_state(call, job_id, states, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, job = await call("GET", f"api/jobs/{job_id}")
        if status == 200 and job["state"] in states:
            return job
        await asyncio.sleep(0.2)
    raise TimeoutError(f"job {job_id} did not reach {states}")


# -- every route forwards ----------------------------------------------------------------------

async def test_read_routes_answer_what_the_pool_answers(hub, call):
    for path in ("api/pool", "api/quota", "api/projects", "api/jobs"):
        status, mine = await call("GET", path)
        _, pools = hub.api("GET", path, "alice")
        assert status == 200 and without_volatile(mine) == without_volatile(pools), path
    status, quota = await call("GET", "api/quota")
    assert quota["user"] == "alice" and [p["name"] for p in quota["projects"]] == ["vision"]


async def test_submit_read_list_cancel_a_job(hub, call):
    status, job = await call("POST", "api/jobs", {"source": "import time; time.sleep(60)",
                                                  "gpus": 1, "name": "from-lab"})
    assert status == 201 and job["user"] == "alice" and job["project"] == "vision"
    _, in_pool = hub.api("GET", f"api/jobs/{job['id']}", "alice")
    assert in_pool["name"] == "from-lab"
    status, listed = await call("GET", "api/jobs", params={"limit": "5"})
    assert status == 200 and job["id"] in [j["id"] for j in listed["jobs"]]
    assert (await wait_state(call, job["id"], ("running",)))["gpus"] == 1
    status, cancelled = await call("DELETE", f"api/jobs/{job['id']}")
    assert status == 200 and cancelled["id"] == job["id"]
    hub.wait_job("alice", job["id"], ("cancelled",))
    # the pool's refusal comes back with its status and sentence
    status, again = await call("DELETE", f"api/jobs/{job['id']}")
    assert (status, again["error"]) == (409, f"job {job['id']} has already ended (cancelled)")


async def test_polling_is_no_activity_but_submitting_and_cancelling_are(hub, call,
                                                                      jp_serverapp):
    """The panels poll every few seconds; that must not keep an idle server from culling."""
    settings = jp_serverapp.web_app.settings
    settings.pop("api_last_activity", None)
    for path in ("api/pool", "api/quota", "api/jobs", "api/projects", "api/slice"):
        assert (await call("GET", path))[0] == 200, path
    assert "api_last_activity" not in settings
    status, job = await call("POST", "api/jobs", {"source": "import time; time.sleep(60)",
                                                  "gpus": 1})
    assert status == 201 and settings.pop("api_last_activity")
    status, _ = await call("DELETE", f"api/jobs/{job['id']}")
    assert status == 200 and settings.pop("api_last_activity")


async def test_logs_read_and_followed_as_they_are_printed(hub, call, jp_fetch):
    job = submit(hub, "alice", gpus=1, source=(
        "import time\nfor i in range(3):\n    print('line', i, flush=True)\n    time.sleep(1)\n"))
    arrivals = []
    response = await jp_fetch("gpushare", "api", "jobs", job["id"], "logs",
                              params={"follow": "1"}, request_timeout=60,
                              streaming_callback=lambda chunk: arrivals.append(
                                  (time.monotonic(), chunk)))
    assert response.code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    text = b"".join(chunk for _, chunk in arrivals).decode()
    assert text == "line 0\nline 1\nline 2\n"
    # streamed, not collected: the first line came about two seconds before the last
    first = next(t for t, c in arrivals if b"line 0" in c)
    last = next(t for t, c in arrivals if b"line 2" in c)
    assert last - first > 1.5
    status, whole = await call("GET", f"api/jobs/{job['id']}/logs")
    assert (status, whole) == (200, text)
    status, refused = await call("GET", f"api/jobs/{job['id']}/logs", params={"attempt": "7"})
    assert (status, refused["error"]) == (400, f"job {job['id']} has attempts 1 to 1")


async def test_each_ranks_log_through_the_server(hub, call):
    status, job = await call("POST", "api/jobs", {
        "gpus": 2, "per_gpu": True, "source": "import os\nprint('rank', os.environ['RANK'])\n"})
    assert status == 201 and job["per_gpu"] is True, job
    hub.wait_job("alice", job["id"], ("succeeded",))
    for rank in (0, 1):
        status, text = await call("GET", f"api/jobs/{job['id']}/logs", params={"rank": str(rank)})
        assert (status, text) == (200, f"rank {rank}\n")
    status, refused = await call("GET", f"api/jobs/{job['id']}/logs", params={"rank": "5"})
    assert (status, refused["error"]) == (400, f"attempt 1 of job {job['id']} has ranks 0 to 1, "
                                               f"not 5")


@pytest.mark.parametrize("method, path, body, status, error", [
    ("GET", "api/jobs/nope", None, 404, "there is no job nope"),
    ("GET", "api/jobs/nope/logs", None, 404, "there is no job nope"),
    ("GET", "api/jobs", None, 400, "state must be one of pending, running, succeeded, failed, "
                                   "cancelled, not 'sleeping'"),
    ("POST", "api/jobs", {"gpus": 0, "source": "print(1)"}, 400, None),
    ("POST", "api/jobs", {"gpus": 1, "source": "1", "project": "nlp"}, 403,
     "you are not a member of project nlp"),
    ("POST", "api/jobs", "{not json", 400, None),
])
async def test_the_pools_refusals_pass_through(hub, call, method, path, body, status, error):
    params = {"state": "sleeping"} if path == "api/jobs" and method == "GET" else None
    got, answer = await call(method, path, body, params=params)
    assert got == status and "\n" not in answer["error"] and answer["message"] == answer["error"]
    if error:
        assert answer["error"] == error
    _, jobs = hub.api("GET", "api/jobs?state=pending", "alice")
    assert jobs["jobs"] == []  # nothing was submitted


async def test_an_admin_only_route_is_refused_for_the_servers_owner(call):
    status, answer = await call("GET", "api/jobs", params={"all": "1"})
    assert (status, answer["error"]) == (403, "only admins can list every job; leave out all=1 "
                                              "for yours")


# -- a pool that cannot be reached -------------------------------------------------------------

@pytest.mark.parametrize("extension_config, status, words", [
    ({"pool_url": f"http://127.0.0.1:{free_port()}/services/gpushare/", "pool_token": "t0ken",
      "retry_timeout": 0}, 502, "cannot be reached (connection refused)"),
    ({"pool_url": "", "pool_token": "t0ken"}, 503,
     "this notebook server cannot reach the pool: no pool service address: set GPUSHARE_URL "
     "(e.g. http://127.0.0.1:8000/services/gpushare/) or pass c.GPUShareExtension.pool_url"),
    ({"pool_url": "http://127.0.0.1:1/", "pool_token": ""}, 503,
     "pass c.GPUShareExtension.pool_token"),
])
async def test_pool_down_or_not_configured_is_one_sentence(call, monkeypatch, status, words):
    for path in ("api/pool", "api/quota", "api/jobs", "api/jobs/j-1", "api/projects"):
        got, answer = await call("GET", path)
        assert got == status and words in answer["error"] and "\n" not in answer["error"]
        assert "t0ken" not in answer["error"]


async def test_a_retried_submit_with_the_browsers_key_makes_one_job(hub, call):
    spec = {"command": ["true"], "gpus": 1, "name": "retried"}
    headers = {"Idempotency-Key": "lab-7f3e"}
    status, first = await call("POST", "api/jobs", spec, headers=headers)
    status2, again = await call("POST", "api/jobs", spec, headers=headers)
    assert status == status2 == 201 and first["id"] == again["id"]
    assert again["request_id"] == "lab-7f3e"
    _, mine = hub.api("GET", "api/jobs", "alice")
    assert [j["id"] for j in mine["jobs"] if j["name"] == "retried"] == [first["id"]]
    status, third = await call("POST", "api/jobs", spec)  # no key: the extension makes one
    assert status == 201 and third["id"] != first["id"] and third["request_id"]


# -- authentication and XSRF -------------------------------------------------------------------

def gpushare_rules(app):
    rules = []
    for rule in app.web_app.default_router.rules:
        for inner in getattr(rule.target, "rules", [rule]):
            pattern = getattr(inner.matcher, "regex", None)
            if pattern is not None and "/gpushare/" in pattern.pattern:
                rules.append((pattern.pattern, inner.target))
    return rules


async def test_every_handler_is_authenticated(jp_serverapp, call):
    rules = gpushare_rules(jp_serverapp)
    assert {p.split("/gpushare/")[1].rstrip("$") for p, _ in rules} == \
        {"api/" + p.split("api/")[1] for p, _ in serverext.HANDLERS}
    for pattern, handler in rules:
        assert jp_serverapp.web_app._check_handler_auth(pattern, handler) == []
    # and in practice: each method of each route, without a token
    for pattern, handler in rules:
        path = pattern.split("/gpushare/")[1].rstrip("$").replace("([^/]+)", "j-1")
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH"):
            implemented = getattr(handler, method.lower()) is not \
                getattr(serverext.GPUShareHandler, method.lower())
            if implemented:
                status, _ = await call(method, path, {} if method in ("POST", "PUT") else None,
                                       headers={"Authorization": ""})
                assert status == 403, (method, path)


@pytest.mark.parametrize("authorizer", [ReadOnlyAuthorizer])
async def test_a_read_only_authorizer_lets_read_but_not_submit_or_cancel(hub, call):
    job = submit(hub, "alice", gpus=1, source="import time; time.sleep(60)")
    before = len(hub.api("GET", "api/jobs?limit=1000", "alice")[1]["jobs"])
    for path in ("api/pool", "api/quota", "api/projects", "api/jobs", "api/slice",
                 f"api/jobs/{job['id']}", f"api/jobs/{job['id']}/logs"):
        assert (await call("GET", path))[0] == 200, path
    status, answer = await call("POST", "api/jobs", {"source": "print('as alice')", "gpus": 1})
    assert status == 403 and "runs code as this server's owner" in answer["error"], answer
    assert len(hub.api("GET", "api/jobs?limit=1000", "alice")[1]["jobs"]) == before
    status, answer = await call("DELETE", f"api/jobs/{job['id']}")
    assert status == 403 and "you may only read here" in answer["error"], answer
    assert hub.api("GET", f"api/jobs/{job['id']}", "alice")[1]["state"] in ("pending", "running")
    hub.api("DELETE", f"api/jobs/{job['id']}", "alice")


def test_every_handler_method_is_authorized():
    """Each method of each route checks the Authorizer (jupyter_server's @authorized)."""
    for _, handler in serverext.HANDLERS:
        for method in ("get", "post", "put", "delete", "patch"):
            function = getattr(handler, method)
            if function is getattr(serverext.GPUShareHandler, method):
                continue
            layers = []
            while function is not None:
                layers.append(function.__code__.co_qualname)
                function = getattr(function, "__wrapped__", None)
            assert any(q.startswith("authorized.") for q in layers), (handler, method, layers)
    assert serverext.GPUShareHandler.auth_resource == "gpushare"


def test_an_unauthenticated_handler_would_be_caught(jp_serverapp):
    class Careless(serverext.GPUShareHandler):
        def get(self):
            self.reply({})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jp_serverapp.web_app.add_handlers(".*$", [("/gpushare/api/careless", Careless)])
    assert [w for w in caught if issubclass(w.category, JupyterServerAuthWarning)]
    assert jp_serverapp.web_app._check_handler_auth("x", Careless) != []


async def test_cookie_login_needs_the_xsrf_token_for_post(hub, jp_serverapp, jp_base_url, http_server,
                                                          http_server_port):
    base = f"http://127.0.0.1:{http_server_port[-1]}{jp_base_url}"
    client = AsyncHTTPClient()
    login = await client.fetch(f"{base}api/status?token={jp_serverapp.identity_provider.token}")
    cookies = dict(re.match(r"([^=]+)=([^;]*)", c).groups()
                   for c in login.headers.get_list("Set-Cookie"))
    login_cookie = next(k for k in cookies if k.startswith("username-"))
    # the browser's session alone reads ...
    session = f"{login_cookie}={cookies[login_cookie]}"
    response = await client.fetch(f"{base}gpushare/api/quota", headers={"Cookie": session})
    assert json.loads(response.body)["user"] == "alice"
    # ... but may not submit without the _xsrf token
    body = json.dumps({"gpus": 1, "source": "print('xsrf')"})
    with pytest.raises(HTTPClientError) as refused:
        await client.fetch(f"{base}gpushare/api/jobs", method="POST", body=body,
                           headers={"Cookie": session})
    assert refused.value.code == 403 and b"_xsrf" in refused.value.response.body
    _, jobs = hub.api("GET", "api/jobs", "alice")
    assert "print('xsrf')" not in json.dumps(jobs)
    # the _xsrf cookie, as the browser gets it with any page of the server
    page = await client.fetch(f"{base}login", follow_redirects=False, raise_error=False)
    xsrf = next(re.match(r"_xsrf=([^;]*)", c).group(1) for c in page.headers.get_list("Set-Cookie")
                if c.startswith("_xsrf="))
    response = await client.fetch(f"{base}gpushare/api/jobs", method="POST", body=body,
                                  headers={"Cookie": f"{session}; _xsrf={xsrf}",
                                           "X-XSRFToken": xsrf})
    assert response.code == 201
    job = json.loads(response.body)
    hub.wait_job("alice", job["id"], ("succeeded",))


# -- the build slice and its watchdog -----------------------------------------------------------

async def test_a_server_without_a_slice_says_so(call):
    status, answer = await call("GET", "api/slice")
    assert status == 200 and answer == {"slice": None, "watchdog": None,
                                        "watchdog_off": serverext.NO_SLICE, "interval": 0,
                                        "pool": None}


@pytest.fixture
def gpu_inventory():
    return SimulatedInventory("sim-build-0", 2, memory_total=16 * GiB)


@pytest.fixture
def slice_uuid(gpu_inventory):
    return gpu_inventory.gpus()[1].uuid


@pytest.fixture
def sliced(monkeypatch, gpu_inventory, extension_config, slice_uuid, server_environment):
    """The environment the spawner sets, before the server starts."""
    monkeypatch.setenv("GPUSHARE_SLICE_GPUS", "0.25")
    monkeypatch.setenv("GPUSHARE_SLICE_UUID", slice_uuid)
    monkeypatch.setenv("GPUSHARE_SLICE_MODE", "pinned")
    extension_config.update(watchdog_interval=0.1, inventory=gpu_inventory)


async def test_the_watchdog_reports_the_servers_memory_over_its_slice(
        sliced, hub, jp_serverapp, call, http_server_port, jp_base_url):
    gpu_inventory = jp_serverapp.web_app.settings["gpushare"].inventory  # config is copied
    warnings_seen = []
    handler = logging.Handler()
    handler.emit = lambda record: warnings_seen.append(record.getMessage()) \
        if record.levelno >= logging.WARNING else None
    jp_serverapp.web_app.settings["gpushare"].log.addHandler(handler)
    uuid = gpu_inventory.gpus()[1].uuid
    await jp_serverapp.extension_manager.start_all_extensions()  # as the server does once up

    async def report(over):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, answer = await call("GET", "api/slice")
            if answer["watchdog"] and answer["watchdog"]["over"] is over:
                return answer
            await asyncio.sleep(0.05)
        raise TimeoutError(f"the watchdog never reported over={over}")

    # this test process is the server: its memory counts
    gpu_inventory.set_process_memory(uuid, os.getpid(), 1 * GiB)
    answer = await report(False)
    assert answer["slice"] == {"gpus": 0.25, "uuid": uuid, "mode": "pinned", "label": "¼ GPU"}
    assert answer["watchdog"]["limit"] == 4 * GiB and answer["watchdog_off"] is None
    gpu_inventory.set_process_memory(uuid, os.getpid(), 5 * GiB)
    answer = await report(True)
    assert answer["watchdog"]["message"].startswith("This server's processes use 5.0 GiB of "
                                                    "GPU memory, more than the slice's 4.0 GiB")
    await asyncio.sleep(0.4)  # several more samples, still over: warned once
    # the panel asks the extension (PoolClient.slice) and shows the warning
    server = PoolClient(f"http://127.0.0.1:{http_server_port[-1]}{jp_base_url}gpushare/",
                        jp_serverapp.identity_provider.token)
    panel = Panel(client=PoolClient(hub.pool_url, hub.token("alice")), server=server)
    assert await asyncio.to_thread(panel.refresh)
    assert panel.slice_line.value.startswith(
        f'<div style="color:var(--jp-error-color1, #c62828)">Build slice: ¼ GPU of {uuid}. '
        f'This server&#x27;s processes use 5.0 GiB of GPU memory, more than the slice&#x27;s '
        f'4.0 GiB')
    assert ('width:100.0%;height:100%;background:var(--jp-error-color1, #c62828)'
            in panel.slice_line.value)
    panel.close()
    gpu_inventory.set_process_memory(uuid, os.getpid(), GiB)
    await report(False)
    assert warnings_seen == [answer["watchdog"]["message"]]
    jp_serverapp.web_app.settings["gpushare"].log.removeHandler(handler)


@pytest.mark.parametrize("slice_uuid", ["GPU-not-here"])
async def test_the_watchdog_turns_off_when_it_cannot_sample(sliced, jp_serverapp, call):
    await jp_serverapp.extension_manager.start_all_extensions()
    deadline = time.monotonic() + 10
    while True:
        _, answer = await call("GET", "api/slice")
        if answer["watchdog_off"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert answer["watchdog_off"] == ("The slice watchdog cannot check this server's GPU memory: "
                                      "the slice's GPU GPU-not-here is not among the 2 GPUs NVML "
                                      "lists here.")


@pytest.fixture
def whole_gpus(monkeypatch, server_environment):
    monkeypatch.setenv("GPUSHARE_SLICE_GPUS", "2")
    monkeypatch.setenv("GPUSHARE_SLICE_UUID", "GPU-a,GPU-b")
    monkeypatch.setenv("GPUSHARE_SLICE_MODE", "exclusive")


async def test_a_server_with_whole_gpus_has_nothing_to_watch(whole_gpus, call):
    status, answer = await call("GET", "api/slice")
    assert answer["slice"] == {"gpus": 2.0, "uuid": "GPU-a,GPU-b", "mode": "exclusive",
                               "label": "2 GPUs"}
    assert answer["watchdog"] is None and answer["watchdog_off"] == \
        "This server holds 2 GPUs whole, so there is no slice to overrun."


async def test_the_pools_record_of_the_slice_comes_with_it(sliced, hub, monkeypatch, call):
    """Its GPU use and the culling warning, as the panels show them; the slice of this
    server (user and server name from the hub's environment), no other."""
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "exp")
    status, answer = await call("GET", "api/slice")
    assert status == 200 and answer["pool"] is None  # the pool holds none for it
    slices = [hub.api("POST", "api/slices", "admin", {"user": user, "gpus": 0.25,
                                                      "server": server})[1]
              for user, server in (("alice", "exp"), ("alice", ""), ("bob", "exp"))]
    try:
        deadline = time.monotonic() + 15
        while True:  # the stand-in plays the build GPU: the slice is read within 5 s
            status, answer = await call("GET", "api/slice")
            if (answer["pool"] or {}).get("usage") or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert answer["pool"]["id"] == slices[0]["id"] and answer["pool"]["gpus"] == 0.25
        assert answer["pool"]["cull"] is None and answer["pool"]["usage"]["sm_now"] == 0
        assert answer["slice"]["gpus"] == 0.25  # the spawner's environment, as before
    finally:
        for s in slices:
            hub.api("DELETE", f"api/slices/{s['id']}", "admin")


# -- followed logs hold a thread each: bounded ----------------------------------------------------

@pytest.fixture
def one_follower(extension_config):
    extension_config["max_log_followers"] = 1


async def test_followed_logs_are_bounded_and_freed_when_the_attempt_ends(
        one_follower, hub, call, jp_fetch, jp_serverapp):
    job = submit(hub, "alice", gpus=1, source="import time; print('up', flush=True); "
                                              "time.sleep(60)")
    first = asyncio.ensure_future(jp_fetch("gpushare", "api", "jobs", job["id"], "logs",
                                           params={"follow": "1"}, request_timeout=60))
    deadline = time.monotonic() + 10
    ext = jp_serverapp.web_app.settings["gpushare"]
    while ext.following == 0:  # until the first stream holds the only place
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    status, refused = await call("GET", f"api/jobs/{job['id']}/logs", params={"follow": "1"})
    assert (status, refused["error"]) == (503, "this server already follows 1 logs; close some, "
                                               "or read the log without follow")
    while "up" not in hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")[1]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    hub.api("DELETE", f"api/jobs/{job['id']}", "alice")
    response = await first
    assert response.code == 200 and response.body.startswith(b"up\n")
    while ext.following:  # the thread gives its place back
        assert time.monotonic() < deadline + 10
        await asyncio.sleep(0.05)
