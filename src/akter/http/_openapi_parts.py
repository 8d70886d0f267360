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


#: The headers of a command's answer (and of POST /command-ids): the database clock and the
#: retry window, from which a client mints its next command ids without asking for one.
CLOCK_HEADERS: dict[str, Any] = {
    "Akter-Clock": {
        "description": "The server's reading of the database clock (epoch ms), a lower bound "
        "of it when it answered. A client may mint command ids "
        "`v1.<issued>.<issued + window>.<uuid4>` with `issued` at most this reading plus the "
        "time since it arrived (akter's client stays 1 s behind).",
        "schema": {"type": "string", "pattern": r"^[0-9]{1,15}$"},
    },
    "Akter-Retry-Window": {
        "description": "The deployment's retry window (ms): a command id's `expires - issued`.",
        "schema": {"type": "string", "pattern": r"^[0-9]{1,15}$"},
    },
}


START_KEY: dict[str, Any] = {
    **IDEMPOTENCY_KEY,
    "description": "The command id, `v1.<issued_ms>.<expires_ms>.<uuid4>`, as commands take "
    "it: the run id derives from it. Sending the same id and body again answers the same run; "
    "the same id with another body is a `CommandConflict` (409).",
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


def outcome_operation(type_name: str, singleton: bool, security: _SECURITY) -> dict[str, Any]:
    """A command's outcome by its id (a command staged in the application's transaction)."""
    return {
        "operationId": f"{type_name}.command_outcome",
        "tags": [type_name],
        "summary": "A command's outcome by id: as its POST answered (200 value, 422 declared "
        "error); 404 `no_outcome` while nothing holds the id (or it is another tenant's); 410 "
        "`receipt_gone` once its receipt was pruned.",
        "parameters": [
            id_parameter(singleton),
            {
                "name": "command_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": COMMAND_ID_PATTERN},
            },
            {
                "name": "wait",
                "in": "query",
                "schema": {"type": "number", "minimum": 0, "maximum": 30},
                "description": "Seconds to wait for the receipt before answering 404 (default 0).",
            },
        ],
        "responses": {
            "200": {"description": "The command's value.", "content": {"application/json": {}}},
            "404": {"description": "No outcome yet.", "content": _problem_content()},
            "410": {"description": "The receipt was pruned.", "content": _problem_content()},
            "422": {"description": "The command's declared error.", "content": _problem_content()},
            **refusals(),
        },
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


def run_id_parameter() -> dict[str, Any]:
    """The ``{run_id}`` path parameter of the workflow run routes."""
    return {
        "name": "run_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": r"^[!-~]{1,200}$"},
        "description": "The run id `start` answered (printable ASCII, 1-200 characters).",
    }


def _run_operation(
    operation_id: str, summary: str, responses: dict[str, Any], security: _SECURITY
) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "tags": ["workflows"],
        "summary": summary,
        "parameters": [run_id_parameter()],
        "responses": {
            **responses,
            "404": {
                "description": "No run of the caller's tenant has this id (reason "
                "`InvalidInput`, code `unknown_workflow_run`).",
                "content": _problem_content(),
            },
            **refusals(),
        },
        "security": security,
    }


def workflow_run_paths(security: _SECURITY, status: dict[str, Any]) -> dict[str, Any]:
    """The routes of workflow runs by id; ``status`` is the schema of a run's status."""
    json_content = {"application/json": {"schema": {"$ref": _SCHEMAS + "WorkflowCancel"}}}
    signal = _signal_operation(security)
    steps = _steps_operation(security)
    return {
        "/workflows/{run_id}": {
            "get": _run_operation(
                "workflow.status",
                "The run's status, result or error, and its step journal.",
                {
                    "200": {
                        "description": "The run as it stands.",
                        "content": {"application/json": {"schema": status}},
                    }
                },
                security,
            )
        },
        "/workflows/{run_id}/signals/{signal}": {"post": signal},
        "/workflows/{run_id}/cancel": {
            "post": _run_operation(
                "workflow.cancel",
                "Ask the run to cancel: its next durable await raises WorkflowCancelled.",
                {
                    "200": {
                        "description": "The run's status after the request (an ended run "
                        "stays as it ended).",
                        "content": json_content,
                    }
                },
                security,
            )
        },
        "/workflows/{run_id}/steps": {"get": steps},
    }


