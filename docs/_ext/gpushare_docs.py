"""Parts of the reference that are made from the code, so that they cannot drift from it.

- ``train_cell_parser`` / ``train_script_parser``: the ``%%train`` and ``%train`` magics' own
  argument parsers, for sphinx-argparse (``.. argparse::``).
- ``.. gpushare-metrics::``: a table of every Prometheus metric the pool exposes, from
  ``jupyter_gpushare.pool.metrics.METRICS`` (the table the collectors fill).
- ``.. autogpushare:: module.Class``: the class's configuration options that jupyter-gpushare
  defines (its own and those it inherits from our base classes), without the options of the
  JupyterHub, KubeSpawner or traitlets classes it extends (their own references have those)
  and without methods.
- the pool service's OpenAPI document, written to ``reference/_generated/`` when a build
  starts, for sphinxcontrib-openapi's ``.. openapi::`` and as a download.
"""

from __future__ import annotations

import json
from pathlib import Path

from autodoc_traits import ConfigurableDocumenter
from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.ext.autodoc import ObjectMember
from jupyter_gpushare.notebook.magics import build_parser
from jupyter_gpushare.pool.metrics import METRICS
from jupyter_gpushare.pool.web.openapi import SPEC

OPENAPI_FILE = "gpushare-openapi.json"


def train_cell_parser():
    """The parser of the ``%%train`` cell magic."""
    return build_parser(script=False)


def train_script_parser():
    """The parser of the ``%train`` line magic."""
    return build_parser(script=True)


def ours(cls) -> dict:
    """name -> trait of every configurable trait of ``cls`` that jupyter-gpushare defines."""
    return {name: trait for name, trait in cls.class_traits(config=True).items()
            if trait.this_class.__module__.startswith("jupyter_gpushare.")}


class GPUShareConfigurable(ConfigurableDocumenter):
    objtype = "gpushare"
    directivetype = "class"
    priority = ConfigurableDocumenter.priority - 1  # only where asked for by name

    @classmethod
    def can_document_member(cls, member, membername, isattr, parent):
        return False

    def get_object_members(self, want_all):
        return False, [ObjectMember(name, trait) for name, trait in sorted(ours(self.object).items())]

    def filter_members(self, members, want_all):
        return [(m.__name__, m.object, True) for m in members]


def _row(*cells) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += cell if isinstance(cell, nodes.Node) else nodes.paragraph(text=str(cell))
        row += entry
    return row


class MetricsTable(Directive):
    """Every metric of ``/services/gpushare/metrics``: name as scraped, type, labels, help."""

    has_content = False

    def run(self):
        table = nodes.table(classes=["gpushare-metrics"])
        group = nodes.tgroup(cols=4)
        table += group
        for width in (30, 8, 18, 44):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += _row("metric", "type", "labels", "what it says")
        group += head
        body = nodes.tbody()
        for metric in METRICS:
            name = nodes.paragraph()
            name += nodes.literal(text=metric.exposed)
            labels = nodes.paragraph()
            for i, label in enumerate(metric.labels):
                if i:
                    labels += nodes.Text(", ")
                labels += nodes.literal(text=label)
            body += _row(name, metric.kind, labels, metric.help + ".")
        group += body
        return [table]


def _write_openapi(app) -> None:
    """The OpenAPI document beside the REST API page's source (the directive reads it from
    there) and in the built site (readers download it)."""
    text = json.dumps(SPEC, indent=1, sort_keys=False)
    target = Path(app.srcdir) / "reference" / "_generated"
    target.mkdir(exist_ok=True)
    path = target / OPENAPI_FILE
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def setup(app):
    app.setup_extension("autodoc_traits")
    app.add_autodocumenter(GPUShareConfigurable)
    app.add_directive("gpushare-metrics", MetricsTable)
    app.connect("builder-inited", _write_openapi)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
