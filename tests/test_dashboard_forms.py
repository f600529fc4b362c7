"""The admin's forms of the dashboard, built by pure functions (dashboard/forms.py) and tested
whole: the words of a preview, a posted form turned into the API's body, the pages' fields,
labels, XSRF token and escaping. The browser test (test_dashboard_admin.py) uses them on a
real hub."""

from test_dashboard_page import check

from jupyter_gpushare.dashboard import drain, forms
from jupyter_gpushare.dashboard.page import form_page

VISION = {"quota": 4.0, "limit": None, "over_quota_weight": 1, "priority": 0,
          "job_priority_min": -100, "job_priority_max": 0, "groups": ["vision"]}


def test_a_preview_says_what_changes_and_what_the_pool_then_promises():
    change = forms.Change("vision", VISION, {**VISION, "quota": 6.0}, 10, 12)
    assert forms.change_words(change) == \
        "vision: quota 4 → 6; the pool is then 10 of 12 GPUs promised"
    change = forms.Change("vision", VISION, {**VISION, "limit": 8.0, "groups": ["cv", "vision"],
                                             "job_priority_max": 10}, 8, 12)
    assert forms.change_words(change) == (
        "vision: limit none → 8, highest job priority 0 → 10, groups vision → cv, vision; "
        "the pool is then 8 of 12 GPUs promised")
    assert forms.change_words(forms.Change("vision", VISION, dict(VISION), 8, 12)) == \
        "vision: nothing changes; the pool is then 8 of 12 GPUs promised"
    assert forms.change_words(forms.Change("cv", None, {**VISION, "quota": 0.5,
                                                        "groups": ["cv"]}, 8.5, 12)) == (
        "new project cv: quota 0.5, limit none, weight 1, priority 0, lowest job priority -100, "
        "highest job priority 0, groups cv; the pool is then 8.5 of 12 GPUs promised")


def test_a_posted_form_is_the_apis_body_and_what_is_no_number_goes_on_as_typed():
    values = {"quota": " 6", "limit": "", "over_quota_weight": "2.5", "priority": "high",
              "job_priority_min": "-100", "job_priority_max": "0"}
    assert forms.body_of(values, ["vision"], new=False) == {
        "quota": 6, "limit": None, "over_quota_weight": 2.5, "priority": "high",
        "job_priority_min": -100, "job_priority_max": 0, "groups": ["vision"]}
    assert forms.body_of({**values, "limit": "nan"}, [], new=False)["limit"] == "nan"
    assert "groups" not in forms.body_of(values, [], new=True)  # the group named like it
    assert forms.body_of(values, [], new=False)["groups"] == []
    assert forms.chosen_groups(["nlp", "vision"], "cv, ml vision") == ["cv", "ml", "nlp",
                                                                       "vision"]
    assert forms.form_values({"name": "v", **VISION, "limit": 8.0}) == {
        "quota": "4", "limit": "8", "over_quota_weight": "1", "priority": "0",
        "job_priority_min": "-100", "job_priority_max": "0"}


def test_the_project_form_has_labelled_fields_the_token_and_escapes_what_was_typed():
    page = form_page(forms.project_form(
        "/services/gpushare/", "admin", "tok<en>", "vision",
        {**forms.DEFAULTS, "quota": '6"><script>'}, ["vision"], ["nlp", "vision"],
        problem="Quota must be a number of GPUs, not '6\"><script>'."))
    c = check(page)
    assert "<script>" not in page and c.scripts == []
    assert '<input type="hidden" name="_xsrf" value="tok&lt;en&gt;">' in page
    assert 'action="/services/gpushare/dashboard/project"' in page
    for key, _, _ in forms.FIELDS:  # every field has its label
        assert f'<label for="f-{key}">' in page and f'id="f-{key}"' in page
    assert '<input type="checkbox" name="groups" value="vision" checked>' in page
    assert '<input type="checkbox" name="groups" value="nlp">' in page
    assert 'role="alert"' in page
    assert 'name="name"' in page and 'id="f-name"' not in page  # its name is not a field
    new = form_page(forms.project_form("/", "admin", "t", "", forms.DEFAULTS, [], None,
                                       new=True))
    assert 'id="f-name"' in new and "JupyterHub did not list its groups now" in new


