"""The admin's forms of the dashboard, built by pure functions (dashboard/forms.py) and tested
whole: the words of a preview, a posted form turned into the API's body, the pages' fields,
labels, XSRF token and escaping. The browser test (test_dashboard_admin.py) uses them on a
real hub."""

from test_dashboard_page import check

from jupyter_gpushare.dashboard import forms
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
