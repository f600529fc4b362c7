"""The OpenAPI document and the handlers describe the same API."""

from jupyter_gpushare.pool.api import routes
from jupyter_gpushare.pool.openapi import SPEC


def documented(pattern: str) -> str:
    """``/api/jobs/([^/]+)/logs`` → ``/api/jobs/{job_id}/logs``."""
    name = "{job_id}" if "/jobs/" in pattern else "{slice_id}" if "/slices/" in pattern \
        else "{name}"
    return pattern.replace("([^/]+)", name)


def test_openapi_paths_and_methods_are_exactly_the_handlers():
    served = {documented(pattern): handler for pattern, handler in routes("")}
    assert set(served) == set(SPEC["paths"])
    for path, handler in served.items():
        implemented = {m for m in ("get", "post", "put", "patch", "delete") if m in vars(handler)}
        assert implemented == set(SPEC["paths"][path]), path
