"""The admin dashboard: one HTML page of the pool, served by the pool service under the hub
(``/services/gpushare/dashboard``, admins only, browser login through the hub's OAuth).

What flows in: a plain dict of the pool as the REST API shows it to an admin (``api/pool``
with its GPU map and culling, the projects, ``api/usage`` by project with a time series and
by job and slice sorted by idle time, the running and waiting jobs, the slices, the audit
trail's newest entries), gathered by
``pool/web/dashboard_pages.py``, the only part that does I/O.
The steps, each a pure function of that dict returning HTML:
  1. the window asked for (``window.py``): how far back, in which buckets;
  2. the pool map (``poolmap.py``): every GPU, who holds it, its utilization now, and which
     train nodes are drained (``drain.py``, also the pages that drain and undrain one);
  3. allocation and utilization per project over the window (``usage.py``, charts drawn by
     ``jupyter_gpushare/charts.py``), and the top idle-allocated jobs and slices;
  4. the queue with its reasons and the culls (``tables.py``);
  5. the audit trail's newest entries, and a page of older ones (``audit.py``);
  6. the page around them (``page.py``), refreshed in place by a few lines of script, with a
     link to the window's usage as CSV;
and ``whatif.py``: the what-if page (a replay of the recorded jobs under changed settings).
What flows out: the page, or a refusal page with one sentence. No CDN, no external files:
nothing outside the hub need be reachable from the browser.

``HUB_TEMPLATES``: a folder for ``c.JupyterHub.template_paths`` whose ``page.html`` adds
"GPU pool" to the hub's navigation bar for those the dashboard lets in (the hub's Services
menu would show the service to every user, as every server may access it).
"""

from pathlib import Path

from .page import refusal, render
from .whatif import render_whatif
from .window import WINDOWS, BadWindow, Window, choose_window

HUB_TEMPLATES = str(Path(__file__).parent / "hub_templates")

__all__ = ["render", "render_whatif", "refusal", "WINDOWS", "BadWindow", "Window", "choose_window",
           "HUB_TEMPLATES"]
