"""The OpenAPI 3.1 document, built from the pydantic models of public commands and queries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

from akter.actor import Member

if TYPE_CHECKING:
    from akter.runtime import Runtime

_REF = "#/components/schemas/{model}"


def _schema(adapter: TypeAdapter[Any], components: dict[str, Any]) -> dict[str, Any]:
    schema = adapter.json_schema(ref_template=_REF)
    components.update(schema.pop("$defs", {}))
    return schema


def _problem_ref() -> dict[str, Any]:
    return {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def _operation(member: Member, components: dict[str, Any]) -> dict[str, Any]:
    definition = member.owner
    body = _schema(TypeAdapter(member.args_model), components)
    params: list[dict[str, Any]] = [
        {
            "name": "id",
            "in": "path",
            "required": True,
            "schema": {"type": "string"},
            "description": "The actor id ('_' for a singleton).",
        }
    ]
    if member.kind == "command":
        params.append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": True,
                "schema": {"type": "string"},
                "description": "The command id (mint one with POST /command-ids).",
            }
        )
    responses: dict[str, Any] = {
        "200": {
            "description": "The return value.",
            "content": {"application/json": {"schema": _schema(member.result, components)}},
        },
        "default": {"description": "A refusal (problem+json).", "content": _problem_ref()},
    }
    if member.kind == "command":
        responses["422"] = {"description": "A declared error.", "content": _problem_ref()}
    return {
        "operationId": f"{definition.name}.{member.name}",
        "summary": (member.fn.__doc__ or "").strip().split("\n")[0] or None,
        "tags": [definition.name],
        "parameters": params,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": body}},
        },
        "responses": responses,
    }


def document(runtime: Runtime, title: str = "akter") -> dict[str, Any]:
    """The OpenAPI document of a runtime's public commands and queries (internal ones absent)."""
    components: dict[str, Any] = {"Problem": _problem_schema()}
    paths: dict[str, Any] = {}
    for definition in sorted(runtime.definitions.values(), key=lambda d: d.name):
        definition.resolve()
        for member in definition.members.values():
            if member.internal:
                continue
            path = (
                f"/actors/{definition.name}/{{id}}/{member.name}"
                if member.kind == "command"
                else f"/actors/{definition.name}/{{id}}/queries/{member.name}"
            )
            operation = _operation(member, components)
            if operation["summary"] is None:
                del operation["summary"]
            paths[path] = {"post": operation}
        paths[f"/actors/{definition.name}/{{id}}/events"] = _events_path(definition.name)
    paths.update(_framework_paths())
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }


def _problem_schema() -> dict[str, Any]:
    """The schema of every refusal's problem+json body."""
    return {
        "type": "object",
        "properties": {
            "type": {"type": "string"},
            "title": {"type": "string"},
            "status": {"type": "integer"},
            "detail": {"type": "string"},
            "reason": {"type": "string"},
            "code": {"type": "string"},
        },
        "required": ["status", "reason", "detail"],
    }


def _events_path(type_name: str) -> dict[str, Any]:
    """The path item of an actor type's event feed."""
    return {
        "get": {
            "operationId": f"{type_name}.events",
            "tags": [type_name],
            "summary": "Server-sent events: replay after Last-Event-ID, then follow live.",
            "parameters": [
                {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}},
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
            ],
            "responses": {
                "200": {
                    "description": "An event stream.",
                    "content": {"text/event-stream": {}},
                },
                "default": {"description": "A refusal.", "content": _problem_ref()},
            },
        }
    }


def _framework_paths() -> dict[str, Any]:
    """The path items every app serves besides its actors: command ids and readiness."""
    return {
        "/command-ids": {
            "post": {
                "operationId": "mint_command_id",
                "summary": "Mint a command id from the server's clock (writes nothing).",
                "responses": {
                    "200": {
                        "description": "A fresh command id.",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"command_id": {"type": "string"}},
                                    "required": ["command_id"],
                                }
                            }
                        },
                    }
                },
            }
        },
        "/ready": {
            "get": {
                "operationId": "ready",
                "summary": "Readiness for probes.",
                "responses": {
                    "200": {"description": "Ready."},
                    "503": {"description": "Not ready."},
                },
            }
        },
    }
