"""Sphinx configuration of the jupyter-gpushare documentation.

Build: ``sphinx-build -W --keep-going -n docs docs/_build/html`` (the test suite does it too,
in tests/test_docs.py). The references are generated from the code: the configuration from the
traitlets' help texts (autodoc-traits), the REST API from the pool service's own OpenAPI
document, the CLI and the magics from their argument parsers, the metrics from the pool's own
table of them (docs/_ext/gpushare_docs.py)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

import jupyter_gpushare  # noqa: E402

project = "jupyter-gpushare"
author = "The jupyter-gpushare developers"
copyright = "2026, " + author
release = version = jupyter_gpushare.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "autodoc_traits",
    "sphinx_copybutton",
    "sphinxarg.ext",
    "sphinxcontrib.openapi",
    "gpushare_docs",
]

root_doc = "index"
exclude_patterns = ["_build", "**/README.md", "Thumbs.db", ".DS_Store"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}

myst_enable_extensions = ["colon_fence", "deflist", "fieldlist", "substitution"]
myst_heading_anchors = 3

# Signatures of traitlets classes name private typing aliases (t.Any); the help texts are
# what a reader needs.
autodoc_typehints = "none"
autodoc_member_order = "bysource"

copybutton_prompt_text = r"\$ |# "
copybutton_prompt_is_regexp = True

html_theme = "pydata_sphinx_theme"
html_title = "jupyter-gpushare"
html_static_path = ["_static"]
html_css_files = ["custom.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "header_links_before_dropdown": 6,
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_context = {"default_mode": "light"}
html_show_sourcelink = False
