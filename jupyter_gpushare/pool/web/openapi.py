"""The OpenAPI document of the pool service: the one description of every REST path.

Served at ``api/openapi.json``; a test checks it against the service's handlers."""

from __future__ import annotations

from ... import __version__
from ...policy.settings import PoolSettings
from ...sim.history import MAX_GROWTH
from ...trainjob import MAX_NAME, PRIORITY, REQUEST_ID_PATTERN, STATES
from ..store.models import STOPS
from ..whatif.runner import STATES as WHATIF_STATES

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
REQUEST_ID = {"type": "string", "pattern": f"^{REQUEST_ID_PATTERN}$",
              "description": "a key of the client's choosing, e.g. a UUID: a submit retried "
                             "with the same key returns the job the first try made (200) "
                             "instead of making a second one"}
SLICE_ID = {"name": "slice_id", "in": "path", "required": True, "schema": {"type": "string"}}
VIA = {"name": "Gpushare-Via", "in": "header", "schema": {"type": "string"},
       "description": "cli from the gpushare command: the audit trail notes the door an "
                      "admin's change came through (anything else: api)"}
_AUDIT_VALUES = {"type": "object", "nullable": True, "additionalProperties": True,
                 "description": "the fields changed, as admins set them (GPUs); null where "
                                "there was none before (a new project) or is none after"}
