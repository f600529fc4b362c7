"""Every path of the REST API, as web/openapi.py has them: ``api``'s (with ``api_usage``'s and
``api_admin``'s) and ``api_history``'s, whose handlers build on ``api``'s."""

from __future__ import annotations

from . import api_jobs as api, api_history


def routes(prefix: str) -> list:
    return api.routes(prefix) + api_history.routes(prefix)
