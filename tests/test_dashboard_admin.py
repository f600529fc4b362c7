"""The admin's forms in the dashboard, in real headless Chromium (Debian's, driven by
Playwright) on a real hub with the real proxy: an admin raises vision's quota (a preview
first, then save) and `gpushare quota` and `GET api/projects` show it; overbooking and a bad
value are refused with the API's sentence, the form shown again as typed and nothing stored;
an admin cancels a waiting job from the queue; the audit trail on the dashboard shows the
quota's change; an admin drains the train node from the pool map, requeueing the job there,
and undrains it. bob, no admin, is refused the pages and forged posts with his own valid XSRF
pair; a post without the XSRF token is refused; the
REST API still takes tokens without one. Screenshots are kept in
tests/artifacts/dashboard-admin/ (the docs' picture: docs/images/dashboard-project-form.png)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser import CHROMIUM_ARGS, chromium, need_playwright
from hubtest import running_hub

ARTIFACTS = Path(__file__).parent / "artifacts" / "dashboard-admin"
DOCS_IMAGE = Path(__file__).parent.parent / "docs" / "images" / "dashboard-project-form.png"

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 4, "groups": ["vision"]},
                          "nlp": {"quota": 4, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 12
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""
JOB = "import time\ntime.sleep(600)\n"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    need_playwright()
    chromium()
    d = tmp_path_factory.mktemp("adminhub")
    with running_hub(d, {"vision": ["alice"], "nlp": ["bob"], "cv": []}, POOL_CONFIG) as hub:
        yield hub


@pytest.fixture(scope="module")
def browser(hub):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def log_in(browser, hub, user):
    """A fresh browser logged in through the hub's page, on the dashboard (or its refusal)."""
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    page.goto(hub.url + "/services/gpushare/dashboard")
    page.wait_for_selector("#username_input", timeout=30_000)
    page.fill("#username_input", user)
    page.fill("#password_input", "any")
    with page.expect_navigation(url=re.compile(r".*/services/gpushare/dashboard.*"),
                                timeout=30_000):
        page.click("#login_submit")
    return page


def xsrf_of(page) -> str:
    """The page's XSRF token: the _xsrf cookie the service set for this login."""
    return next(c["value"] for c in page.context.cookies() if c["name"] == "_xsrf")


SETTINGS = ("quota", "limit", "over_quota_weight", "priority", "groups", "job_priority_min",
            "job_priority_max")


def project(hub, name: str) -> dict:
    status, body = hub.api("GET", "api/projects", "admin")
    assert status == 200, body
    return next(p for p in body["projects"] if p["name"] == name)


def settings(hub, name: str) -> dict:
    """What an admin sets of a project (its deserved share and use move with the queue)."""
    return {key: project(hub, name)[key] for key in SETTINGS}


