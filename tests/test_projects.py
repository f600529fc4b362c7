"""Projects have one set of rules: a project in the configuration (``PoolService.projects``) is
checked by the same rules, with the same sentence, as one sent to ``PUT api/projects/{name}``.
A bad one stops the service at start with that sentence, naming the project."""

from __future__ import annotations

import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest

from hubtest import Hub, need_proxy, refused_at_start
from jupyter_gpushare.pool.admin.project_specs import ProjectSpec, configured
from jupyter_gpushare.validate import Invalid

# (project name, its settings, the sentence the API answers for the same)
BAD = [
    ("vision", {"quota": 2, "priority": 5000}, "priority must be between -1000 and 1000, not 5000"),
    ("vision", {"quota": 1.2345}, "quota has more than three decimals (1.2345); GPUs are counted "
                                  "in thousandths"),
    ("a b", {"quota": 1}, "project name 'a b' must be 1-100 letters, digits, '.', '_' or '-'"),
    ("vision", {"quota": 2, "limit": 1}, "limit (1 GPUs) may not be below the quota (2 GPUs); "
                                         "raise the limit or lower the quota"),
    ("vision", {"quota": 1, "owner": "alice"}, "unknown field(s) owner; the fields are groups, "
                                               "job_priority_max, job_priority_min, limit, "
                                               "over_quota_weight, priority, quota"),
    ("vision", {"quota": 1, "groups": [f"g{i}" for i in range(65)]},
     "a project takes at most 64 groups, each name of at most 255 characters; give fewer or "
     "shorter names"),
    ("vision", {"quota": 1, "groups": ["x" * 256]},
     "a project takes at most 64 groups, each name of at most 255 characters; give fewer or "
     "shorter names"),
]


@pytest.mark.parametrize("name, settings, sentence", BAD)
def test_a_bad_configured_project_gets_the_apis_sentence(name, settings, sentence):
    with pytest.raises(Invalid) as refused:
        configured({name: settings})
    assert str(refused.value) == f"PoolService.projects[{name!r}]: {sentence}"


@pytest.mark.parametrize("name, settings, sentence", BAD)
def test_the_service_does_not_start_with_a_bad_project(name, settings, sentence, tmp_path,
                                                       capsys):
    err = refused_at_start(f"c.PoolService.projects = {{{name!r}: {settings!r}}}\n", tmp_path,
                           capsys)
    assert f"PoolService.projects[{name!r}]: {sentence}" in err


def test_configured_projects_take_the_defaults_written_once():
    assert configured({"nlp": {"quota": 2}, "empty": {}}) == {
        "nlp": ProjectSpec("nlp", quota=2000), "empty": ProjectSpec("empty")}
    row = ProjectSpec("nlp", quota=2000).row(updated=1.0)
    assert (row.groups, row.over_quota_weight, row.limit, row.priority, row.job_priority_min,
            row.job_priority_max) == (["nlp"], 1, None, 0, -100, 0)  # its own group by default
    assert ProjectSpec.of(row) == ProjectSpec("nlp", 2000, ("nlp",))


@pytest.fixture(scope="module")
def hub():
    """A hub whose API is asked what it says of the same projects (no job runs: any user)."""
    need_proxy()
    folder = Path(tempfile.mkdtemp(prefix="gpushare-projects-"))
    made = Hub(folder, {"vision": ["alice"]},
               'c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]}}\n')
    made.start()
    yield made
    made.stop()


@pytest.mark.parametrize("name, settings, sentence", BAD)
def test_the_api_answers_the_same_sentence(hub, name, settings, sentence):
    status, answer = hub.api("PUT", f"api/projects/{quote(name, safe='')}", "admin", settings)
    assert status == 400 and answer["error"] == sentence, answer
