"""The OpenAPI document of the pool service: the one description of every REST path.

Served at ``api/openapi.json``; a test checks it against the service's handlers."""

from __future__ import annotations

from .. import __version__

_ERROR = {"description": "JSON {\"error\": sentence}",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _ok(schema_ref: str, description: str = "OK") -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}}


def _errors(*codes: int) -> dict:
    """Error answers. 403 (no token, a token the hub does not accept, or not allowed), 429
    (too many unknown tokens lately) and 503 (JupyterHub does not answer, so rights cannot be
    checked) can come from every operation but the document itself; 401 never does."""
    words = {400: "bad input: a body that is not UTF-8, not JSON, nested too deep or not "
                  "what the operation takes, or a bad parameter",
             403: "no JupyterHub token, a token the hub does not accept, or not yours / not "
                  "allowed",
             404: "no such thing", 409: "quota or state conflict",
             413: "body (or job) too large",
             429: "too many: your waiting jobs or followed logs, or unknown tokens lately",
             503: "JupyterHub does not answer, so your rights cannot be checked"}
    return {str(c): {**_ERROR, "description": words[c]} for c in sorted({403, 429, 503, *codes})}


def _text(description: str) -> dict:
    return {"description": description,
            "content": {"text/plain": {"schema": {"type": "string"}}}}


JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
REQUEST_ID = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,64}$",
              "description": "a key of the client's choosing, e.g. a UUID: a submit retried "
                             "with the same key returns the job the first try made (200) "
                             "instead of making a second one"}

