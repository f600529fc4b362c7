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
    words = {400: "bad input", 403: "not yours or not allowed", 404: "no such thing",
             409: "quota or state conflict", 413: "body (or job) too large",
             429: "too many: your waiting jobs or followed logs, or unknown tokens lately",
             503: "JupyterHub does not answer, so your rights cannot be checked"}
    return {str(c): {**_ERROR, "description": words[c]} for c in codes}


JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}

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
                    "per_gpu": {"type": "boolean", "default": False,
                                "description": "one rank per GPU (each with its LOCAL_RANK) "
                                "instead of one per node (torchrun-style)"},
                }},
            "Job": {
                "type": "object",
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
                    "per_gpu": {"type": "boolean"},
                    "ranks": {"type": "integer", "nullable": True,
                              "description": "how many ranks (processes with their own log) "
                              "the current attempt has; null until it is placed"},
                    "command": {"type": "array", "items": {"type": "string"},
                                "description": "only for the job's owner and admins"},
                    "env": {"type": "object", "description": "only for the owner and admins"},
                    "workdir": {"type": "string", "nullable": True,
                                "description": "only for the owner and admins"},
                }},
            "JobList": {"type": "object", "properties": {
                "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}}}},
            "Project": {
                "type": "object",
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
            "ProjectList": {"type": "object", "properties": {
                "projects": {"type": "array", "items": {"$ref": "#/components/schemas/Project"}}}},
            "ProjectUpdate": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "quota": {"type": "number", "minimum": 0},
                    "over_quota_weight": {"type": "integer", "minimum": 0},
                    "limit": {"type": "number", "minimum": 0, "nullable": True},
                    "priority": {"type": "integer"},
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
                                 "gpus": {"type": "number", "exclusiveMinimum": 0,
                                          "maximum": 1}}},
            "Slice": {"type": "object", "properties": {
                "id": {"type": "string"}, "user": {"type": "string"},
                "server": {"type": "string"}, "gpus": {"type": "number"},
                "node": {"type": "string"}, "gpu": {"type": "integer"},
                "uuid": {"type": "string", "nullable": True},
                "created": {"type": "number"}}},
            "SliceList": {"type": "object", "properties": {
                "slices": {"type": "array", "items": {"$ref": "#/components/schemas/Slice"}}}},
            "Pool": {"type": "object", "properties": {
                "capacity": {"type": "number"}, "in_use": {"type": "number"},
                "simulated": {"type": "boolean"},
                "nodes": {"type": "array", "items": {"type": "object"}}}},
            "Quota": {"type": "object", "properties": {
                "user": {"type": "string"},
                "projects": {"type": "array", "items": {"$ref": "#/components/schemas/Project"}},
                "jobs": {"type": "object", "additionalProperties": {"type": "integer"}}}},
        },
    },
    "security": [{"hubToken": []}],
    "paths": {
        "/api/pool": {"get": {"summary": "The train pool: nodes, GPUs, use",
                              "responses": {"200": _ok("Pool")}}},
        "/api/quota": {"get": {"summary": "Your projects' quotas and use, your job counts",
                               "responses": {"200": _ok("Quota")}}},
        "/api/jobs": {
            "get": {"summary": "Your jobs; ?project=P: that project's queue (you must be a "
                               "member; other users' jobs without command or env); ?all=1: "
                               "every job (admins)",
                    "parameters": [
                        {"name": "project", "in": "query", "schema": {"type": "string"}},
                        {"name": "all", "in": "query", "schema": {"type": "string"}},
                        {"name": "state", "in": "query", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "description": "newest first; "
                         "default 100, at most 1000",
                         "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}],
                    "responses": {"200": _ok("JobList"), **_errors(400, 403)}},
            "post": {"summary": "Submit a train job",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/JobSpec"}}}},
                     "responses": {"201": _ok("Job", "accepted"),
                                   **_errors(400, 403, 409, 413, 429)}},
        },
        "/api/jobs/{job_id}": {
            "get": {"summary": "One of your jobs", "parameters": [JOB_ID],
                    "responses": {"200": _ok("Job"), **_errors(403, 404)}},
            "delete": {"summary": "Cancel one of your jobs", "parameters": [JOB_ID],
                       "responses": {"200": _ok("Job"), **_errors(403, 404, 409)}},
        },
        "/api/jobs/{job_id}/logs": {
            "get": {"summary": "The output of one rank of the job (rank 0 by default); "
                               "?follow=1 streams until the attempt ends (a few at once per "
                               "user); where output was dropped (the log outgrew its limit), "
                               "a line says so",
                    "parameters": [JOB_ID,
                                   {"name": "follow", "in": "query", "schema": {"type": "string"}},
                                   {"name": "attempt", "in": "query", "schema": {"type": "integer"}},
                                   {"name": "rank", "in": "query", "description": "0 to the "
                                    "attempt's ranks - 1 (the job's ranks field)",
                                    "schema": {"type": "integer", "minimum": 0, "default": 0}}],
                    "responses": {"200": {"description": "text/plain output"},
                                  **_errors(400, 403, 404, 429)}},
        },
        "/api/projects": {"get": {"summary": "Every project with its quota and use",
                                  "responses": {"200": _ok("ProjectList")}}},
        "/api/projects/{name}": {
            "put": {"summary": "Change a project (admins); quotas may not exceed the train pool",
                    "parameters": [{"name": "name", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ProjectUpdate"}}}},
                    "responses": {"200": _ok("Project"), **_errors(400, 403, 404, 409)}},
        },
        "/api/slices": {
            "get": {"summary": "Build slices: yours, or all for admins and the spawner",
                    "responses": {"200": _ok("SliceList")}},
            "post": {"summary": "Reserve a build slice for a user's notebook server (the "
                                "spawner, a JupyterHub service, or admins); packed best fit "
                                "within the user's build allowance",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/SliceRequest"}}}},
                     "responses": {"201": _ok("Slice", "reserved"),
                                   **_errors(400, 403, 409, 413)}},
        },
        "/api/slices/{slice_id}": {
            "delete": {"summary": "Release a build slice (the spawner or admins)",
                       "parameters": [{"name": "slice_id", "in": "path", "required": True,
                                       "schema": {"type": "string"}}],
                       "responses": {"200": _ok("Slice"), **_errors(403, 404)}},
        },
        "/metrics": {"get": {"summary": "Prometheus metrics (admins)",
                             "responses": {"200": {"description": "text/plain; version=0.0.4"},
                                           **_errors(403)}}},
        "/api/openapi.json": {"get": {"summary": "This document", "security": [],
                                      "responses": {"200": {"description": "OpenAPI 3"}}}},
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
