"""pytest-jupyter's jupyter_server fixtures (jp_fetch, jp_serverapp, …), for this folder only.

They are imported here rather than named in ``pytest_plugins``: a plugin would apply its
autouse fixtures and its way of running coroutine tests to the whole run, and the hub tests
elsewhere run under pytest-asyncio. A conftest's fixtures and hooks apply to its folder."""

import sys
from pathlib import Path

from pytest_jupyter.jupyter_server import *  # noqa: F401,F403

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # hubtest.py