_RATIO = {"type": "number", "nullable": True}
_FIGURES = {
    "allocated_gpu_seconds": {"type": "number"}, "utilized_gpu_seconds": {"type": "number"},
    "idle_gpu_seconds": {"type": "number", "description": "held while the holder's SM "
                         "utilization stayed below idle_threshold"},
    "measured_gpu_seconds": {"type": "number", "description": "allocated while utilization "
                             "could be measured (not on MIG or a lost GPU)"},
    "allocation": {**_RATIO, "description": "allocated ÷ (GPUs of the pool drawn on × window)"},
    "utilization": {**_RATIO, "description": "utilized ÷ measured; a slice's can pass 1 when it "
                    "uses more than its share of a time-sliced GPU"},
    "idle_ratio": {**_RATIO, "description": "idle ÷ allocated"},
    "memory_peak_bytes": {"type": "integer"},
}
_HOLDER_NOW = {"type": "object", "nullable": True, "description": "null until the first reading "
               "that saw it", "properties": {
                   "sm_now": {**_RATIO, "description": "SM utilization of what it holds, 0–1"},
                   "memory_now_bytes": {"type": "integer"},
                   "sm_last_hour": _RATIO,
                   "memory_peak_last_hour_bytes": {"type": "integer"},
                   "idle_for_s": {"type": "number", "nullable": True, "description": "seconds "
                                  "it has stayed below idle_threshold; null while in use"},
                   "idle": {"type": "boolean", "description": "idle for GPUUsage.idle_job_after "
                            "or longer"},
                   "at": {"type": "number", "description": "when it was last read"},
                   "minutes": {"type": "array", "description": "the last hour, minute by "
                               "minute (the current one so far): [minute start, SM 0–1 or "
                               "null, memory peak bytes]", "items": {
                                   "type": "array", "minItems": 3, "maxItems": 3,
                                   "items": {"type": "number", "nullable": True}}}}}

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
                    "name": {"type": "string", "maxLength": MAX_NAME},
                    "priority": {"type": "integer", "minimum": PRIORITY[0],
                                 "maximum": PRIORITY[1], "default": 0,
                                 "description": "orders the job within its project only; "
                                                "within the project's job_priority_min and "
                                                "job_priority_max"},
                    "env": {"type": "object", "additionalProperties": {"type": "string"}},
                    "workdir": {"type": "string", "description": "absolute path the job runs "
                                "in; default: your home directory"},
                    "request_id": REQUEST_ID,
                    "per_gpu": {"type": "boolean", "default": False,
                                "description": "one rank per GPU (each with its LOCAL_RANK) "
                                "instead of one per node (torchrun-style)"},
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
                    "state": {"type": "string", "enum": list(STATES)},
                    "attempt": {"type": "integer"},
                    "queue_position": {"type": "integer", "nullable": True},
                    "reason": {"type": "string", "description": "why it waits, in words"},
                    "submitted": {"type": "number"}, "started": {"type": "number", "nullable": True},
                    "finished": {"type": "number", "nullable": True},
                    "exit_code": {"type": "integer", "nullable": True},
                    "placement": {"type": "object", "additionalProperties": {"type": "number"}},
                    "preempting": {"type": "boolean"},
                    "usage": {**_HOLDER_NOW, "description": "running jobs: SM utilization and "
                              "memory now and over the last hour, idle time"},
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
                    "in_use": {"type": "number", "description": "GPUs its jobs hold, lent "
                               "build GPUs too"},
                    "borrowed": {"type": "number", "description": "GPUs its jobs hold beyond "
                                 "its quota, lent build GPUs too"},
                    "lent": {"type": "number", "description": "GPUs its jobs hold on build "
                             "GPUs lent to the train pool (part of borrowed)"},
                    "deserved": {"type": "number"}, "pending": {"type": "integer"},
                    "department": {"type": "string", "nullable": True,
                                   "description": "the department the project belongs to"},
                }},
            "Department": {
                "type": "object",
                "required": ["name", "quota", "over_quota_weight", "limit", "projects",
                             "in_use", "borrowed", "deserved"],
                "properties": {
                    "name": {"type": "string"}, "quota": {"type": "number"},
                    "over_quota_weight": {"type": "integer"},
                    "limit": {"type": "number", "nullable": True},
                    "projects": {"type": "array", "items": {"type": "string"}},
                    "in_use": {"type": "number", "description": "GPUs its projects hold, "
                               "lent build GPUs too"},
                    "borrowed": {"type": "number", "description": "GPUs its projects hold "
                                 "beyond the department's quota, lent build GPUs too"},
                    "lent": {"type": "number", "description": "GPUs its projects hold on "
                             "lent build GPUs (part of borrowed)"},
                    "deserved": {"type": "number"},
                }},
            "DepartmentList": {"type": "object", "required": ["departments"], "properties": {
                "departments": {"type": "array",
                                "items": {"$ref": "#/components/schemas/Department"}}}},
            "DepartmentUpdate": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "quota": {"type": "number", "minimum": 0, "maximum": 1_000_000},
                    "over_quota_weight": {"type": "integer", "minimum": 0, "maximum": 1000},
                    "limit": {"type": "number", "minimum": 0, "maximum": 1_000_000,
                              "nullable": True},
                    "projects": {"type": "array", "maxItems": 1000,
                                 "items": {"type": "string"},
                                 "description": "its projects, all of them: those left out "
                                                "leave the department"},
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
                    "job_priority_min": {"type": "integer", "minimum": PRIORITY[0],
                                         "maximum": PRIORITY[1],
                                         "description": "lowest priority members may give "
                                                        "their jobs (default -100)"},
                    "job_priority_max": {"type": "integer", "minimum": PRIORITY[0],
                                         "maximum": PRIORITY[1],
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
                "created": {"type": "number"},
                "pid": {"type": "integer", "nullable": True,
                        "description": "its notebook server's process, where the spawner says"},
                "usage": _HOLDER_NOW,
                "cull": {"type": "object", "nullable": True, "description": "set while its "
                         "server is warned that it will be culled", "properties": {
                             "warned_at": {"type": "number"}, "cull_at": {"type": "number"},
                             "reason": {"type": "string"}}}}},
            "SliceList": {"type": "object", "required": ["slices"], "properties": {
                "slices": {"type": "array", "items": {"$ref": "#/components/schemas/Slice"}}}},
            "Pool": {"type": "object", "required": ["capacity", "in_use", "simulated", "nodes",
                                                    "build"], "properties": {
                "capacity": {"type": "number"}, "in_use": {"type": "number"},
                "simulated": {"type": "boolean"},
                "nodes": {"type": "array", "items": {"$ref": "#/components/schemas/PoolNode"}},
                "build": {"type": "object", "description": "the build pool; with "
                          "lend_build_gpus, the build GPUs lent to train jobs now",
                          "properties": {
                              "lending": {"type": "boolean"}, "reserve": {"type": "integer"},
                              "lent": {"type": "array", "items": {
                                  "type": "object", "properties": {
                                      "node": {"type": "string"}, "gpu": {"type": "integer"},
                                      "job": {"type": "string", "nullable": True,
                                              "description": "the job on it, for those "
                                              "who may see it"},
                                      "held": {"type": "boolean"},
                                      "taking_back": {"type": "boolean"}}}}}},
                "gpus": {"type": "array", "items": {"$ref": "#/components/schemas/PoolGPU"},
                         "description": "the pool map: every GPU read, by node and index"},
                "usage_notes": {"type": "array", "items": {"type": "string"}, "description":
                                "one sentence per thing that could not be read (MIG, a lost "
                                "GPU, no NVML, processes outside gpushare)"},
                "usage_source": {"type": "string", "enum": ["nvml", "standin", "off"]},
                "culling": {"type": "object", "description": "with culling on: its settings, "
                            "servers stopped so far, and the latest warnings, stops and "
                            "reprieves (yours; admins: all)", "properties": {
                                "after": {"type": "number"}, "warning": {"type": "number"},
                                "culled": {"type": "integer"},
                                "events": {"type": "array", "items": {"type": "object"}}}}}},
            "PoolNode": {"type": "object", "required": ["name", "gpus", "pool", "drained"],
                         "properties": {
                "name": {"type": "string"}, "gpus": {"type": "integer"},
                "pool": {"type": "string"}, "labels": {"type": "object"},
                "drained": {"type": "boolean", "description": "no new job starts there "
                            "(PUT api/nodes/{node})"},
                "drained_by": {"type": "string", "description": "the admin who drained it"},
                "drained_since": {"type": "number"}}},
            "NodeDrain": {"type": "object", "additionalProperties": False,
                          "required": ["drained"], "properties": {
                "drained": {"type": "boolean", "description": "true: no new job starts on "
                            "the node (what runs there finishes); false: it takes jobs again"},
                "requeue": {"type": "boolean", "default": False, "description": "with "
                            "drained: stop the jobs that run there as a preemption does (their "
                            "grace period, then requeued to resume from their checkpoints)"}}},
            "NodeState": {"type": "object", "required": ["name", "drained", "requeued"],
                          "properties": {
                "name": {"type": "string"}, "drained": {"type": "boolean"},
                "by": {"type": "string"}, "since": {"type": "number"},
                "requeued": {"type": "array", "items": {"type": "string"},
                             "description": "the jobs told to stop (with requeue)"}}},
            "AuditEntry": {"type": "object", "required": ["id", "at", "who", "action", "target",
                                                          "before", "after", "via"],
                           "properties": {
                "id": {"type": "integer"}, "at": {"type": "number"},
                "who": {"type": "string", "description": "the admin; configuration; "
                        "gpushare (culling); the user whose notebook server took back a "
                        "lent build GPU"},
                "action": {"type": "string", "description": "create project, change project, "
                           "cancel job, drain node, undrain node, cull server, "
                           "take back GPU, cancel what-if"},
                "target": {"type": "string"},
                "before": _AUDIT_VALUES, "after": _AUDIT_VALUES,
                "via": {"type": "string", "enum": ["api", "dashboard", "cli", "config",
                                                   "culling", "lending"]},
                "address": {"type": "string", "nullable": True,
                            "description": "the client's address, where there was one"}}},
            "AuditList": {"type": "object", "required": ["entries", "next"], "properties": {
                "entries": {"type": "array", "items": {"$ref": "#/components/schemas/AuditEntry"}},
                "next": {"type": "integer", "nullable": True, "description": "before= this "
                         "for the next page; null on the last"}}},
            "PoolGPU": {"type": "object", "properties": {
                "node": {"type": "string"}, "index": {"type": "integer"},
                "uuid": {"type": "string"}, "pool": {"type": "string"},
                "name": {"type": "string"}, "lost": {"type": "boolean"},
                "utilization": {**_RATIO, "description": "SM utilization now, 0–1"},
                "memory_used_bytes": {"type": "integer", "nullable": True},
                "memory_total_bytes": {"type": "integer"},
                "held": {"type": "number", "description": "GPUs of it held"},
                "holders": {"type": "array", "items": {"type": "object", "properties": {
                    "kind": {"type": "string", "enum": ["job", "slice"]},
                    "gpus": {"type": "number"}, "sm": _RATIO,
                    "memory_bytes": {"type": "integer"},
                    "idle_for_s": {"type": "number", "nullable": True},
                    "project": {"type": "string"},
                    "user": {"type": "string", "description": "admins, the holder, and (for "
                             "jobs) members of its project"},
                    "job": {"type": "string"}, "attempt": {"type": "integer"},
                    "slice": {"type": "string"}}}},
                "outside": {"type": "object", "properties": {
                    "processes": {"type": "integer"}, "memory_bytes": {"type": "integer"}},
                    "description": "processes on it that no job or slice of gpushare owns"},
                "at": {"type": "number"}}},
            "UsageRow": {"type": "object", "description": "one project, user, job, slice or GPU "
                         "(the fields named by `by`) with its figures", "properties": {
                "project": {"type": "string"}, "user": {"type": "string"},
                "job": {"type": "string"}, "slice": {"type": "string"},
                "gpu": {"type": "string"}, "node": {"type": "string"},
                "t": {"type": "integer", "description": "series only: the bucket's start"},
                **_FIGURES}},
            "HistoryJob": {"type": "object", "description": "a recorded train job as a line of "
                           "the simulator's trace format (docs/reference/trace-format.md), "
                           "with what was recorded of it", "properties": {
                "job_id": {"type": "string"},
                "submit_time": {"type": "number", "description": "seconds from since"},
                "duration": {"type": "number", "description": "the run time the replay gives "
                             "it: its last attempt's, plus what earlier attempts saved by "
                             "checkpoints"},
                "gpus": {"type": "integer"}, "project": {"type": "string"},
                "user": {"type": "string"}, "priority": {"type": "integer"},
                "kind": {"type": "string", "enum": ["train"]},
                "submitted": {"type": "number", "description": "epoch seconds"},
                "held_s": {"type": "number", "description": "seconds it held its GPUs, all "
                           "attempts together"},
                "queued_s": {"type": "number"}, "first_start_s": {"type": "number"},
                "end_s": {"type": "number"}, "attempts": {"type": "integer"},
                "stops": {"type": "array", "description": "why the pool stopped each attempt "
                          "it stopped, in order (docs/reference/trace-format.md)",
                          "items": {"type": "string", "enum": list(STOPS)}},
                "state": {"type": "string"},
                "utilization": {"type": "number", "nullable": True, "description": "as "
                                "api/usage?by=job measured it; null where not measured"}}},
            "History": {"type": "object", "properties": {
                "since": {"type": "number"}, "until": {"type": "number"},
                "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/HistoryJob"}},
                "next": {"type": "string", "nullable": True, "description": "give it as after "
                         "for the next page; null on the last"},
                "settings": {"type": "object", "description": "what decides in this pool "
                             "(PoolSettings), whole: a replay decides by it",
                             "properties": {
                                 k: {"type": "boolean" if isinstance(v, bool) else "number"}
                                 for k, v in PoolSettings().to_json().items()}},
                "build": {"type": "object", "description": "first page only, where the pool "
                          "has build nodes: the build pool a replay lends GPUs from "
                          "(sim/slice_history.py, sim/replay_build.py)", "properties": {
                    "nodes": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"}, "gpus": {"type": "integer"}}}},
                    "allowance": {"type": "number"}, "lending": {"type": "boolean"},
                    "reserve": {"type": "integer"}, "lend_again_after_s": {"type": "number"},
                    "take_backs_per_user": {"type": "integer"},
                    "take_back_window_s": {"type": "number"},
                    "sessions": {"type": "array", "description": "notebook sessions held in "
                                 "the window, as kind=build trace lines", "items": {
                                     "type": "object"}},
                    "take_backs": {"type": "array", "items": {"type": "object"}},
                    "sessions_left_off": {"type": "integer", "description": "sessions beyond "
                                          "the bound, not listed"}}}}},
            "WhatIf": {"type": "object", "properties": {
                "id": {"type": "string"},
                "state": {"type": "string", "enum": list(WHATIF_STATES)},
                "progress": {"type": "number", "minimum": 0, "maximum": 1},
                "request": {"type": "object"}, "started": {"type": "number"},
                "finished": {"type": "number", "nullable": True},
                "result": {"type": "object", "nullable": True, "description": "recorded, "
                           "today and changed side by side: allocation, utilization, queueing "
                           "p50/p95 per project, guarantee wait"},
                "error": {"type": "string", "nullable": True, "description": "why it "
                          "failed, timed out or was cancelled, in a sentence"}}},
            "Usage": {"type": "object", "properties": {
                "since": {"type": "integer"}, "until": {"type": "integer",
                                                         "description": "the window, widened to "
                                                         "whole minutes (hours where only hour "
                                                         "rows are kept)"},
                "by": {"type": "string"}, "step": {"type": "integer", "nullable": True},
                "sort": {"type": "string"}, "idle_threshold": {"type": "number"},
                "pools": {"type": "object", "additionalProperties": {"type": "object",
                          "properties": {"capacity_gpu_seconds": {"type": "number"},
                                         "average_utilization": {**_RATIO, "description":
                                                                 "utilized ÷ capacity: the "
                                                                 "average GPU utilization"},
                                         **_FIGURES}}},
                "rows": {"type": "array", "items": {"$ref": "#/components/schemas/UsageRow"}},
                "series": {"type": "array", "items": {"$ref": "#/components/schemas/UsageRow"},
                           "description": "with step: one point per bucket and row"},
                "definitions": {"type": "object", "additionalProperties": {"type": "string"}}}},
            "Samples": {"type": "object", "required": ["node", "gpus"], "description": "a node "
                        "agent's reading of its GPUs", "properties": {
                "node": {"type": "string"}, "at": {"type": "number"},
                "problem": {"type": "string", "description": "why no GPU could be read"},
                "gpus": {"type": "array", "maxItems": 64, "items": {"type": "object",
                         "required": ["uuid"], "properties": {
                    "index": {"type": "integer"}, "uuid": {"type": "string"},
                    "name": {"type": "string"}, "memory_total": {"type": "integer"},
                    "memory_used": {"type": "integer", "nullable": True},
                    "utilization": {"type": "number", "nullable": True, "maximum": 100},
                    "note": {"type": "string"}, "lost": {"type": "boolean"},
                    "held_by": {"type": "array", "items": {"$ref": "#/components/schemas/Owner"}},
                    "processes": {"type": "array", "maxItems": 512, "items": {
                        "$ref": "#/components/schemas/SampledProcess"}},
                    "mig": {"type": "array", "maxItems": 16, "items": {"type": "object"}}}}}}},
            "SampledProcess": {"type": "object", "required": ["pid"], "properties": {
                "pid": {"type": "integer"}, "memory": {"type": "integer", "nullable": True},
                "sm": {"type": "number", "nullable": True, "maximum": 100},
                "owner": {"$ref": "#/components/schemas/Owner"}}},
            "Owner": {"type": "object", "nullable": True, "description": "{job, attempt} or "
                      "{slice}; believed only where the pool agrees it runs on that node",
                      "properties": {"job": {"type": "string"}, "attempt": {"type": "integer"},
                                     "slice": {"type": "string"}}},
            "Quota": {"type": "object", "required": ["user", "admin", "projects", "jobs"],
                      "properties": {
                "user": {"type": "string"}, "admin": {"type": "boolean"},
                "projects": {"type": "array", "items": {"$ref": "#/components/schemas/Project"}},
                "departments": {"type": "array", "description": "the departments your "
                                "projects belong to",
                                "items": {"$ref": "#/components/schemas/Department"}},
                "jobs": {"type": "object", "additionalProperties": {"type": "integer"}}}},
        },
    },
    "security": [{"hubToken": []}],
    "paths": {
        "/api/pool": {"get": {"summary": "The train pool: nodes, GPUs, use; the pool map "
                                         "(each GPU's holders, utilization and memory now)",
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
                            "type": "string", "enum": list(STATES)}},
                        {"name": "limit", "in": "query", "description": "newest first; "
                         "default 100, at most 1000",
                         "schema": {"type": "integer", "minimum": 1, "maximum": 1000}},
                        {"name": "If-None-Match", "in": "header", "description": "the ETag "
                         "of the last answer: 304 without a body if the list is unchanged",
                         "schema": {"type": "string"}}],
                    "responses": {"200": _ok("JobList"),
                                  "304": {"description": "unchanged since the answer whose "
                                                         "ETag was sent"},
                                  **_errors(400)}},
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
            "delete": {"summary": "Cancel one of your jobs (admins: anyone's, noted in the "
                                  "audit trail)", "parameters": [JOB_ID, VIA],
                       "responses": {"200": _ok("Job"), **_errors(400, 404, 409)}},
        },
        "/api/jobs/{job_id}/logs": {
            "get": {"summary": "The output of one rank of the job (rank 0 by default); "
                               "?follow=1 streams until the attempt ends (a few at once per "
                               "user); where output was dropped (the log outgrew its limit), "
                               "a line says so",
                    "parameters": [JOB_ID,
                                   {"name": "follow", "in": "query", "schema": {"type": "string"}},
                                   {"name": "attempt", "in": "query",
                                    "schema": {"type": "integer", "minimum": 1}},
                                   {"name": "rank", "in": "query", "description": "0 to the "
                                    "attempt's ranks - 1 (the job's ranks field)",
                                    "schema": {"type": "integer", "minimum": 0, "default": 0}}],
                    "responses": {"200": _text("the output of one rank of the attempt (stdout "
                                               "and stderr)"),
                                  **_errors(400, 404)}},
        },
        "/api/projects": {"get": {"summary": "Every project with its quota and use",
                                  "responses": {"200": _ok("ProjectList"), **_errors()}}},
        "/api/projects/{name}": {
            "put": {"summary": "Change or create a project (admins); quotas may not exceed the "
                               "train pool",
                    "parameters": [{"name": "name", "in": "path", "required": True,
                                    "schema": {"type": "string"}}, VIA],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ProjectUpdate"}}}},
                    "responses": {"200": _ok("Project"), **_errors(400, 409, 413)}},
        },
        "/api/departments": {"get": {"summary": "Every department with its quota, projects "
                                            "and use",
                                     "responses": {"200": _ok("DepartmentList"), **_errors()}}},
        "/api/departments/{name}": {
            "get": {"summary": "One department",
                    "parameters": [{"name": "name", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _ok("Department"), **_errors(404)}},
            "put": {"summary": "Change or create a department (admins): its projects' quotas "
                               "must fit in its quota, and departments' quotas in the train "
                               "pool. Noted in the audit trail",
                    "parameters": [{"name": "name", "in": "path", "required": True,
                                    "schema": {"type": "string"}}, VIA],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/DepartmentUpdate"}}}},
                    "responses": {"200": _ok("Department"), **_errors(400, 409, 413)}},
            "delete": {"summary": "Remove a department (admins): its projects keep their "
                                  "quotas, on one level. Noted in the audit trail",
                       "parameters": [{"name": "name", "in": "path", "required": True,
                                       "schema": {"type": "string"}}, VIA],
                       "responses": {"200": _ok("Department"), **_errors(400, 404)}},
        },
        "/api/nodes/{node}": {
            "put": {"summary": "Drain a train node (admins): no new job starts there; with "
                               "requeue, the jobs that run there are preempted and requeued. "
                               "drained false undrains it. Noted in the audit trail",
                    "parameters": [{"name": "node", "in": "path", "required": True,
                                    "schema": {"type": "string"}}, VIA],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/NodeDrain"}}}},
                    "responses": {"200": _ok("NodeState"), **_errors(400, 404, 413)}},
        },
        "/api/audit": {
            "get": {"summary": "The audit trail, newest first (admins): project changes, "
                               "cancels of other users' jobs, drained nodes, culled servers; "
                               "kept PoolService.audit_retention_days",
                    "parameters": [
                        {"name": "since", "in": "query", "description": "only entries from "
                         "then on: 7d, 24h, 30m, epoch seconds or ISO 8601",
                         "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {
                            "type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
                        {"name": "before", "in": "query", "description": "entries older than "
                         "this id: the next of the answer before",
                         "schema": {"type": "integer", "minimum": 0}}],
                    "responses": {"200": _ok("AuditList"), **_errors(400)}},
        },
        "/api/slices": {
            "get": {"summary": "Build slices: yours, or all for admins and the spawner (the "
                               "service PoolService.spawner_service; other services: 403)",
                    "responses": {"200": _ok("SliceList"), **_errors()}},
            "post": {"summary": "Reserve a build slice for a user's notebook server (the "
                                "spawner, the service PoolService.spawner_service, or "
                                "admins); packed best fit within the user's build allowance",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/SliceRequest"}}}},
                     "responses": {"201": _ok("Slice", "reserved"),
                                   **_errors(400, 409, 413), "409": {
                                       **_ERROR, "description": "no room (the build pool is "
                                       "full, or the allowance used); while a GPU lent to "
                                       "train jobs is taken back for it, Retry-After says "
                                       "within how many seconds it is free: ask again",
                                       "headers": {"Retry-After": {
                                           "description": "seconds until the GPU is back",
                                           "schema": {"type": "integer", "minimum": 0}}}}}},
        },
        "/api/slices/{slice_id}": {
            "patch": {"summary": "Say which process is the slice's notebook server (the "
                                 "spawner or admins), so its GPU use is attributed to it",
                      "parameters": [SLICE_ID],
                      "requestBody": {"required": True, "content": {"application/json": {
                          "schema": {"type": "object", "required": ["pid"], "properties": {
                              "pid": {"type": "integer", "minimum": 1}}}}}},
                      "responses": {"200": _ok("Slice"), **_errors(400, 403, 404)}},
            "delete": {"summary": "Release a build slice (the spawner or admins)",
                       "parameters": [SLICE_ID],
                       "responses": {"200": _ok("Slice"), **_errors(400, 403, 404)}},
        },
        "/api/usage": {
            "get": {"summary": "Allocation and utilization over a window, by project, user, "
                               "job, slice or GPU (admins: everything; users: their own and "
                               "their projects'; by=gpu: admins)",
                    "parameters": [
                        {"name": "since", "in": "query", "description": "7d (default), 12h, "
                         "30m, epoch seconds or ISO 8601", "schema": {"type": "string"}},
                        {"name": "until", "in": "query", "description": "now (default), or as "
                         "since", "schema": {"type": "string"}},
                        {"name": "by", "in": "query", "description": "department: the "
                         "projects' rows added up by the department each belongs to now "
                         "((no department) for the rest)",
                         "schema": {"type": "string", "enum": [
                            "project", "department", "user", "job", "slice", "gpu"],
                            "default": "project"}},
                        {"name": "step", "in": "query", "description": "a time series too, one "
                         "point per step (1m, 1h, 1d; whole minutes)", "schema": {"type":
                                                                                "string"}},
                        {"name": "sort", "in": "query", "description": "idle: the top "
                         "idle-allocated first", "schema": {"type": "string", "enum": [
                             "allocated", "idle", "utilization", "name"]}},
                        {"name": "limit", "in": "query", "schema": {
                            "type": "integer", "minimum": 1, "maximum": 1000, "default": 100}},
                        {"name": "format", "in": "query", "description": "csv: the rows in "
                         "GPU-hours and GPU-seconds, for spreadsheets", "schema": {
                             "type": "string", "enum": ["json", "csv"], "default": "json"}}],
                    "responses": {"200": {"description": "OK", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Usage"}},
                        "text/csv": {"schema": {"type": "string"}}}},
                        **_errors(400, 403)}},
        },
        "/api/history": {
            "get": {"summary": "The recorded train jobs submitted in a window, in the "
                               "simulator's trace format, page by page (admins); format=csv "
                               "gives a file gpushare simulate --trace reads",
                    "parameters": [
                        {"name": "since", "in": "query", "description": "30d (default), 12h, "
                         "epoch seconds, a date 2026-10-01 or ISO 8601",
                         "schema": {"type": "string"}},
                        {"name": "until", "in": "query", "description": "now (default), or as "
                         "since", "schema": {"type": "string"}},
                        {"name": "limit", "in": "query", "schema": {
                            "type": "integer", "minimum": 1, "maximum": 10000,
                            "default": 1000}},
                        {"name": "after", "in": "query", "description": "the previous page's "
                         "next", "schema": {"type": "string"}},
                        {"name": "format", "in": "query", "schema": {
                            "type": "string", "enum": ["json", "csv"], "default": "json"}}],
                    "responses": {"200": {"description": "OK", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/History"}},
                        "text/csv": {"schema": {"type": "string"}}}},
                        **_errors(400, 403)}},
        },
        "/api/whatif": {
            "post": {"summary": "Replay the recorded history under today's settings and under "
                                "a changed capacity or quotas, in a worker process (admins); "
                                "one at a time: 409 while one runs; stopped after "
                                "PoolService.whatif_timeout seconds",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"type": "object", "properties": {
                             "since": {"type": "string", "default": "30d"},
                             "until": {"type": "string"},
                             "capacity": {"type": "string", "description": "+K, -K or N "
                                          f"GPUs; the pool may have at most {MAX_GROWTH} "
                                          "times today's train GPUs (400 beyond)",
                                          "pattern": "^[+-]?[0-9]{1,6}$"},
                             "quotas": {"type": "object", "additionalProperties": {
                                 "type": "number", "minimum": 0}}}}}}},
                     "responses": {"202": _ok("WhatIf", "started"),
                                   **_errors(400, 403, 409)}},
        },
        "/api/whatif/{whatif_id}": {
            "get": {"summary": "A what-if replay: its progress, then its result (admins; the "
                               "last 10 are kept)",
                    "parameters": [{"name": "whatif_id", "in": "path", "required": True,
                                    "schema": {"type": "string"}}],
                    "responses": {"200": _ok("WhatIf"), **_errors(403, 404)}},
            "delete": {"summary": "Cancel a running what-if: its worker is killed, its state "
                                  "becomes stopped and the next may start; noted in the "
                                  "audit trail (admins). A finished one is answered as it is",
                       "parameters": [{"name": "whatif_id", "in": "path", "required": True,
                                       "schema": {"type": "string"}}],
                       "responses": {"200": _ok("WhatIf"), **_errors(403, 404)}},
        },
        "/api/activity": {
            "post": {"summary": "A notebook server says how many of its kernels are busy (its "
                                "gpushare extension, with the server's token); culling never "
                                "stops a server with a busy kernel. Only for the caller's own "
                                "servers that hold a build slice: 404 for any other",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"type": "object", "required": ["server", "kernels", "busy"],
                                    "properties": {"server": {"type": "string"},
                                                   "kernels": {"type": "integer", "minimum": 0},
                                                   "busy": {"type": "integer", "minimum": 0}}}}}},
                     "responses": {"204": {"description": "noted"},
                                   **_errors(400, 403, 404)}},
        },
        "/api/samples": {
            "post": {"summary": "A node agent's reading of its GPUs, for the node it proves "
                                "it is on: a service of GPUUsage.agent_nodes, or the service "
                                "GPUUsage.agent_service with its pod's projected token "
                                "(audience gpushare) in Gpushare-Node-Token; 403 for another "
                                "node, 503 while Kubernetes cannot say",
                     "parameters": [{"name": "Gpushare-Node-Token", "in": "header",
                                     "schema": {"type": "string"}, "description": "the agent "
                                     "pod's service-account token (agent_service only)"}],
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/Samples"}}}},
                     "responses": {"202": {"description": "taken"},
                                   **_errors(400, 403, 413, 503)}},
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
