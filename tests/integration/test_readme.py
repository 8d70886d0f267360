"""The README's quick start runs as printed: on an embedded PostgreSQL in a fresh directory.

So does the tracing module of docs/guides/tracing.md.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def quick_start() -> str:
    text = README.read_text("utf-8")
    start = text.index("```python", text.index("## Quick start")) + len("```python")
    return text[start : text.index("```", start)]


def test_the_quick_start_runs_as_printed(tmp_path: Path) -> None:
    (tmp_path / "quick.py").write_text(quick_start(), "utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKTER_")}
    env["PYTHONPATH"] = os.pathsep.join([str(README.parent / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "quick.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["declared error: unicorn", "items: 3"]
    assert "QueryView" in quick_start()  # the typed query view is shown where queries start


# --- tracing ------------------------------------------------------------------------------------

#: Stands in for opentelemetry-exporter-otlp (``opentelemetry`` is a namespace package, so this
#: portion adds the exporter module): each exported span becomes one JSON line in $SPANS_FILE.
_OTLP_STAND_IN = """
import json, os
from opentelemetry.sdk.trace.export import SpanExportResult

class OTLPSpanExporter:
    def export(self, spans):
        with open(os.environ["SPANS_FILE"], "a") as out:
            for s in spans:
                parent = s.parent.span_id if s.parent else None
                out.write(json.dumps({"name": s.name, "trace": s.context.trace_id,
                                      "span": s.context.span_id, "parent": parent}) + "\\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True
"""

#: Serves examples/http_service.py in-process with the tracing guide's module imported first.
_DRIVER = """
import asyncio, httpx
import tracing
from examples.http_service import app, runtime

CALLER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

async def main():
    async with runtime:
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bank") as http:
            key = {"X-API-Key": "alice-key"}
            minted = await http.post("/command-ids", headers=key)
            done = await http.post(
                "/actors/Account/alice/deposit", json={"cents": 500},
                headers={**key, "Idempotency-Key": minted.json()["command_id"],
                         "traceparent": CALLER},
            )
            assert done.status_code == 200, done.text
    tracing.provider.force_flush()

asyncio.run(main())
"""


def tracing_module() -> str:
    text = (README.parent / "docs" / "guides" / "tracing.md").read_text("utf-8")
    start = text.index("```python", text.index("# Tracing")) + len("```python")
    return text[start : text.index("```", start)]


def test_the_tracing_example_exports_the_callers_trace(tmp_path: Path, akter_db: str) -> None:
    import json
    import uuid

    import psycopg

    exporter = tmp_path / "opentelemetry" / "exporter" / "otlp" / "proto" / "http"
    exporter.mkdir(parents=True)
    (exporter / "trace_exporter.py").write_text(_OTLP_STAND_IN, "utf-8")
    (tmp_path / "tracing.py").write_text(tracing_module(), "utf-8")
    (tmp_path / "driver.py").write_text(_DRIVER, "utf-8")
    schema = f"akter_readme_{uuid.uuid4().hex[:10]}"
    spans = tmp_path / "spans.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AKTER_", "OTEL_"))}
    paths = [str(tmp_path), str(README.parent), str(README.parent / "src")]
    env.update(
        PYTHONPATH=os.pathsep.join([*paths, env.get("PYTHONPATH", "")]),
        AKTER_DATABASE_URL=akter_db,
        BANK_SCHEMA=schema,
        BANK_API_KEYS="alice-key=alice@acme",
        SPANS_FILE=str(spans),
    )
    try:
        done = subprocess.run(
            [sys.executable, "driver.py"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        with psycopg.connect(akter_db, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'.encode())
    assert done.returncode == 0, done.stderr
    exported = [json.loads(line) for line in spans.read_text("utf-8").splitlines()]
    names = {s["name"] for s in exported}
    assert {"POST /actors/{type}/{id}/{member}", "akter.Account/batch"} <= names
    caller = int("4bf92f3577b34da6a3ce929d0e0e4736", 16)
    assert {s["trace"] for s in exported} == {caller}  # every span continues the caller's
