"""The fixed pieces of the OpenAPI document.

Parameters with the limits the server enforces, the problem and declared-error schemas, the feed
operations and the framework's own routes.
"""

from __future__ import annotations

from typing import Any

_MS = r"(0|[1-9][0-9]{0,14})"
_UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
#: A command id (also a job id): ``v1.<issued_ms>.<expires_ms>.<uuid4>``.
COMMAND_ID_PATTERN = rf"^v1\.{_MS}\.{_MS}\.{_UUID4}$"
#: An event cursor: the sequence number of the last event seen.
CURSOR_PATTERN = r"^(0|[1-9][0-9]{0,18})$"
_SECURITY = list[dict[str, list[str]]]


def _problem_content() -> dict[str, Any]:
    return {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def refusals() -> dict[str, Any]:
    """The responses every operation may give besides its own: problems."""
    return {
        "401": {
            "description": "Credentials missing where the caller may not be anonymous, or "
            "invalid (reason `Unauthorized`, code `missing_credentials`, "
            "`invalid_credentials` or `expired`).",
            "content": _problem_content(),
        },
        "default": {"description": "A refusal (problem+json).", "content": _problem_content()},
    }


def id_parameter(singleton: bool) -> dict[str, Any]:
    """The ``{id}`` path parameter with the limits the server enforces."""
    if singleton:
        return {
            "name": "id",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "enum": ["_"]},
            "description": "A singleton's id is '_'.",
        }
    return {
        "name": "id",
        "in": "path",
        "required": True,
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": 256,
            "pattern": r"^[^\u0000-\u001f\u007f]+$",
        },
        "description": "The actor id: 1-256 bytes of UTF-8 without control characters "
        "(U+0000-U+001F, U+007F).",
    }


IDEMPOTENCY_KEY: dict[str, Any] = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": True,
    "schema": {"type": "string", "pattern": COMMAND_ID_PATTERN},
    "description": "The command id, `v1.<issued_ms>.<expires_ms>.<uuid4>`: mint one with "
    "POST /command-ids (its span must be this deployment's retry window and it must not be "
    "expired). Sending the same id again replays the first outcome.",
}


def problem_schema() -> dict[str, Any]:
    """The schema of every refusal's problem+json body (RFC 9457 plus akter's ``reason``)."""
    return {
        "type": "object",
        "title": "Problem",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "reason": {"type": "string"},
            "code": {"type": "string"},
            "retryable": {"type": "boolean"},
            "retry_after": {"type": "number"},
            "command_id": {"type": "string"},
            "field": {"type": "string"},
        },
        "required": ["status", "reason", "detail"],
    }


def declared_error_schema(tag: str, fields: dict[str, Any], name: str) -> dict[str, Any]:
    """The problem body of one declared error: ``error`` is its tag, ``fields`` its fields."""
    return {
        "type": "object",
        "title": name,
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer", "const": 422},
            "detail": {"type": "string"},
            "reason": {"type": "string", "const": "DeclaredError"},
            "error": {"type": "string", "const": tag},
            "fields": fields,
        },
        "required": ["status", "reason", "detail", "error", "fields"],
    }


def _stream_responses(what: str) -> dict[str, Any]:
    return {
        "200": {
            "description": f"{what} A comment line (`: keep-alive`) is sent every 15 s while "
            "the feed is idle.",
            "content": {"text/event-stream": {}},
        },
        **refusals(),
    }


def events_operation(type_name: str, singleton: bool, security: _SECURITY) -> dict[str, Any]:
    """An actor type's event feed (server-sent events, resumable)."""
    cursor = {"type": "string", "pattern": CURSOR_PATTERN}
    return {
        "operationId": f"{type_name}.events",
        "tags": [type_name],
        "summary": "Server-sent events: replay after a cursor, then follow live.",
        "parameters": [
            id_parameter(singleton),
            {
                "name": "Last-Event-ID",
                "in": "header",
                "schema": cursor,
                "description": "Resume after this event: the `id` of the last frame seen (a "
                "sequence number no greater than the actor's last event). Wins over `after`.",
            },
            {
                "name": "after",
                "in": "query",
                "schema": cursor,
                "description": "Resume after this sequence number, as `Last-Event-ID` does "
                "(for clients that cannot set headers, such as EventSource). Without either, "
                "the feed starts at the oldest retained event.",
            },
        ],
        "responses": _stream_responses(
            "An event stream: one frame per event, named by its tag, with the cursor as `id`; "
            "a `retention_gap` frame ends a feed whose cursor was pruned."
        ),
        "security": security,
    }


def progress_operation(type_name: str, singleton: bool, security: _SECURITY) -> dict[str, Any]:
    """An actor type's job-progress feed."""
    return {
        "operationId": f"{type_name}.job_progress",
        "tags": [type_name],
        "summary": "Server-sent progress of one of the actor's jobs, then its close.",
        "parameters": [
            id_parameter(singleton),
            {
                "name": "job_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": COMMAND_ID_PATTERN},
                "description": "The job id `enqueue` returned.",
            },
        ],
        "responses": {
            **_stream_responses(
                "`progress` frames with the job's reports, then one `closed` frame whose "
                "`outcome` is `succeeded`, `dead_lettered`, `cancelled` or `unknown`. A job "
                "that already ended closes at once (`attempt` null), its outcome read from the "
                "route or dead letter its end left."
            ),
            "404": {
                "description": "No row names the job (reason `InvalidInput`, code "
                "`unknown_job`): never enqueued, another actor's, or ended without leaving a "
                "route or a dead letter. Also an unknown actor type (code `unknown_type`).",
                "content": _problem_content(),
            },
        },
        "security": security,
    }


def framework_paths(security: _SECURITY) -> dict[str, Any]:
    """The path items every app serves besides its actors: command ids, readiness, metrics."""
    return {
        "/command-ids": {
            "post": {
                "operationId": "mint_command_id",
                "summary": "Mint a command id from the server's clock (writes nothing).",
                "responses": {
                    "200": {
                        "description": "A fresh command id.",
                        "content": {
                            "application/json": {"schema": {"$ref": _SCHEMAS + "CommandId"}}
                        },
                    },
                    **refusals(),
                },
                "security": security,
            }
        },
        "/ready": {
            "get": {
                "operationId": "ready",
                "summary": "Readiness for probes.",
                "responses": {
                    status: {
                        "description": what,
                        "content": {
                            "application/json": {"schema": {"$ref": _SCHEMAS + "Readiness"}}
                        },
                    }
                    for status, what in (("200", "Ready."), ("503", "Not ready."))
                },
                "security": [{}],
            }
        },
        "/metrics": {
            "get": {
                "operationId": "metrics",
                "summary": "Prometheus metrics (text exposition format 0.0.4).",
                "responses": {
                    "200": {
                        "description": "The metrics; they hold no actor ids or tenants.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
                "security": [{}],
            }
        },
    }


_SCHEMAS = "#/components/schemas/"


def framework_schemas() -> dict[str, Any]:
    """The components the framework routes refer to."""
    return {
        "CommandId": {
            "type": "object",
            "title": "CommandId",
            "properties": {"command_id": {"type": "string", "pattern": COMMAND_ID_PATTERN}},
            "required": ["command_id"],
        },
        "Readiness": {
            "type": "object",
            "title": "Readiness",
            "properties": {"status": {"type": "string"}},
            "required": ["status"],
        },
    }