def _signal_operation(security: _SECURITY) -> dict[str, Any]:
    """``POST /workflows/{run_id}/signals/{signal}``: its parameters, body and answers."""
    signal = _run_operation(
        "workflow.signal",
        "Send a signal to the run: the oldest wait for its class takes it.",
        {
            "200": {
                "description": "The signal is kept for the run.",
                "content": {"application/json": {"schema": {"$ref": _SCHEMAS + "WorkflowSignal"}}},
            },
            "409": {
                "description": "The run has ended (reason `InvalidInput`, code "
                "`workflow_finished`).",
                "content": _problem_content(),
            },
        },
        security,
    )
    signal["parameters"] += [
        {
            "name": "signal",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]{0,199}$"},
            "description": "The signal's class name.",
        },
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "maxLength": 200},
            "description": "Any key of at most 200 characters (the Python client sends a "
            "command id): the signal is kept once per key, however often it is sent. Without "
            "it (or empty) each request sends a new signal.",
        },
    ]
    signal["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": _SCHEMAS + "SignalFields"}}},
    }
    return signal


def _steps_operation(security: _SECURITY) -> dict[str, Any]:
    """``GET /workflows/{run_id}/steps``: the run's step feed and its resume parameters."""
    steps = _run_operation(
        "workflow.steps",
        "Server-sent step records of the run, live, then its final status.",
        _stream_responses(
            "`step` frames, one per journal record in `seq` order (a `WorkflowStatus` step); a "
            "done record's frame has its `seq` as `id`, a pending record's frame has none (a "
            "resumed feed sends it again). When the run has ended, one `closed` frame holds "
            "its final status (without `steps`)."
        ),
        security,
    )
    cursor = {"type": "string", "pattern": CURSOR_PATTERN}
    steps["parameters"] += [
        {
            "name": "Last-Event-ID",
            "in": "header",
            "schema": cursor,
            "description": "Resume after this `seq`: the `id` of the last frame seen. Wins "
            "over `after`.",
        },
        {
            "name": "after",
            "in": "query",
            "schema": cursor,
            "description": "Resume after this `seq`, as `Last-Event-ID` does. Without either, "
            "the feed starts at the first record.",
        },
    ]
    return steps


def workflow_schemas() -> dict[str, Any]:
    """The components of the workflow routes (besides the status and the arguments)."""
    value: dict[str, Any] = {
        "anyOf": [
            {"type": "string", "pattern": "^[^\\u0000]*$"},
            {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
            {"type": "number"},
            {"type": "boolean"},
            {"type": "null"},
            {"type": "array", "items": {"$ref": _SCHEMAS + "SignalValue"}},
            {
                "type": "object",
                "propertyNames": {"pattern": "^[^\\u0000]*$"},
                "additionalProperties": {"$ref": _SCHEMAS + "SignalValue"},
            },
        ]
    }
    return {
        "WorkflowStarted": {
            "type": "object",
            "title": "WorkflowStarted",
            "properties": {"run_id": {"type": "string"}},
            "required": ["run_id"],
        },
        "WorkflowSignal": {
            "type": "object",
            "title": "WorkflowSignal",
            "properties": {"run_id": {"type": "string"}, "signal": {"type": "string"}},
            "required": ["run_id", "signal"],
        },
        "WorkflowCancel": {
            "type": "object",
            "title": "WorkflowCancel",
            "properties": {
                "run_id": {"type": "string"},
                "status": {"type": "string"},
                "cancel_requested": {"type": "boolean"},
            },
            "required": ["run_id", "status", "cancel_requested"],
        },
        "SignalFields": {
            "type": "object",
            "title": "SignalFields",
            "description": "The signal's fields, validated by the wait that takes it (a "
            "signal that does not validate is set aside).",
            "propertyNames": {"pattern": "^[^\\u0000]*$"},
            "additionalProperties": {"$ref": _SCHEMAS + "SignalValue"},
        },
        "SignalValue": value,
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
                        "headers": CLOCK_HEADERS,
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
                    for status, what in (
                        ("200", "Ready."),
                        (
                            "503",
                            "Not ready; `status` says why. `storage` (with `code` "
                            "`database_unreachable`): PostgreSQL cannot be reached.",
                        ),
                    )
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
            "properties": {
                "status": {"type": "string"},
                "code": {"type": "string"},
                "detail": {"type": "string"},
            },
            "required": ["status"],
        },
    }