def quota_command(hub, user: str) -> str:
    env = {**os.environ, "GPUSHARE_URL": hub.pool_url, "JUPYTERHUB_API_TOKEN": hub.token(user)}
    done = subprocess.run([sys.executable, "-m", "jupyter_gpushare", "quota"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_admin_raises_a_quota_after_a_preview(hub, browser):
    page = log_in(browser, hub, "admin")
    settings = page.locator("#settings table.settings")
    assert "vision" in settings.inner_text()
    page.get_by_role("link", name="Change project vision").click()
    page.wait_for_selector("form.edit")
    # labelled fields, filled with the project as it is; the hub's groups offered
    assert page.get_by_label("Quota (GPUs)").input_value() == "4"
    assert page.get_by_label("Limit (GPUs)").input_value() == ""
    assert page.get_by_label("vision", exact=True).is_checked()
    assert not page.get_by_label("nlp", exact=True).is_checked()
    assert page.get_by_label("cv", exact=True).count() == 1  # a hub group no project has yet
    # keyboard only: the quota field has the focus; type, then Enter sends the form
    assert page.evaluate("document.activeElement.id") == "f-quota"
    page.keyboard.press("Control+A")
    page.keyboard.type("6")
    page.keyboard.press("Enter")
    page.wait_for_selector("#preview")
    assert page.locator("#preview").inner_text() == \
        "vision: quota 4 → 6; the pool is then 10 of 12 GPUs promised"
    assert project(hub, "vision")["quota"] == 4  # a preview stores nothing
    page.screenshot(path=str(ARTIFACTS / "preview.png"), full_page=True)
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector("#saved")
    assert "Saved. vision: quota 4 → 6" in page.locator("#saved").inner_text()
    row = page.locator("table.saved tbody tr td").all_inner_texts()
    assert row[:3] == ["vision", "6", "none"], row
    page.screenshot(path=str(ARTIFACTS / "saved.png"), full_page=True)
    assert project(hub, "vision")["quota"] == 6
    lines = quota_command(hub, "alice").splitlines()
    assert lines[0].split()[:2] == ["PROJECT", "QUOTA"]
    assert lines[1].split()[:2] == ["vision", "6"], lines
    # the audit trail on the dashboard: the newest entry is this change, in words
    page.goto(hub.pool_url + "dashboard")
    newest = page.locator("#audit table.audit tbody tr").first
    assert newest.locator("td").all_inner_texts() == [
        "just now", "admin", "change project", "vision", "quota 4 → 6", "dashboard"]
    # the configuration's projects before it, and the same entries as api/audit's
    status, trail = hub.api("GET", "api/audit?limit=5", "admin")
    assert status == 200 and trail["entries"][0]["after"] == {"quota": 6.0}
    targets = page.locator("#audit table.audit tbody tr td:nth-child(4)").all_inner_texts()
    assert targets == [e["target"] for e in trail["entries"]][:len(targets)]
    assert "configuration" in page.locator("#audit").inner_text()
    page.locator("#audit").screenshot(path=str(ARTIFACTS / "audit.png"))
    # older entries, a page at a time, as api/audit pages them (?before=next)
    page.goto(hub.pool_url + "dashboard/audit?limit=1")
    assert page.locator("table.audit tbody tr").count() == 1
    page.locator("#older").click()
    page.wait_for_selector("#newest")
    assert f"before={trail['entries'][0]['id']}" in page.url
    assert page.locator("table.audit tbody tr td:nth-child(4)").all_inner_texts() == \
        [e["target"] for e in trail["entries"][1:]]
    page.screenshot(path=str(ARTIFACTS / "audit-older.png"), full_page=True)
    assert page.goto(hub.pool_url + "dashboard/audit?before=x").status == 400
    assert "Before must be an entry's id" in page.locator(".refusal").inner_text()
    assert page.errors == []


def test_overbooking_and_bad_values_are_refused_and_nothing_is_stored(hub, browser):
    page = log_in(browser, hub, "admin")
    page.goto(hub.pool_url + "dashboard/project?name=nlp")
    before = settings(hub, "nlp")
    page.get_by_label("Quota (GPUs)").fill("9")
    page.get_by_label("Limit (GPUs)").fill("10")
    page.get_by_role("button", name="Preview the change").click()
    page.wait_for_selector("#problem")
    words = page.locator("#problem").inner_text()
    assert "but the train pool has 12" in words and "lower another project's quota first" in words
    # the form again, as typed
    assert page.get_by_label("Quota (GPUs)").input_value() == "9"
    assert page.get_by_label("Limit (GPUs)").input_value() == "10"
    page.screenshot(path=str(ARTIFACTS / "overbooked.png"), full_page=True)
    for field, value, sentence in (
            ("Quota (GPUs)", "lots", "Quota must be a number of GPUs, not 'lots'."),
            ("Over-quota weight", "2.5", "Over_quota_weight must be a whole number, not 2.5."),
            ("Limit (GPUs)", "1", "Limit (1 GPUs) may not be below the quota (4 GPUs)")):
        for label, valid in (("Quota (GPUs)", "4"), ("Limit (GPUs)", ""),
                             ("Over-quota weight", "1")):
            page.get_by_label(label).fill(valid)
        page.get_by_label(field).fill(value)
        with page.expect_navigation():
            page.get_by_role("button", name="Preview the change").click()
        assert sentence in page.locator("#problem").inner_text()
        assert page.get_by_label(field).input_value() == value
    assert settings(hub, "nlp") == before
    # the same sentence as the API's
    status, body = hub.api("PUT", "api/projects/nlp", "admin", {"quota": 9})
    assert status == 409 and body["error"][1:] in words
    assert settings(hub, "nlp") == before
    assert page.errors == []


def test_an_admin_creates_a_project(hub, browser):
    page = log_in(browser, hub, "admin")
    page.locator("#new-project").click()
    page.wait_for_selector("form.edit")
    page.get_by_label("Name").fill("cv")
    page.get_by_label("Quota (GPUs)").fill("1")
    page.get_by_label("cv", exact=True).check()
    page.get_by_role("button", name="Preview the change").click()
    page.wait_for_selector("#preview")
    assert page.locator("#preview").inner_text().startswith("new project cv: quota 1, limit none")
    page.get_by_role("button", name="Save").click()
    page.wait_for_selector("#saved")
    made = project(hub, "cv")
    assert made["quota"] == 1 and made["groups"] == ["cv"]


def test_an_admin_cancels_a_waiting_job(hub, browser):
    # bob's job holds a GPU within nlp's quota; alice's 12-GPU job cannot take it: it waits
    status, held = hub.api("POST", "api/jobs", "bob", {"gpus": 1, "source": JOB, "name": "held"})
    assert status == 201, held
    hub.wait_job("bob", held["id"], ("running",))
    status, big = hub.api("POST", "api/jobs", "alice", {"gpus": 12, "source": JOB,
                                                        "name": "big"})
    assert status == 201, big
    page = log_in(browser, hub, "admin")
    page.wait_for_selector("#queue table.queue")
    row = page.locator("#queue table.queue tbody tr", has_text="big")
    row.get_by_role("link", name="Cancel job big").click()
    page.wait_for_selector("#state")
    assert page.locator("#state").inner_text() == "pending"
    assert hub.api("GET", f"api/jobs/{big['id']}", "alice")[1]["state"] == "pending"
    page.screenshot(path=str(ARTIFACTS / "cancel-confirm.png"), full_page=True)
    page.get_by_role("button", name="Cancel the job").click()
    page.wait_for_selector("#cancelled")
    assert "It is cancelled." in page.locator("#cancelled").inner_text()
    assert hub.api("GET", f"api/jobs/{big['id']}", "alice")[1]["state"] == "cancelled"
    # once more: it has ended, the API's 409 sentence
    answer = page.context.request.post(
        hub.pool_url + f"dashboard/jobs/{big['id']}/cancel", form={"_xsrf": xsrf_of(page)})
    assert answer.status == 409
    assert f"Job {big['id']} has already ended (cancelled)." in answer.text()
    status, body = hub.api("DELETE", f"api/jobs/{big['id']}", "alice")
    assert status == 409 and body["error"] == f"job {big['id']} has already ended (cancelled)"
    assert hub.api("DELETE", f"api/jobs/{held['id']}", "bob")[0] == 200


def train_node(hub) -> dict:
    status, pool = hub.api("GET", "api/pool", "admin")
    assert status == 200, pool
    return next(n for n in pool["nodes"] if n["pool"] == "train")


def test_an_admin_drains_a_node_from_the_pool_map_and_undrains_it(hub, browser):
    status, job = hub.api("POST", "api/jobs", "bob", {"gpus": 1, "source": JOB, "name": "there"})
    assert status == 201, job
    hub.wait_job("bob", job["id"], ("running",))
    node = train_node(hub)["name"]
    page = log_in(browser, hub, "admin")
    mapped = page.locator(f'#pool-map .node[data-node="{node}"]')
    mapped.get_by_role("link", name=f"Drain node {node}").click()
    page.wait_for_selector("#drain-state")
    assert page.locator("#drain-state").inner_text() == "in service: new jobs may start there"
    assert page.locator("#jobs-there").inner_text() == "there (bob, nlp)"
    requeue = page.get_by_label("also requeue the jobs running there now (they resume from "
                                "their checkpoints)")
    requeue.check()
    page.screenshot(path=str(ARTIFACTS / "drain-confirm.png"), full_page=True)
    assert train_node(hub)["drained"] is False  # the page asks first
    page.get_by_role("button", name="Drain the node").click()
    page.wait_for_selector("#drain-done")
    assert page.locator("#drain-done").inner_text() == (
        f"Node {node} is drained: no new jobs start there; 1 job(s) are being requeued and "
        f"resume from their checkpoints elsewhere: {job['id']}.")
    drained = train_node(hub)
    assert drained["drained"] is True and drained["drained_by"] == "admin"
    hub.wait_job("bob", job["id"], ("pending",))  # requeued; the only node takes no new jobs
    # the pool map says so, and the audit trail has it
    page.get_by_role("link", name="Back to the pool dashboard").click()
    mapped = page.locator(f'#pool-map .node.drained[data-node="{node}"]')
    assert "drained by admin since" in mapped.locator("h3").inner_text()
    newest = page.locator("#audit table.audit tbody tr").first
    assert newest.locator("td").all_inner_texts() == [
        "just now", "admin", "drain node", node, f"drained no → yes, requeued {job['id']}",
        "dashboard"]
    page.locator("#pool-map").screenshot(path=str(ARTIFACTS / "drained-node.png"))
    # undrain: it asks too; the job starts again
    mapped.get_by_role("link", name=f"Undrain node {node}").click()
    page.wait_for_selector("#drain-state")
    assert page.locator("#drain-state").inner_text().startswith("drained by admin since ")
    page.get_by_role("button", name="Undrain the node").click()
    page.wait_for_selector("#drain-done")
    assert page.locator("#drain-done").inner_text() == f"Node {node} takes new jobs again."
    assert train_node(hub)["drained"] is False
    hub.wait_job("bob", job["id"], ("running",))
    # an unknown node: the API's sentence
    answer = page.context.request.post(hub.pool_url + "dashboard/nodes/nowhere/drain",
                                       form={"_xsrf": xsrf_of(page), "drained": "1"})
    assert answer.status == 404
    assert "There is no train node" in answer.text().replace("&#x27;", "'")
    assert hub.api("DELETE", f"api/jobs/{job['id']}", "bob")[0] == 200
    assert page.errors == []


def test_no_admin_no_xsrf_no_change(hub, browser):
    before = settings(hub, "vision")
    bob = log_in(browser, hub, "bob")
    assert "Only admins of the GPU pool" in bob.locator(".refusal").inner_text()
    for path in ("dashboard/project?name=vision", "dashboard/project"):
        assert bob.goto(hub.pool_url + path).status == 403
    # a forged post: bob's own login and his valid XSRF pair, but bob is no admin
    forged = bob.context.request.post(hub.pool_url + "dashboard/project", form={
        "_xsrf": xsrf_of(bob), "name": "vision", "quota": "8", "step": "save"})
    assert forged.status == 403 and "Only admins of the GPU pool" in forged.text()
    # an admin's post without the XSRF token, and one with another login's token
    admin = log_in(browser, hub, "admin")
    for form in ({"name": "vision", "quota": "8", "step": "save"},
                 {"_xsrf": xsrf_of(bob), "name": "vision", "quota": "8", "step": "save"}):
        answer = admin.context.request.post(hub.pool_url + "dashboard/project", form=form)
        assert answer.status == 403, form
        assert "without the dashboard's XSRF token" in answer.text().replace("&#x27;", "'")
    assert settings(hub, "vision") == before
    # the drain page and a forged drain: refused to bob; a drain without the token too
    node = train_node(hub)["name"]
    assert bob.goto(hub.pool_url + f"dashboard/nodes/{node}/drain").status == 403
    assert bob.goto(hub.pool_url + "dashboard/audit").status == 403
    forged = bob.context.request.post(hub.pool_url + f"dashboard/nodes/{node}/drain",
                                      form={"_xsrf": xsrf_of(bob), "drained": "1"})
    assert forged.status == 403 and "Only admins of the GPU pool" in forged.text()
    answer = admin.context.request.post(hub.pool_url + f"dashboard/nodes/{node}/drain",
                                        form={"drained": "1"})
    assert answer.status == 403
    assert train_node(hub)["drained"] is False
    # the REST API takes a token, without XSRF
    status, body = hub.api("PUT", "api/projects/vision", "admin", {"priority": 1})
    assert status == 200 and body["priority"] == 1
    assert hub.api("PUT", "api/projects/vision", "admin", {"priority": 0})[0] == 200
    bob.screenshot(path=str(ARTIFACTS / "refused.png"))


def test_the_forms_look(hub, browser):
    """The form the docs show, with its labels and groups."""
    page = log_in(browser, hub, "admin")
    page.locator("#settings").screenshot(path=str(ARTIFACTS / "settings.png"))
    page.goto(hub.pool_url + "dashboard/project?name=vision")
    page.wait_for_selector("form.edit")
    page.screenshot(path=str(ARTIFACTS / "project-form.png"), full_page=True)
    DOCS_IMAGE.write_bytes((ARTIFACTS / "project-form.png").read_bytes())


def test_an_admin_changes_a_departments_numbers_after_a_preview(hub, browser):
    """Raising a project's quota beyond its department's is refused with 'raise the
    department's quota': the dashboard changes a department's quota, limit and weight as a
    project's (a preview, then save, audited), with the API's sentences."""
    quotas = {p["name"]: p["quota"] for p in hub.api("GET", "api/projects", "admin")[1]["projects"]}
    held = quotas["vision"] + quotas["nlp"]
    status, made = hub.api("PUT", "api/departments/research", "admin",
                           {"quota": held, "projects": ["vision", "nlp"]})
    assert status == 200, made
    try:
        page = log_in(browser, hub, "admin")
        page.get_by_role("link", name="Change department research").click()
        page.wait_for_selector("form.edit")
        assert page.get_by_label("Quota (GPUs)").input_value() == f"{held:g}"
        assert "Its projects: nlp, vision" in page.locator("main").inner_text()
        # below its projects' quotas: refused with the API's sentence, as typed, nothing stored
        page.get_by_label("Quota (GPUs)").fill(f"{held - 1:g}")
        page.get_by_role("button", name="Preview the change").click()
        page.wait_for_selector("#problem")
        assert "raise the department's quota or lower its projects'" in \
            page.locator("#problem").inner_text()
        assert page.get_by_label("Quota (GPUs)").input_value() == f"{held - 1:g}"
        page.get_by_label("Quota (GPUs)").fill(f"{held + 1:g}")
        page.get_by_label("Limit (GPUs)").fill("11")
        page.get_by_label("Over-quota weight").fill("2")
        page.get_by_role("button", name="Preview the change").click()
        page.wait_for_selector("#preview")
        assert page.locator("#preview").inner_text() == (
            f"department research: quota {held:g} → {held + 1:g}, limit none → 11, "
            f"weight 1 → 2")
        assert hub.api("GET", "api/departments/research", "admin")[1]["quota"] == held
        page.get_by_role("button", name="Save").click()
        page.wait_for_selector("#saved")
        page.screenshot(path=str(ARTIFACTS / "department-saved.png"), full_page=True)
        got = hub.api("GET", "api/departments/research", "admin")[1]
        assert (got["quota"], got["limit"], got["over_quota_weight"]) == (held + 1, 11, 2)
        entry = hub.api("GET", "api/audit?limit=1", "admin")[1]["entries"][0]
        assert (entry["action"], entry["target"], entry["via"]) == \
            ("change department", "research", "dashboard")
        assert page.errors == []
    finally:
        assert hub.api("DELETE", "api/departments/research", "admin")[0] == 200
