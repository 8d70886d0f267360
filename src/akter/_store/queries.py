"""The named statement catalogue: ``queries*.sql`` parsed once, per schema.

Placeholders substituted per schema: ``{schema}`` (the quoted schema name) and the quoted
notification channels ``{wake_channel}`` (relay and event-feed wakes), ``{progress_channel}``
(job progress messages) and ``{live_channel}`` (watched actors' commits, broadcasts), named
by :meth:`Queries.channel`. A statement may hold another whole: ``{statement:lock_actor}``
stands for that statement's text without its final semicolon (``lock_admit`` locks the row
exactly as ``lock_actor`` does).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import LiteralString

from psycopg import sql

from akter.errors import ConfigurationError

_HEADER = re.compile(r"^-- ([a-z_][a-z0-9_]*) --$")
_STATEMENT = re.compile(r"\{statement:([a-z_][a-z0-9_]*)\}")
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: The notification channels of a schema, by placeholder name.
_CHANNELS = {
    "wake_channel": "{}_wake",
    "progress_channel": "{}_progress",
    "live_channel": "{}_live",
}


@cache
def raw_catalogue() -> dict[str, str]:
    """Every statement of ``queries*.sql`` by name, with ``{schema}`` placeholders."""
    folder = resources.files("akter._store")
    files = sorted(p.name for p in folder.iterdir() if p.name.startswith("queries"))
    text = "\n".join(folder.joinpath(f).read_text("utf-8") for f in files if f.endswith(".sql"))
    blocks: dict[str, str] = {}
    name: str | None = None
    lines: list[str] = []
    for line in text.splitlines():
        match = _HEADER.match(line.strip())
        if match:
            if name is not None:
                blocks[name] = _body(lines)
            name, lines = match.group(1), []
            if name in blocks:
                raise ConfigurationError(f"queries.sql names {name!r} twice.")
        elif name is not None:
            lines.append(line)
    if name is not None:
        blocks[name] = _body(lines)
    return held_statements(blocks)


def held_statements(blocks: dict[str, str]) -> dict[str, str]:
    """``blocks`` with each ``{statement:NAME}`` replaced by NAME's text, less its semicolon.

    One level: a statement that another holds holds none itself.
    """

    def text(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in blocks or _STATEMENT.search(blocks[name]):
            raise ConfigurationError(
                f"queries.sql holds {name!r}, which is unknown or holds another statement."
            )
        return blocks[name].rstrip().removesuffix(";")

    return {name: _STATEMENT.sub(text, body) for name, body in blocks.items()}


def _body(lines: list[str]) -> str:
    # The first comment line after the header is the statement's one-line guarantee.
    body = [ln for ln in lines if not ln.lstrip().startswith("--")]
    return "\n".join(body).strip()


def validate_schema_name(schema: str) -> str:
    """Check a schema name: lowercase identifier, at most 63 bytes."""
    if not isinstance(schema, str) or not _SCHEMA.match(schema):
        raise ConfigurationError(
            f"Schema name {schema!r} is invalid; use a lowercase identifier such as 'akter'."
        )
    return schema


class Queries:
    """The catalogue with the schema substituted: ``queries["lock_actor"]``."""

    def __init__(self, schema: str) -> None:
        self.schema = validate_schema_name(schema)
        substitutions = {"{schema}": sql.Identifier(schema).as_string(None)}
        for placeholder in _CHANNELS:
            quoted = sql.Identifier(self.channel(placeholder)).as_string(None)
            substitutions["{" + placeholder + "}"] = quoted
        self._statements = {
            name: _substitute(text, substitutions) for name, text in raw_catalogue().items()
        }

    def __getitem__(self, name: str) -> LiteralString:
        return self._statements[name]

    def __contains__(self, name: object) -> bool:
        return name in self._statements

    def channel(self, placeholder: str) -> str:
        """The channel name of ``wake_channel`` or ``progress_channel`` for this schema."""
        return _CHANNELS[placeholder].format(self.schema)

    def prefer(self, variants: dict[str, str]) -> None:
        """Serve ``variants[name]``'s text under ``name`` (the Citus drop-ins of ``citus``)."""
        for name, variant in variants.items():
            self._statements[name] = self._statements[variant]

    def names(self) -> list[str]:
        """Every statement name."""
        return sorted(self._statements)

    def substitute(self, text: str) -> LiteralString:
        """Substitute the schema into another SQL text (migrations)."""
        return text.replace("{schema}", sql.Identifier(self.schema).as_string(None))


def _substitute(text: str, substitutions: dict[str, str]) -> str:
    for placeholder, value in substitutions.items():
        text = text.replace(placeholder, value)
    return text