def test_a_departments_form_says_its_change_and_posts_the_apis_body():
    research = {"name": "research", "quota": 8.0, "limit": None, "over_quota_weight": 1,
                "projects": ["nlp", "vision"], "in_use": 3.0, "deserved": 8.0}
    values = forms.department_values(research)
    assert values == {"quota": "8", "limit": "", "over_quota_weight": "1"}
    assert forms.department_body({**values, "quota": "10", "limit": " 12"}) == {
        "quota": 10, "limit": 12, "over_quota_weight": 1}
    assert forms.department_words("research", {"quota": 8.0, "limit": None},
                                  {"quota": 10.0, "limit": 12.0}) == \
        "department research: quota 8 → 10, limit none → 12"
    page = form_page(forms.department_form("/p/", "admin", "tok", "research",
                                           {**values, "quota": '9"><b>'}, research["projects"],
                                           problem="Quota must be a number."))
    c = check(page)
    assert "<b>" not in page and c.scripts == [] and 'role="alert"' in page
    assert 'action="/p/dashboard/department"' in page and 'name="_xsrf" value="tok"' in page
    for key, _, _ in forms.DEPARTMENT_FIELDS:
        assert f'<label for="f-{key}">' in page
    assert "Its projects: nlp, vision" in page
    table = forms.departments_table("/p/", [research])
    assert 'href="/p/dashboard/department?name=research"' in table
    assert 'aria-label="Change department research"' in table


def test_cancel_asks_first_and_says_why_it_cannot():
    job = {"id": "j-1", "name": "big", "user": "alice", "project": "vision", "gpus": 4,
           "state": "pending"}
    page = form_page(forms.cancel_page("/s/", "admin", "t", job))
    check(page)
    assert 'action="/s/dashboard/jobs/j-1/cancel"' in page and "it leaves the queue" in page
    ended = form_page(forms.cancel_page("/s/", "admin", "t", {**job, "state": "cancelled"},
                                        "Job j-1 has already ended (cancelled)."))
    assert "<form" not in ended and "has already ended (cancelled)" in ended
    assert forms.cancel_link("/s/", job) == (
        '<a class="cancel" href="/s/dashboard/jobs/j-1/cancel" aria-label="Cancel job big">'
        'cancel…</a>')


NODE = {"name": "gpu-3", "gpus": 8, "pool": "train", "drained": False}


def test_drain_asks_first_with_a_box_to_requeue_and_undrain_asks_too():
    jobs = [{"id": "j-1", "name": "resnet", "user": "alice", "project": "vision"}]
    page = form_page(drain.drain_page("/s/", "admin", "t<k>", NODE, jobs, 0))
    c = check(page)
    assert c.scripts == [] and 'action="/s/dashboard/nodes/gpu-3/drain"' in page
    assert '<input type="hidden" name="_xsrf" value="t&lt;k&gt;">' in page
    assert '<input type="hidden" name="drained" value="1">' in page
    assert ('<label><input type="checkbox" name="requeue" value="1" id="f-requeue"> also '
            'requeue the jobs running there now (they resume from their checkpoints)</label>'
            ) in page
    assert '<dd id="jobs-there">resnet (alice, vision)</dd>' in page
    assert "in service: new jobs may start there" in page
    drained = {**NODE, "drained": True, "drained_by": "admin", "drained_since": 1_763_650_000}
    undrain = form_page(drain.drain_page("/s/", "admin", "t", drained, [], 0,
                                         "There is no train node 'x'."))
    assert '<input type="hidden" name="drained" value="0">' in undrain
    assert "requeue" not in undrain and "Undrain the node" in undrain
    assert "drained by admin since Nov 20 14:46" in undrain
    assert '<dd id="jobs-there">none</dd>' in undrain and 'role="alert"' in undrain


def test_drained_says_what_happened_to_the_jobs_there():
    _, body = drain.drain_done_page("/s/", "admin", {"name": "gpu-3", "drained": True,
                                                      "requeued": ["j-1", "j-2"]})
    assert ("Node gpu-3 is drained: no new jobs start there; 2 job(s) are being requeued and "
            "resume from their checkpoints elsewhere: j-1, j-2.") in body
    _, body = drain.drain_done_page("/s/", "admin", {"name": "gpu-3", "drained": True,
                                                      "requeued": []})
    assert "what runs there runs to its end." in body
    _, body = drain.drain_done_page("/s/", "admin", {"name": "gpu-3", "drained": False,
                                                      "requeued": []})
    assert "Node gpu-3 takes new jobs again." in body
