"""Departments in a real JupyterHub (issue 22, part 1): ``PoolService.departments``, the API
(``api/departments``, a project's ``department``), who may change them, the sentences for
what cannot be, the audit trail, and a sibling project borrowing before another department,
on the local backend with two simulated nodes of two GPUs."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubtest import refused_at_start, running_hub

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 1, "groups": ["vision"]},
                          "nlp": {"quota": 1, "groups": ["nlp"]},
                          "ops": {"quota": 2, "groups": ["ops"], "over_quota_weight": 3},
                          "spare": {"quota": 0}}
c.PoolService.departments = {"research": {"quota": 2, "projects": ["vision", "nlp"]},
                             "operations": {"quota": 2, "limit": 4, "projects": ["ops"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 3
c.PoolService.min_runtime = 0
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 2
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""

GROUPS = {"vision": ["alice"], "nlp": ["bob"], "ops": ["carol"]}
SLEEP = "import time; time.sleep(120)"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("departmentshub"), GROUPS, POOL_CONFIG,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub


def gpushare(hub, user, *args):
    env = {**os.environ, "GPUSHARE_URL": hub.pool_url, "JUPYTERHUB_API_TOKEN": hub.token(user)}
    exe = Path(sys.executable).with_name("gpushare")
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60)


def until(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError("it did not happen in time")


def test_everyone_sees_both_levels(hub):
    status, answer = hub.api("GET", "api/departments", "alice")
    assert status == 200, answer
    research = next(d for d in answer["departments"] if d["name"] == "research")
    assert (research["quota"], research["limit"], research["projects"]) == \
        (2, None, ["nlp", "vision"])
    status, projects = hub.api("GET", "api/projects", "bob")
    home = {p["name"]: p["department"] for p in projects["projects"]}
    assert home == {"vision": "research", "nlp": "research", "ops": "operations", "spare": None}
    status, quota = hub.api("GET", "api/quota", "alice")
    assert [(p["name"], p["department"]) for p in quota["projects"]] == [("vision", "research")]
    assert [d["name"] for d in quota["departments"]] == ["research"]
    shown = gpushare(hub, "alice", "quota")
    assert shown.returncode == 0, shown.stderr
    lines = [line.split() for line in shown.stdout.splitlines()]
    assert lines[0][-1] == "DEPARTMENT" and lines[1][0] == "vision" and lines[1][-1] == "research"
    assert lines[2][0] == "DEPARTMENT" and lines[2][-1] == "PROJECTS"
    assert lines[3][0] == "research" and lines[3][1] == "2" and lines[3][-2:] == ["nlp,", "vision"]
    status, one = hub.api("GET", "api/departments/operations", "carol")
    assert status == 200 and one["limit"] == 4
    assert hub.api("GET", "api/departments/nowhere", "carol")[0] == 404


@pytest.mark.parametrize("method, body", [("PUT", {"quota": 3}), ("DELETE", None)])
def test_only_admins_change_departments(hub, method, body):
    for user in ("alice", "carol"):  # a member of it, and of another
        status, answer = hub.api(method, "api/departments/research", user, body)
        assert status == 403, answer
    assert hub.api("GET", "api/departments/research", "alice")[1]["quota"] == 2


@pytest.mark.parametrize("name, body, status, sentence", [
    ("research", {"quota": 1}, 409, "the quotas of department research's projects add up to 2 "
     "GPUs, more than its quota of 1 GPU; raise the department's quota or lower its projects'"),
    ("research", {"projects": ["vision", "ops"]}, 409, "project ops belongs to department "
     "operations; take it out of operations first (a project belongs to at most one "
     "department)"),
    ("research", {"projects": ["ghost"]}, 409, "project ghost does not exist; create it first "
     "(PUT api/projects/ghost)"),
    ("research", {"quota": 4}, 409, "the quotas add up to 6 GPUs but the train pool has 4; a "
     "guarantee that cannot be honoured is refused: lower another department's or project's "
     "quota first"),
    ("research", {"quota": 2, "limit": 1}, 400, "limit (1 GPUs) may not be below the quota (2 "
     "GPUs); raise the limit or lower the quota"),
    ("research", {"owner": "x"}, 400, "unknown field(s) owner; the fields are limit, "
     "over_quota_weight, projects, quota"),
    ("a b", {"quota": 0}, 400, "department name 'a b' must be 1-100 letters, digits, '.', '_' "
     "or '-'"),
    ("research", [], 400, "the body must be a JSON object with one or more of limit, "
     "over_quota_weight, projects, quota"),
])
def test_bad_departments_get_a_sentence_and_change_nothing(hub, name, body, status, sentence):
    from urllib.parse import quote

    got, answer = hub.api("PUT", f"api/departments/{quote(name, safe='')}", "admin", body)
    assert (got, answer.get("error")) == (status, sentence), answer
    research = hub.api("GET", "api/departments/research", "admin")[1]
    assert (research["quota"], research["projects"]) == (2, ["nlp", "vision"])


def test_a_projects_quota_must_fit_its_department(hub):
    status, answer = hub.api("PUT", "api/projects/nlp", "admin", {"quota": 2})
    assert status == 409 and answer["error"] == (
        "the quotas of department research's projects add up to 3 GPUs, more than its quota of "
        "2 GPUs; raise the department's quota or lower its projects'"), answer
    assert hub.api("GET", "api/departments/research", "bob")[1]["projects"] == ["nlp", "vision"]


def test_departments_are_created_changed_and_removed_in_the_trail(hub):
    status, made = hub.api("PUT", "api/departments/lab", "admin",
                           {"quota": 0, "limit": 1, "projects": ["spare"]})
    assert status == 200 and made["projects"] == ["spare"], made
    listed = hub.api("GET", "api/projects", "admin")[1]["projects"]
    home = {p["name"]: p["department"] for p in listed}
    assert home["spare"] == "lab"
    status, changed = hub.api("PUT", "api/departments/lab", "admin", {"limit": 2})
    assert status == 200 and changed["limit"] == 2 and changed["projects"] == ["spare"]
    status, gone = hub.api("DELETE", "api/departments/lab", "admin")
    assert status == 200 and gone["name"] == "lab"
    assert hub.api("DELETE", "api/departments/lab", "admin")[0] == 404
    spare = next(p for p in hub.api("GET", "api/projects", "admin")[1]["projects"]
                 if p["name"] == "spare")
    assert spare["department"] is None and spare["quota"] == 0
    trail = [(e["action"], e["target"], e["before"], e["after"])
             for e in hub.api("GET", "api/audit?limit=3", "admin")[1]["entries"]]
    assert trail == [
        ("delete department", "lab", {"limit": 2, "over_quota_weight": 1, "projects": ["spare"],
                                      "quota": 0}, None),
        ("change department", "lab", {"limit": 1}, {"limit": 2}),
        ("create department", "lab", None, {"limit": 1, "over_quota_weight": 1,
                                            "projects": ["spare"], "quota": 0})]
    configured = [e for e in hub.api("GET", "api/audit?limit=1000", "admin")[1]["entries"]
                  if e["action"] == "create department" and e["who"] == "configuration"]
    assert sorted(e["target"] for e in configured) == ["operations", "research"]


def test_a_sibling_borrows_an_idle_quota_before_another_department(hub):
    """All four GPUs busy: alice's vision 1, bob's nlp 1, carol's ops 2. bob and carol each
    ask one more; alice's job ends. One level would give the GPU to ops (its weight is 3);
    with departments it goes to nlp, alice's sibling in research."""
    def submit(user, project):
        status, job = hub.api("POST", "api/jobs", user, {"gpus": 1, "source": SLEEP,
                                                         "project": project})
        assert status in (200, 201), job
        return job["id"]

    first = [submit("alice", "vision"), submit("bob", "nlp"), submit("carol", "ops"),
             submit("carol", "ops")]
    for job_id, user in zip(first, ("alice", "bob", "carol", "carol")):
        hub.wait_job(user, job_id, ("running",))
    ops_more, nlp_more = submit("carol", "ops"), submit("bob", "nlp")
    until(lambda: hub.api("GET", f"api/jobs/{nlp_more}", "bob")[1]["reason"])
    assert hub.api("DELETE", f"api/jobs/{first[0]}", "alice")[0] == 200
    hub.wait_job("bob", nlp_more, ("running",))
    waiting = hub.api("GET", f"api/jobs/{ops_more}", "carol")[1]
    assert waiting["state"] == "pending", waiting
    research = hub.api("GET", "api/departments/research", "admin")[1]
    assert (research["in_use"], research["borrowed"]) == (2, 0)
    for job_id, user in [*zip(first[1:], ("bob", "carol", "carol")), (ops_more, "carol"),
                         (nlp_more, "bob")]:
        hub.api("DELETE", f"api/jobs/{job_id}", user)