SPEC = {
    "openapi": "3.0.3",
    "info": {"title": "jupyter-gpushare pool service", "version": __version__,
             "description": "Served under the hub at /services/gpushare/. Every call carries a "
                            "JupyterHub token (Authorization: token ...); the identity is the "
                            "one JupyterHub returns for it."},
    "components": {
        "securitySchemes": {"hubToken": {"type": "apiKey", "in": "header", "name": "Authorization"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"],
                      "properties": {"error": {"type": "string"}}},
            "JobSpec": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "project": {"type": "string", "description": "default: your only project"},
                    "gpus": {"type": "integer", "minimum": 1, "default": 1},
                    "command": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "source": {"type": "string", "description": "Python code, instead of command"},
                    "name": {"type": "string", "maxLength": 100},
                    "priority": {"type": "integer", "minimum": -100, "maximum": 100, "default": 0,
                                 "description": "orders the job within its project only; "
                                                "within the project's job_priority_min and "
                                                "job_priority_max"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "workdir": {"type": "string", "description": "absolute path the job runs "
                                "in; default: your home directory"},
                    "request_id": REQUEST_ID,
                }},
            "Job": {
                "type": "object",
                "required": ["id", "name", "user", "project", "gpus", "priority", "state",
                             "attempt", "submitted", "started", "finished", "exit_code",
                             "placement", "preempting", "queue_position", "reason"],
                "properties": {
                    "id": {"type": "string"}, "name": {"type": "string"},
                    "user": {"type": "string"}, "project": {"type": "string"},
                    "gpus": {"type": "number"}, "priority": {"type": "integer"},
                    "state": {"type": "string", "enum": ["pending", "running", "succeeded",
                                                         "failed", "cancelled"]},
                    "attempt": {"type": "integer"},
                    "queue_position": {"type": "integer", "nullable": True},
                    "reason": {"type": "string", "description": "why it waits, in words"},
                    "submitted": {"type": "number"}, "started": {"type": "number", "nullable": True},
                    "finished": {"type": "number", "nullable": True},
                    "exit_code": {"type": "integer", "nullable": True},
                    "placement": {"type": "object", "additionalProperties": {"type": "number"}},
                    "preempting": {"type": "boolean"},
                    "requeued": {"type": "string", "nullable": True,
                                 "description": "while a later attempt waits or runs: why "
                                 "the one before it ended (preempted or lost)"},
                    "command": {"type": "array", "items": {"type": "string"},
                                "description": "only for the job's owner and admins"},
                    "env": {"type": "object", "description": "only for the owner and admins"},
                    "workdir": {"type": "string", "nullable": True,
                                "description": "only for the owner and admins"},
                    "request_id": {"type": "string", "nullable": True,
                                   "description": "only for the owner and admins"},
                }},
            "JobList": {"type": "object", "required": ["jobs"], "properties": {
                "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}}},
            "Project": {
                "type": "object",
                "required": ["name", "quota", "over_quota_weight", "limit", "priority",
                             "groups", "in_use", "borrowed", "deserved", "pending"],
                "properties": {
                    "name": {"type": "string"}, "quota": {"type": "number"},
                    "over_quota_weight": {"type": "integer"},
                    "limit": {"type": "number", "nullable": True},
                    "priority": {"type": "integer"},
                    "job_priority_min": {"type": "integer"}, "job_priority_max": {"type": "integer"},
                    "groups": {"type": "array", "items": {"type": "string"}},
                    "in_use": {"type": "number"}, "borrowed": {"type": "number"},
                    "deserved": {"type": "number"}, "pending": {"type": "integer"},
                }},
            "ProjectList": {"type": "object", "required": ["projects"], "properties": {
                "projects": {"type": "array", "items": {"$ref": "#/components/schemas/Project"}}}},
            "ProjectUpdate": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "quota": {"type": "number", "minimum": 0, "maximum": 1_000_000},
                    "over_quota_weight": {"type": "integer", "minimum": 0, "maximum": 1000},
                    "limit": {"type": "number", "minimum": 0, "maximum": 1_000_000,
                              "nullable": True},
                    "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
                    "groups": {"type": "array", "items": {"type": "string"}},
                    "job_priority_min": {"type": "integer", "minimum": -100, "maximum": 100,
                                         "description": "lowest priority members may give "
                                                        "their jobs (default -100)"},
                    "job_priority_max": {"type": "integer", "minimum": -100, "maximum": 100,
                                         "description": "highest (default 0)"},
                }},
            "SliceRequest": {"type": "object", "additionalProperties": False,
                             "required": ["user", "gpus"], "properties": {
                                 "user": {"type": "string"}, "server": {"type": "string"},
                                 "gpus": {"type": "number", "minimum": 0,
                                          "exclusiveMinimum": True, "maximum": 1}}},
            "Slice": {"type": "object", "required": ["id", "user", "server", "gpus", "node",
                                                     "gpu", "uuid", "created"], "properties": {
                "id": {"type": "string"}, "user": {"type": "string"},
                "server": {"type": "string"}, "gpus": {"type": "number"},
                "node": {"type": "string"}, "gpu": {"type": "integer"},
                "uuid": {"type": "string", "nullable": True},
                "created": {"type": "number"}}},
            "SliceList": {"type": "object", "required": ["slices"], "properties": {
                "slices": {"type": "array", "items": {"$ref": "#/components/schemas/Slice"}}}},
            "Pool": {"type": "object", "required": ["capacity", "in_use", "simulated", "nodes",
                                                    "build"], "properties": {
                "capacity": {"type": "number"}, "in_use": {"type": "number"},
                "simulated": {"type": "boolean"},
                "nodes": {"type": "array", "items": {"type": "object"}},
                "build": {"type": "object"}}},
            "Quota": {"type": "object", "required": ["user", "admin", "projects", "jobs"],
                      "properties": {
                "user": {"type": "string"}, "admin": {"type": "boolean"},
                "projects": {"type": "array", "items": {"$ref": "#/components/schemas/Project"}},
                "jobs": {"type": "object", "additionalProperties": {"type": "integer"}}}},
        },
    },
    "security": [{"hubToken": []}],
    "paths": {
        "/api/pool": {"get": {"summary": "The train pool: nodes, GPUs, use",
                              "responses": {"200": _ok("Pool"), **_errors()}}},
        "/api/quota": {"get": {"summary": "Your projects' quotas and use, your job counts",
                               "responses": {"200": _ok("Quota"), **_errors()}}},
        "/api/jobs": {
            "get": {"summary": "Your jobs; ?project=P: that project's queue (you must be a "
                               "member; other users' jobs without command or env); ?all=1: "
                               "every job (admins)",
                    "parameters": [
                        {"name": "project", "in": "query", "schema": {"type": "string"}},
                        {"name": "all", "in": "query", "schema": {"type": "string"}},
                        {"name": "state", "in": "query", "schema": {
                            "type": "string", "enum": ["pending", "running", "succeeded",
                                                       "failed", "cancelled"]}},
                        {"name": "limit", "in": "query", "description": "newest first; "
                         "default 100, at most 1000",
                         "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
                    "responses": {"200": _ok("JobList"), **_errors(400)}},
            "post": {"summary": "Submit a train job. With an Idempotency-Key header (or "
                                "request_id) a retried submit returns the job the first try "
                                "made, with 200, and never makes a second one",
                     "parameters": [{"name": "Idempotency-Key", "in": "header",
                                     "schema": REQUEST_ID}],
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/JobSpec"}}}},
                     "responses": {"201": _ok("Job", "accepted"),
                                   "200": _ok("Job", "accepted before: a retry with the same "
                                                     "key gets the job it made"),
                                   **_errors(400, 409, 413)}},
        },
        "/api/jobs/{job_id}": {
            "get": {"summary": "One of your jobs", "parameters": [JOB_ID],
                    "responses": {"200": _ok("Job"), **_errors(400, 404)}},
            "delete": {"summary": "Cancel one of your jobs", "parameters": [JOB_ID],
                       "responses": {"200": _ok("Job"), **_errors(400, 404, 409)}},
        },
        "/api/jobs/{job_id}/logs": {
            "get": {"summary": "The job's output; ?follow=1 streams until it ends (a few at "
                               "once per user); where output was dropped (the log outgrew "
                               "its limit), a line says so",
                    "parameters": [JOB_ID,
                                   {"name": "follow", "in": "query", "schema": {"type": "string"}},
                                   {"name": "attempt", "in": "query",
                                    "schema": {"type": "integer", "minimum": 1}}],
                    "responses": {"200": _text("the attempt's output (stdout and stderr)"),
                                  **_errors(400, 404)}},
        },
        "/api/projects": {"get": {"summary": "Every project with its quota and use",
                                  "responses": {"200": _ok("ProjectList"), **_errors()}}},
        "/api/projects/{name}": {
            "put": {"summary": "Change or create a project (admins); quotas may not exceed the "
                               "train pool",
                    "parameters": [{"name": "name", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ProjectUpdate"}}}},
                    "responses": {"200": _ok("Project"), **_errors(400, 409, 413)}},
        },
        "/api/slices": {
            "get": {"summary": "Build slices: yours, or all for admins and the spawner",
                    "responses": {"200": _ok("SliceList"), **_errors()}},
            "post": {"summary": "Reserve a build slice for a user's notebook server (the "
                                "spawner, a JupyterHub service, or admins); packed best fit "
                                "within the user's build allowance",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/SliceRequest"}}}},
                     "responses": {"201": _ok("Slice", "reserved"),
                                   **_errors(400, 409, 413)}},
        },
        "/api/slices/{slice_id}": {
            "delete": {"summary": "Release a build slice (the spawner or admins)",
                       "parameters": [{"name": "slice_id", "in": "path", "required": True,
                                       "schema": {"type": "string"}}],
                       "responses": {"200": _ok("Slice"), **_errors(400, 404)}},
        },
        "/metrics": {"get": {"summary": "Prometheus metrics (admins)",
                             "responses": {"200": _text("Prometheus text format 0.0.4"),
                                           **_errors()}}},
        "/api/openapi.json": {"get": {"summary": "This document", "security": [],
                                      "responses": {"200": {
                                          "description": "OpenAPI 3.0.3",
                                          "content": {"application/json": {
                                              "schema": {"type": "object"}}}}}}},
    },
}


def _every_caller_may_hear(*codes: int) -> None:
    """Answers any authenticated call may get: too many unknown tokens lately (429), the hub
    not answering (503), a body over the limit (413, where there is a body)."""
    for path, operations in SPEC["paths"].items():
        for method, op in operations.items():
            if op.get("security") == []:
                continue
            extra = codes + ((413,) if method in ("post", "put") else ())
            for code, response in _errors(*extra).items():
                op["responses"].setdefault(code, response)


_every_caller_may_hear(429, 503)
