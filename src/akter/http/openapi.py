"""The OpenAPI 3.1 document: the contract the server enforces, built from the runtime's actors.

Every public command and query is an operation whose request body and result are schemas of
their own (``AccountDepositArgs``, the result model's name), so generated clients get clean names.
Each workflow's start is one too (``OrderFulfilWorkflowArgs``); the routes of runs by id
(``/workflows/{run_id}/...``) are documented when some actor declares a workflow.
A command that declares errors lists a 422 response with one schema per error (its tag as
``error`` and its fields as ``fields``); the others do not. The limits the server enforces are
stated on each parameter (actor ids, ``Idempotency-Key``, ``Last-Event-ID`` and ``?after=``),
and the auth provider's ``securitySchemes`` are declared, optional only on public actors.
Each owned table's ``GET /tables/{name}`` is an operation with its columns as filters.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from akter.actor import ARGUMENT_INT_RANGE, ActorDefinition, Member, public
from akter.errors import DeclaredError
from akter.http import _openapi_parts as parts
from akter.http._tables import table_operation
from akter.http.auth import AuthProvider, security_schemes
from akter.workflows import WorkflowMember, WorkflowStatus

if TYPE_CHECKING:
    from akter.runtime import Runtime

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": _REF.format(model=name)}


def _pascal(*words: str) -> str:
    return "".join(part[:1].upper() + part[1:] for w in words for part in re.split(r"[_.\W]+", w))


def storable(schema: Any) -> Any:
    """``schema`` with the limits of what akter stores stated on it (in place, and returned).

    Strings hold no NUL (PostgreSQL cannot store it): a string schema without a ``pattern`` gets
    one. Integers fit in a signed 64-bit integer: bounds are added where none is given.
    """
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        kinds = node.get("type")
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if "string" in kinds and "pattern" not in node and "format" not in node:
            node["pattern"] = _NO_NUL
        if "integer" in kinds:
            node.setdefault("minimum", ARGUMENT_INT_RANGE[0])
            node.setdefault("maximum", ARGUMENT_INT_RANGE[1])
        stack.extend(
            v for k, v in node.items() if k not in ("default", "examples", "const", "enum")
        )
    return schema


_NO_NUL = "^[^\\u0000]*$"


class _Builder:
    """Collects the components while the operations are built."""

    def __init__(self, schemes: dict[str, dict[str, Any]]) -> None:
        self.components: dict[str, Any] = {
            "Problem": parts.problem_schema(),
            **parts.framework_schemas(),
        }
        self.schemes = schemes

    def schema(self, adapter: TypeAdapter[Any], name: str | None = None) -> dict[str, Any]:
        """``adapter``'s schema: a ``$ref`` to a component when it is a named object."""
        schema: dict[str, Any] = storable(adapter.json_schema(ref_template=_REF))
        self.components.update(schema.pop("$defs", {}))
        if name is None and schema.get("type") == "object" and isinstance(schema.get("title"), str):
            name = _pascal(schema["title"])
        if name is None:
            return schema
        schema["title"] = name
        if self.components.setdefault(name, schema) != schema:
            return schema  # another schema holds the name: keep this one inline
        return _ref(name)

    def security(self, definition: ActorDefinition) -> list[dict[str, list[str]]]:
        """Who may call: any declared scheme, or (public actors only) no credentials at all."""
        required: list[dict[str, list[str]]] = [{name: []} for name in self.schemes]
        return [{}, *required] if definition.access is public else required

    def declared_errors(self, member: Member) -> dict[str, Any] | None:
        """The 422 response of a command's declared errors, or ``None`` without any."""
        errors: list[type[DeclaredError]] = list(member.spec.errors)
        if not errors:
            return None
        refs = []
        for error in errors:
            fields = self.schema(TypeAdapter(error._fields_model), f"{error.__name__}Fields")
            name = error.__name__
            self.components.setdefault(name, parts.declared_error_schema(error.tag, fields, name))
            refs.append(_ref(name))
        schema = refs[0] if len(refs) == 1 else {"oneOf": refs}
        return {
            "description": "A declared error: its tag in `error`, its fields in `fields`.",
            "content": {"application/problem+json": {"schema": schema}},
        }


def _operation(builder: _Builder, member: Member) -> dict[str, Any]:
    definition = member.owner
    args = builder.schema(
        TypeAdapter(member.args_model), _pascal(definition.name, member.name, "Args")
    )
    params = [parts.id_parameter(definition.singleton)]
    if member.kind == "command":
        params.append(parts.IDEMPOTENCY_KEY)
    responses: dict[str, Any] = {
        "200": {
            "description": "The return value.",
            "content": {"application/json": {"schema": builder.schema(member.result)}},
        },
        **parts.refusals(),
    }
    if member.kind == "command":
        responses["200"]["headers"] = parts.CLOCK_HEADERS
    declared = builder.declared_errors(member) if member.kind == "command" else None
    if declared is not None:
        responses["422"] = declared
    operation: dict[str, Any] = {
        "operationId": f"{definition.name}.{member.name}",
        "tags": [definition.name],
        "parameters": params,
        "requestBody": {"required": True, "content": {"application/json": {"schema": args}}},
        "responses": responses,
        "security": builder.security(definition),
    }
    summary = (member.fn.__doc__ or "").strip().split("\n")[0]
    if summary:
        operation["summary"] = summary
    return operation