@pytest.mark.parametrize("departments, sentence", [
    ({"research": {"quota": 2, "owner": "x"}}, "PoolService.departments['research']: unknown "
     "field(s) owner; the fields are limit, over_quota_weight, projects, quota"),
    ({"research": {"quota": 2, "projects": ["vision"]}, "lab": {"projects": ["vision"]}},
     "PoolService.departments: project vision is in both research and lab; a project belongs "
     "to at most one department"),
    ({"research": {"quota": 2, "projects": ["vision", "ghost"]}},
     "PoolService.departments['research'] names project(s) ghost, which do not exist: add "
     "them to PoolService.projects."),
    ({"research": {"quota": 0.5, "projects": ["vision"]}}, "PoolService.departments: the "
     "quotas of department research's projects add up to 1 GPU, more than its quota of 0.5 "
     "GPU; raise the department's quota or lower its projects'."),
    ({"research": {"quota": 8, "projects": ["vision"]}}, "The quotas add up to 8 GPUs but the "
     "train pool has 4; a guarantee that cannot be honoured is refused: lower "
     "PoolService.projects' or PoolService.departments' quotas."),
])
def test_the_service_does_not_start_with_bad_departments(departments, sentence, tmp_path,
                                                         capsys):
    err = refused_at_start("c.PoolService.projects = {'vision': {'quota': 1}}\n"
                           f"c.PoolService.departments = {departments!r}\n"
                           "c.LocalBackend.simulate_gpus = True\n"
                           "c.LocalBackend.simulated_nodes = 1\n"
                           "c.LocalBackend.simulated_gpus_per_node = 4\n", tmp_path, capsys)
    assert sentence in err, err


