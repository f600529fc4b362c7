"""The OpenAPI document and the handlers describe the same API."""

from jupyter_gpushare.pool.web.identity import Who
from jupyter_gpushare.pool.web.job_lists import list_key
from jupyter_gpushare.pool.web.openapi import SPEC
from jupyter_gpushare.pool.web.routes import routes


def documented(pattern: str) -> str:
    """``/api/jobs/([^/]+)/logs`` → ``/api/jobs/{job_id}/logs``."""
    name = "{job_id}" if "/jobs/" in pattern else "{slice_id}" if "/slices/" in pattern \
        else "{node}" if "/nodes/" in pattern else "{whatif_id}" if "/whatif/" in pattern \
        else "{name}"
    return pattern.replace("([^/]+)", name)


def test_openapi_paths_and_methods_are_exactly_the_handlers():
    served = {documented(pattern): handler for pattern, handler in routes("")}
    assert set(served) == set(SPEC["paths"])
    for path, handler in served.items():
        implemented = {m for m in ("get", "post", "put", "patch", "delete") if m in vars(handler)}
        assert implemented == set(SPEC["paths"][path]), path


def test_the_list_cache_key_is_the_caller_and_the_arguments_a_list_reads():
    alice = Who("alice", False, frozenset({"vision"}))
    service = Who("alice", False, frozenset(), kind="service")
    query = {"state": [b"pending"], "limit": [b"5"]}
    assert list_key(alice, {**query, "x": [b"1"]}) == list_key(alice, {**query, "x": [b"2"]})
    assert list_key(alice, query) != list_key(service, query)
    assert list_key(alice, query) != list_key(alice, {**query, "state": [b"running"]})


def test_the_document_is_valid_openapi_3_0_3():
    from openapi_spec_validator import OpenAPIV30SpecValidator

    assert SPEC["openapi"] == "3.0.3"
    OpenAPIV30SpecValidator(SPEC).validate()  # raises on e.g. 3.1's exclusiveMinimum: 0


def test_every_operation_documents_403_and_its_errors_as_json():
    for path, methods in SPEC["paths"].items():
        for method, op in methods.items():
            if path == "/api/openapi.json":
                continue
            assert "403" in op["responses"], (method, path)
            for status, answer in op["responses"].items():
                if status.startswith(("4", "5")):
                    assert "application/json" in answer["content"], (method, path, status)
