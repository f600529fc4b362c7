"""``python -m jupyter_gpushare.agent``: the node agent (``app.py``)."""

from .app import main

main()