def test_metrics_carry_the_department_and_pass_promtool(hub):
    import shutil

    status, text = hub.api("GET", "metrics", "admin")
    assert status == 200, text
    assert 'gpushare_project_quota_gpus{department="research",project="vision"} 1.0' in text
    assert 'gpushare_project_quota_gpus{department="",project="spare"} 0.0' in text
    assert 'gpushare_department_quota_gpus{department="research"} 2.0' in text
    assert 'gpushare_department_limit_gpus{department="operations"} 4.0' in text
    assert 'gpushare_department_limit_gpus{department="research"}' not in text
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text, text=True,
                               capture_output=True, timeout=60)
        assert check.returncode == 0, check.stdout + check.stderr


def _service(tmp_path, departments=None):
    from jupyter_gpushare.pool.app import PoolService

    config = tmp_path / "gpushare_config.py"
    config.write_text("c.PoolService.projects = {'vision': {'quota': 1}, 'nlp': {'quota': 1}}\n"
                      f"c.PoolService.departments = {departments or {}!r}\n"
                      "c.LocalBackend.simulate_gpus = True\n"
                      "c.LocalBackend.simulated_nodes = 1\n"
                      "c.LocalBackend.simulated_gpus_per_node = 4\n")
    service = PoolService()
    service.initialize([f"--PoolService.config_file={config}",
                        f"--PoolService.state_dir={tmp_path / 'state'}"])
    return service


def test_departments_made_through_the_api_survive_a_restart_and_bind_the_configuration(
        tmp_path, capsys):
    from jupyter_gpushare.pool.admin.changes import change_department

    service = _service(tmp_path)
    change_department(service.store, service.scheduler, "lab", {"quota": 2, "projects": ["vision"]},
                      "admin", "api")
    again = _service(tmp_path)  # the API's change wins, and the service starts
    assert again.store.quotas.members("lab") == ["vision"]
    for departments, sentence in [
            ({"research": {"quota": 1, "projects": ["vision"]}},
             "PoolService.departments['research'] names project vision, which belongs to "
             "department lab (set through the API): take it out of lab first, or leave it out "
             "here."),
            ({"research": {"quota": 3, "projects": ["nlp"]}},
             "The quotas add up to 5 GPUs but the train pool has 4; a guarantee that cannot be "
             "honoured is refused: lower PoolService.projects' or PoolService.departments' "
             "quotas, or those set through the API.")]:
        with pytest.raises(SystemExit):
            _service(tmp_path, departments)
        err = capsys.readouterr().err
        assert sentence in err and "Traceback" not in err, err
    assert again.store.quotas.members("lab") == ["vision"]
    assert again.store.quotas.department("research") is None


def test_a_department_row_that_is_not_valid_leaves_the_pool_on_one_level(tmp_path):
    """The API refuses a limit below the quota; a row edited by hand may hold one. The
    scheduler then schedules on one level and says so once; changes refuse with what to do."""
    import asyncio

    from jupyter_gpushare.pool.admin.changes import change_project
    from jupyter_gpushare.validate import Invalid

    service = _service(tmp_path, {"research": {"quota": 2, "projects": ["vision", "nlp"]}})
    service.store.quotas.put_department("research", {"limit": 500}, None, 0.0)  # by hand: 0.5 < 2
    asyncio.run(service.scheduler.tick())
    assert "limit (0.5 GPU) is below its quota" in service.scheduler._levels_problem
    with pytest.raises(Invalid) as refused:
        change_project(service.store, service.scheduler, "nlp", {"quota": 0}, "admin", "api")
    assert refused.value.status == 409 and "fix it first with PUT api/departments/research" \
        in str(refused.value)


def test_a_submit_beyond_its_departments_limit_is_refused_at_once(hub):
    """A submit is checked by the policy's own never-fits rule: the train pool, the fewest
    nodes a gang must use, the project's limit and its department's, in the sentence the job
    would otherwise wait with."""
    assert hub.api("PUT", "api/departments/operations", "admin", {"limit": 2})[0] == 200
    try:
        status, answer = hub.api("POST", "api/jobs", "carol",
                                 {"gpus": 3, "project": "ops", "command": ["true"]})
        assert (status, answer.get("error")) == (400, (
            "the job asks for 3 GPUs but department operations (of project ops) may never use "
            "more than 2 GPUs; ask for fewer GPUs")), answer
        assert not [j for j in hub.api("GET", "api/jobs", "carol")[1]["jobs"] if j["gpus"] == 3]
    finally:
        assert hub.api("PUT", "api/departments/operations", "admin", {"limit": 4})[0] == 200
