"""The documentation site (docs/): it builds with no warning, exactly as the README and
.readthedocs.yaml build it; its references are complete (every configurable option, every
operation of the pool's OpenAPI document, every subcommand and option of ``gpushare`` and of
the magics, every metric); and in headless Chromium a JupyterHub admin gets from the front
page to the guide for adding gpushare to a hub on one GPU server in two clicks at most.
Screenshots of the front page, that guide and the configuration reference are kept in
tests/artifacts/docs/."""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import importlib
import pkgutil
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from traitlets.config import Configurable

import jupyter_gpushare
from jupyter_gpushare.cli import build_parser
from jupyter_gpushare.notebook.magics import build_parser as magic_parser
from jupyter_gpushare.pool.metrics import METRICS
from jupyter_gpushare.pool.web.openapi import SPEC

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
ARTIFACTS = Path(__file__).parent / "artifacts" / "docs"
GUIDE_TITLE = "Add gpushare to an existing JupyterHub on one GPU server"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as the README's docs command builds it: warnings are errors (-W) and
    references to what does not exist are warnings (-n)."""
    out = tmp_path_factory.mktemp("docs-html")
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html",
         "-d", str(out / ".doctrees"), str(DOCS), str(out)],
        capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, f"the docs do not build cleanly:\n{done.stdout}\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return out


def page(site: Path, name: str) -> str:
    return (site / name).read_text()


def ids(text: str) -> set[str]:
    return {html.unescape(i) for i in re.findall(r'\bid="([^"]+)"', text)}


def test_the_readme_and_read_the_docs_build_the_site_this_way():
    readme = (REPO / "README.md").read_text()
    assert "sphinx-build -W --keep-going -n docs docs/_build/html" in readme
    rtd = (REPO / ".readthedocs.yaml").read_text()
    assert "configuration: docs/conf.py" in rtd and "fail_on_warning: true" in rtd


# --- the references are complete -------------------------------------------------------------

def _our_configurables() -> list[type]:
    """Every configurable class the package defines (importing every module of it)."""
    for info in pkgutil.walk_packages(jupyter_gpushare.__path__, "jupyter_gpushare."):
        if info.name.endswith("__main__") or ".migrations" in info.name:
            continue  # programs and alembic's scripts, not modules to import
        importlib.import_module(info.name)
    found, todo = set(), [Configurable]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith("jupyter_gpushare."):
                found.add(sub)
    return sorted(found, key=lambda c: (c.__module__, c.__qualname__))


def test_every_configurable_option_is_in_the_reference(site):
    documented: dict[str, set[type]] = {}
    for anchor in ids(page(site, "reference/config.html")):
        module_class, _, name = anchor.rpartition(".")
        module, _, cls = module_class.rpartition(".")
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError, ValueError):
            continue
        documented.setdefault(name, set()).add(owner)
    missing = []
    for cls in _our_configurables():
        for name, trait in cls.class_own_traits(config=True).items():
            if not any(issubclass(owner, cls) for owner in documented.get(name, ())):
                missing.append(f"{cls.__module__}.{cls.__name__}.{name}")
    assert not missing, ("options missing from docs/reference/config.md (add their class "
                         f"with `.. autogpushare::`): {missing}")
    assert len(documented) > 100  # the page really holds the options, not just their names


def test_every_operation_of_the_api_is_in_the_reference(site):
    anchors = ids(page(site, "reference/rest-api.html"))
    operations = [(method, path) for path, ops in SPEC["paths"].items() for method in ops]
    assert len(operations) > 15
    missing = [f"{method.upper()} {path}" for method, path in operations
               if f"{method}-" + re.sub(r"[{}]", "", path).replace("/", "-") not in anchors]
    assert not missing, f"operations missing from the REST API reference: {missing}"


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [max(a.option_strings, key=len) for a in parser._actions
            if a.option_strings and a.dest != "help"]


def test_every_command_and_option_of_the_cli_is_in_the_reference(site):
    text = page(site, "reference/cli.html")
    anchors = ids(text)
    [sub] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"simulate", "submit", "jobs", "logs", "cancel", "quota", "pool",
            "usage"} <= sub.choices.keys()
    for name, parser in sub.choices.items():
        assert f"gpushare-{name}" in anchors, f"gpushare {name} is not in the CLI reference"
        for option in _options(parser):
            assert html.escape(option) in text, f"gpushare {name} {option} is not documented"


def test_every_option_of_the_magics_is_in_the_reference(site):
    text = page(site, "reference/magics.html")
    for script in (False, True):
        for option in _options(magic_parser(script)):
            assert html.escape(option) in text, f"{option} of the magics is not documented"
    for word in ("%%train", "%train", "%gpushare"):
        assert word in text


def test_every_metric_is_in_the_reference(site):
    text = page(site, "reference/metrics.html")
    missing = [m.exposed for m in METRICS if m.exposed not in text]
    assert not missing, f"metrics missing from the reference: {missing}"


def test_no_page_is_left_unwritten(site):
    stubs = [p.relative_to(DOCS) for p in DOCS.rglob("*.md")
             if "To be written" in p.read_text()]
    assert not stubs, f"pages still to be written: {stubs}"


# --- as a reader would -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP, as Read the Docs serves it (search needs more than file://)."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_an_admin_reaches_the_one_server_guide_in_two_clicks(served):
    from browser import CHROMIUM_ARGS, chromium, need_playwright

    need_playwright()
    executable = chromium()
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            view = browser.new_page(viewport={"width": 1280, "height": 900})
            errors = []
            view.on("pageerror", lambda e: errors.append(str(e)))
            view.goto(served + "/index.html")
            assert view.title().startswith("jupyter-gpushare")
            view.screenshot(path=str(ARTIFACTS / "front-page.png"), full_page=True)

            # One click from the front page's "Where to start".
            view.get_by_role("link", name=GUIDE_TITLE).first.click()
            view.wait_for_load_state()
            assert view.locator("h1").inner_text().startswith(GUIDE_TITLE)
            # The commands have copy buttons (sphinx-copybutton adds them once the page runs).
            view.locator("button.copybtn").first.wait_for(state="attached", timeout=10_000)
            view.screenshot(path=str(ARTIFACTS / "one-server-guide.png"), full_page=True)

            # Two clicks through the navigation: "How-to guides", then the guide.
            view.goto(served + "/index.html")
            view.locator("nav").get_by_role("link", name="How-to guides").first.click()
            view.wait_for_load_state()
            view.locator("article").get_by_role("link", name=GUIDE_TITLE).first.click()
            view.wait_for_load_state()
            assert view.locator("h1").inner_text().startswith(GUIDE_TITLE)

            view.goto(served + "/reference/config.html")
            assert "c.PoolService.projects" in view.locator("article").inner_text()
            view.screenshot(path=str(ARTIFACTS / "config-reference.png"))
            assert not errors, errors
        finally:
            browser.close()
