"""The ``/docs`` page: every operation of ``openapi.json`` with a form to send it.

The page reads the document's ``securitySchemes`` and shows one credential field per scheme (an
API key's header, a bearer token); what is entered there is sent with every request, including
the ``POST /command-ids`` that mints a command's ``Idempotency-Key``. A refused mint is shown as
it came and stops the send (no command goes out without its key). Credentials stay in the page's
memory: nothing is stored in the browser. Paths are relative, so the page works where the app is
mounted.
"""

from __future__ import annotations

import html


def docs_page(title: str) -> str:
    """The page's HTML, titled ``title`` (escaped)."""
    return _PAGE.replace("{title}", html.escape(title))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} — API</title>
<style>
body{font-family:system-ui,sans-serif;margin:2rem;max-width:70rem}
details{border:1px solid #ccc;border-radius:6px;margin:.5rem 0;padding:.5rem}
summary{cursor:pointer;font-family:monospace} textarea{width:100%;height:6rem;font-family:monospace}
pre{background:#f6f6f6;padding:.5rem;overflow:auto} .m{font-weight:bold;color:#05a}
#credentials label{display:block;margin:.25rem 0} #credentials input{width:30rem}
</style></head><body>
<h1>{title}</h1><p>OpenAPI document: <a href="openapi.json">openapi.json</a></p>
<form id="credentials" autocomplete="off" onsubmit="return false"></form>
<div id="ops">Loading…</div>
<script>
"use strict";
const schemes = {};

function credentialHeaders() {
  const headers = {};
  for (const [name, scheme] of Object.entries(schemes)) {
    const value = document.getElementById("cred-" + name).value.trim();
    if (!value) continue;
    if (scheme.type === "apiKey" && scheme.in === "header") headers[scheme.name] = value;
    if (scheme.type === "http" && scheme.scheme.toLowerCase() === "bearer") {
      headers["Authorization"] = "Bearer " + value;
    }
  }
  return headers;
}

function credentialForm(found) {
  const form = document.getElementById("credentials");
  for (const [name, scheme] of Object.entries(found)) {
    if (!(scheme.type === "apiKey" && scheme.in === "header") &&
        !(scheme.type === "http" && (scheme.scheme || "").toLowerCase() === "bearer")) continue;
    schemes[name] = scheme;
    const label = document.createElement("label");
    label.textContent = scheme.type === "apiKey"
      ? `${name} (${scheme.name} header) ` : `${name} (bearer token) `;
    const input = document.createElement("input");
    input.type = "password"; input.id = "cred-" + name; input.name = name;
    label.appendChild(input); form.appendChild(label);
  }
}

async function show(out, res) {
  out.textContent = res.status + "\\n";
  if ((res.headers.get("content-type") || "").startsWith("text/event-stream")) {
    const reader = res.body.getReader(); const text = new TextDecoder();
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      out.textContent += text.decode(value, {stream: true});
    }
  } else {
    out.textContent += await res.text();
  }
}

async function send(d, path, method, op) {
  const out = d.querySelector(".out");
  let url = path;
  for (const input of d.querySelectorAll("input.param")) {
    url = url.replace("{" + input.name + "}", encodeURIComponent(input.value));
  }
  const headers = credentialHeaders();
  if ((op.parameters || []).some(p => p.name === "Idempotency-Key")) {
    const minted = await fetch("command-ids", {method: "POST", headers});
    if (!minted.ok) { await show(out, minted); return; }
    headers["Idempotency-Key"] = (await minted.json()).command_id;
  }
  const init = {method: method.toUpperCase(), headers};
  if (op.requestBody) {
    headers["Content-Type"] = "application/json";
    init.body = d.querySelector(".body").value;
  }
  await show(out, await fetch(url.replace(/^\\//, ""), init));
}

function operation(path, method, op) {
  const d = document.createElement("details");
  const summary = document.createElement("summary");
  const verb = document.createElement("span");
  verb.className = "m"; verb.textContent = method.toUpperCase();
  summary.append(verb, " " + path); d.appendChild(summary);
  const about = document.createElement("p");
  about.textContent = op.summary || ""; d.appendChild(about);
  for (const p of (op.parameters || []).filter(p => p.in === "path")) {
    const label = document.createElement("label"); label.textContent = p.name + " ";
    const input = document.createElement("input");
    input.className = "param"; input.name = p.name; input.value = p.name === "id" ? "demo" : "";
    label.appendChild(input); d.appendChild(label);
  }
  if (op.requestBody) {
    const body = document.createElement("textarea"); body.className = "body"; body.value = "{}";
    d.append(document.createElement("p"), body);
  }
  const button = document.createElement("button"); button.textContent = "Send";
  const out = document.createElement("pre"); out.className = "out";
  const schema = document.createElement("details");
  const schemaSummary = document.createElement("summary"); schemaSummary.textContent = "schema";
  const schemaText = document.createElement("pre");
  schemaText.textContent = JSON.stringify(op, null, 2);
  schema.append(schemaSummary, schemaText);
  const row = document.createElement("p"); row.appendChild(button);
  d.append(row, out, schema);
  button.onclick = () => send(d, path, method, op).catch(e => { out.textContent = String(e); });
  return d;
}

async function main() {
  const doc = await (await fetch("openapi.json")).json();
  credentialForm((doc.components || {}).securitySchemes || {});
  const root = document.getElementById("ops"); root.textContent = "";
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) root.appendChild(operation(path, method, op));
  }
}
main();
</script></body></html>
"""
