"""The hub's navigation bar links to the pool dashboard for those it lets in, and only for them
(the Services menu would list it to every user): HUB_TEMPLATES' page.html rendered by Jinja as
JupyterHub renders its pages, over JupyterHub's own templates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from jupyter_gpushare.dashboard import HUB_TEMPLATES


@pytest.fixture(scope="module")
def page():
    jinja2 = pytest.importorskip("jinja2")
    from jupyterhub._data import DATA_FILES_PATH

    hub_own = f"{DATA_FILES_PATH}/templates"
    # as JupyterHub.init_tornado_settings builds its loader
    env = jinja2.Environment(loader=jinja2.ChoiceLoader([
        jinja2.PrefixLoader({"templates": jinja2.FileSystemLoader([hub_own])}, "/"),
        jinja2.FileSystemLoader([HUB_TEMPLATES, hub_own])]))
    template = env.get_template("page.html")

    def render(admin: bool, scopes: set[str]) -> str:
        user = SimpleNamespace(name="someone", json_escaped_name="someone", admin=admin,
                               spawner=SimpleNamespace(options_form=None, ready=False))
        return template.render(user=user, base_url="/hub/", prefix="/", static_url=lambda p, **_: p,
                               services=[], parsed_scopes=scopes, expanded_scopes=scopes,
                               logout_url="/hub/logout", xsrf="x", version_hash="")
    return render


LINK = '<a class="nav-link" href="/services/gpushare/dashboard">GPU pool</a>'


def test_pool_and_hub_admins_see_the_link_and_no_one_else(page):
    assert LINK in page(True, {"admin-ui"})
    assert LINK in page(False, {"custom:gpushare:admin", "access:services!service=gpushare"})
    plain = page(False, {"access:services!service=gpushare"})
    assert LINK not in plain and 'href="/hub/home">Home</a>' in plain  # the hub's own items stay