def _start_operation(builder: _Builder, flow: WorkflowMember[Any, Any]) -> dict[str, Any]:
    definition: ActorDefinition = flow.owner
    flow.resolve()
    assert flow.args_model is not None
    args = builder.schema(
        TypeAdapter(flow.args_model), _pascal(definition.name, flow.name, "WorkflowArgs")
    )
    operation: dict[str, Any] = {
        "operationId": f"{definition.name}.workflow.{flow.name}",
        "tags": [definition.name],
        "summary": f"Start a run of the workflow {flow.name}.",
        "parameters": [parts.id_parameter(definition.singleton), parts.START_KEY],
        "requestBody": {"required": True, "content": {"application/json": {"schema": args}}},
        "responses": {
            "200": {
                "description": "The run, new or (the same command id again) the one it started.",
                "content": {"application/json": {"schema": _ref("WorkflowStarted")}},
            },
            **parts.refusals(),
        },
        "security": builder.security(definition),
    }
    doc = (flow.fn.__doc__ or "").strip().split("\n")[0]
    if doc:
        operation["description"] = doc
    return operation


def _actor_paths(builder: _Builder, definition: ActorDefinition) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    definition.resolve()
    for member in definition.members.values():
        if member.internal:
            continue
        path = (
            f"/actors/{definition.name}/{{id}}/{member.name}"
            if member.kind == "command"
            else f"/actors/{definition.name}/{{id}}/queries/{member.name}"
        )
        paths[path] = {"post": _operation(builder, member)}
        if member.spec.watch:
            args = builder.schema(
                TypeAdapter(member.args_model), _pascal(definition.name, member.name, "Args")
            )
            paths[f"/actors/{definition.name}/{{id}}/{member.name}/watch"] = {
                "post": parts.watch_operation(
                    definition.name,
                    member.name,
                    definition.singleton,
                    args,
                    builder.security(definition),
                )
            }
    for flow in definition.workflows.values():
        if flow.internal:
            continue
        path = f"/actors/{definition.name}/{{id}}/workflows/{flow.name}"
        paths[path] = {"post": _start_operation(builder, flow)}
    security = builder.security(definition)
    paths[f"/actors/{definition.name}/{{id}}/events"] = {
        "get": parts.events_operation(definition.name, definition.singleton, security)
    }
    paths[f"/actors/{definition.name}/{{id}}/commands/{{command_id}}"] = {
        "get": parts.outcome_operation(definition.name, definition.singleton, security)
    }
    if definition.jobs:
        paths[f"/actors/{definition.name}/{{id}}/jobs/{{job_id}}/progress"] = {
            "get": parts.progress_operation(definition.name, definition.singleton, security)
        }
        paths[f"/actors/{definition.name}/{{id}}/jobs/{{job_id}}/stream"] = {
            "get": parts.job_stream_operation(definition.name, definition.singleton, security)
        }
    return paths


def document(
    runtime: Runtime, title: str = "akter", auth: AuthProvider | None = None
) -> dict[str, Any]:
    """The OpenAPI document of a runtime's public commands and queries (internal ones absent).

    Args:
        runtime: The runtime whose actors are described.
        title: The document's title.
        auth: The app's auth provider, whose ``openapi_security()`` names its schemes.
    """
    schemes = security_schemes(auth) if auth is not None else {}
    builder = _Builder(schemes)
    paths: dict[str, Any] = {}
    definitions = sorted(runtime.definitions.values(), key=lambda d: d.name)
    for definition in definitions:
        paths.update(_actor_paths(builder, definition))
        for owned in definition.tables:
            operation = table_operation(owned, builder.security(definition), parts.refusals())
            paths[f"/tables/{owned.name}"] = {"get": operation}
    anyone: list[dict[str, list[str]]] = [{}]
    anyone.extend({name: []} for name in schemes)
    flows = [d for d in definitions if d.workflows]
    if flows:
        # The run's actor's policy decides; credentials are optional if a public actor has runs.
        runs_security = anyone if any(d.access is public for d in flows) else anyone[1:]
        builder.components.update(parts.workflow_schemas())
        status = builder.schema(TypeAdapter(WorkflowStatus), "WorkflowStatus")
        paths.update(parts.workflow_run_paths(runs_security, status))
    paths.update(parts.framework_paths(anyone))
    components: dict[str, Any] = {"schemas": builder.components}
    if schemes:
        components["securitySchemes"] = schemes
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": components,
    }
