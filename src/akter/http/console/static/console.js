// The akter console: vanilla JS, no build step. Every value from the server is rendered with
// textContent (never parsed as HTML). Every API request carries X-Akter-Console: 1 (the server's CSRF
// defence), the console token of `akter dev` (from the URL's #token= fragment) and the credentials
// typed into the sign-in form; the token and the credentials are kept in sessionStorage.
"use strict";

const AUTH_KEY = "akter.console.auth";
const TOKEN_KEY = "akter.console.token";
// The tab shown, kept in this browser tab so that a reload stays where the operator was.
const TAB_KEY = "akter.console.tab";
const SVG = "http://www.w3.org/2000/svg";
// The overview's charts span the last hour (the runtime keeps that much).
const CHART_SPAN_MS = 60 * 60 * 1000;
// The next poll is scheduled only once the previous one finished, and none runs while the tab is
// hidden. What has a live feed is not polled: an open actor's state and events, a job's progress
// and output (docs/console.md lists what polls and why).
const POLL_MS = 2000;
// Before a feed that ended is opened again.
const RECONNECT_MS = 1000;
// Progress feeds open at once. Each feed holds one of the six HTTP/1.1 connections a browser
// keeps per server: with the polls (1), the open actor's state and event feeds (2, closed while
// another tab is shown) or the open job's output (1, likewise), at most 6 are in use.
const MAX_PROGRESS_FEEDS = 3;
const state = {
  tab: "overview",
  wfRun: null, // the run shown in the workflows tab
  type: null,
  actor: null, // {type, id, tenant}
  run: null, // the workflow run shown under the actor
  after: null,
  feed: null, // AbortController of the actor's feeds (its events and its state)
  shown: -1, // the row version of the actor's state shown: never replaced by an older read
  job: null, // the job whose output is shown: {job, after, abort, closed}
  progress: new Map(), // job id -> {abort, bar, label, closed, ended}
  seen: new Map(), // job id -> job: rows stay, marked finished, after their progress closed
  timer: null, // the next poll
  refreshing: null, // the refresh in progress
  again: false, // refresh once more when the one in progress ends
};

// --- plumbing -------------------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "class") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function credentials() {
  try {
    return JSON.parse(sessionStorage.getItem(AUTH_KEY) || "null");
  } catch (e) {
    return null;
  }
}

// `akter dev` prints the console's URL with its token in the fragment, which never reaches a server
// or a log: keep it in this tab and take it out of the address bar (and of the history).
function takeToken() {
  const fragment = new URLSearchParams(window.location.hash.slice(1));
  const token = fragment.get("token");
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, "", window.location.pathname + window.location.search);
}

function headers() {
  const result = { "X-Akter-Console": "1" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) result["X-Akter-Console-Token"] = token;
  const auth = credentials();
  if (auth && auth.header && auth.value) result[auth.header] = auth.value;
  return result;
}

class Refused extends Error {
  constructor(status, problem) {
    super((problem && problem.detail) || `HTTP ${status}`);
    this.status = status;
    this.code = (problem && problem.code) || null;
  }
}

async function problemOf(response) {
  try {
    return await response.json();
  } catch (e) {
    return null;
  }
}

async function api(path, options) {
  const response = await fetch("api/" + path, { ...(options || {}), headers: headers() });
  if (!response.ok) throw new Refused(response.status, await problemOf(response));
  return response.json();
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== null && value !== undefined) search.set(key, value);
  }
  return search.toString();
}

function status(text, bad) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.className = bad ? "error" : "";
}

function failed(error) {
  const refused = error instanceof Refused;
  // Without the console token, credentials would not help: say how to get the token.
  if (refused && error.status === 401 && !(error.code || "").startsWith("console_token")) {
    showLogin("");
    return;
  }
  // A caller the console's rule refused may sign in as someone else; other refusals (origin,
  // proxy, missing header) are not about credentials.
  if (refused && error.status === 403 && error.code === "console_denied") {
    showLogin(error.message);
    return;
  }
  if (error.name !== "AbortError") status(error.message, true);
}

function formatCount(n, capped) {
  return Number(n).toLocaleString("en-US") + (capped ? "+" : "");
}

function showLogin(message) {
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

function refText(ref) {
  return `${ref.type}/${ref.id || "_"}` + (ref.tenant !== "default" ? ` @${ref.tenant}` : "");
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

// Server-sent events over fetch (EventSource cannot send the headers the console needs).
async function sse(path, onFrame, signal) {
  const response = await fetch("api/" + path, { headers: headers(), signal });
  if (!response.ok) throw new Refused(response.status, await problemOf(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value.replace(/\r\n/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const frame = { event: "message", data: [], id: null };
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (name === "data") frame.data.push(text);
        else if (name === "event") frame.event = text;
        else if (name === "id") frame.id = text;
      }
      if (frame.data.length) onFrame(frame.event, JSON.parse(frame.data.join("\n")), frame.id);
    }
  }
}

// --- actors ---------------------------------------------------------------------------------

async function loadOverview() {
  const overview = await api("overview");
  const capped = overview.capped || {};
  for (const [id, name] of [["count-outbox", "outbox"], ["count-jobs", "jobs"], ["count-letters", "dead_letters"]]) {
    document.getElementById(id).textContent = overview[name] ? formatCount(overview[name], capped[name]) : "";
  }
  const actors = overview.types.reduce((sum, t) => sum + t.actors, 0);
  const tiles = [
    ["tile-actors", actors, overview.types.some((t) => t.capped)],
    ["tile-outbox", overview.outbox || 0, capped.outbox],
    ["tile-jobs", overview.jobs || 0, capped.jobs],
    ["tile-letters", overview.dead_letters || 0, capped.dead_letters],
  ];
  for (const [id, n, cap] of tiles) document.getElementById(id).textContent = formatCount(n, cap);
  const items = overview.types.map((t) =>
    el(
      "li",
      {
        class: t.type === state.type ? "active" : "",
        dataset: { type: t.type },
        onclick: () => selectType(t.type),
      },
      el("span", {}, t.type),
      el("span", { class: "muted" }, formatCount(t.actors, t.capped)),
    ),
  );
  document.getElementById("types").replaceChildren(...items);
}

async function selectType(type) {
  state.type = type;
  state.after = null;
  document.getElementById("actors-title").textContent = `Actors of ${type}`;
  document.querySelector("#actors tbody").replaceChildren();
  for (const li of document.querySelectorAll("#types li")) {
    li.classList.toggle("active", li.dataset.type === type);
  }
  await loadActors();
}

async function loadActors() {
  const page = await api("actors?" + query({ type: state.type, after: state.after, limit: 50 }));
  const rows = page.actors.map((a) =>
    el(
      "tr",
      { dataset: { id: a.id, tenant: a.tenant }, onclick: () => openActor(page.type, a.id, a.tenant) },
      el("td", {}, a.tenant),
      el("td", { class: "mono" }, a.id || "_"),
      el("td", {}, String(a.version)),
      el("td", {}, String(a.event_seq)),
      el("td", {}, when(a.updated_at)),
    ),
  );
  document.querySelector("#actors tbody").append(...rows);
  state.after = page.next;
  document.getElementById("actors-more").hidden = !page.next;
}

async function openActor(type, id, tenant) {
  closeActorFeeds();
  state.actor = { type, id, tenant };
  state.shown = -1;
  state.run = null;
  document.getElementById("run").hidden = true;
  for (const tr of document.querySelectorAll("#actors tbody tr")) {
    tr.classList.toggle("active", tr.dataset.id === id && tr.dataset.tenant === tenant);
  }
  const detail = await loadActor();
  document.getElementById("events").replaceChildren(...detail.events.map((e) => eventItem(e, false)));
  const controller = new AbortController();
  state.feed = controller;
  follow(String(detail.event_seq), controller);
  followState(controller);
}

function closeActorFeeds() {
  if (state.feed) state.feed.abort();
  state.feed = null;
}

// The actor's row facts and state, unless a newer version is shown already (a read and the
// state feed may arrive in either order).
function showRow(row) {
  if (row.version < state.shown) return;
  state.shown = row.version;
  const facts = [
    ["exists", row.exists ? "yes" : "no"],
    ["version", row.version],
    ["events", row.event_seq],
    ["receipts", row.receipts],
    ["updated", when(row.updated_at)],
  ];
  document
    .getElementById("actor-facts")
    .replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { fact: k } }, String(v))]));
  document.getElementById("actor-state").textContent = JSON.stringify(row.state, null, 2);
  // The open actor's line in the list (read when its type was chosen) follows too.
  const { type, id, tenant } = state.actor;
  if (type !== state.type) return;
  for (const tr of document.querySelectorAll("#actors tbody tr")) {
    if (tr.dataset.id !== id || tr.dataset.tenant !== tenant) continue;
    const cells = tr.children;
    cells[2].textContent = String(row.version);
    cells[3].textContent = String(row.event_seq);
    cells[4].textContent = when(row.updated_at);
  }
}

async function loadActor() {
  const { type, id, tenant } = state.actor;
  const detail = await api("actor?" + query({ type, id, tenant }));
  document.getElementById("actor").hidden = false;
  document.getElementById("actor-title").textContent = refText(detail.ref);
  showRow(detail);
  fill(
    document.querySelector("#actor-outbox tbody"),
    detail.outbox.map((o) =>
      el(
        "tr",
        {},
        el("td", { class: "mono" }, o.id),
        el("td", {}, o.role),
        el("td", {}, `${o.target.type}/${o.target.id || "_"}`),
        el("td", {}, o.command),
        el("td", {}, String(o.attempts)),
        el("td", {}, when(o.due_at)),
      ),
    ),
  );
  await loadRuns();
  return detail;
}

// --- workflow runs of the actor ---------------------------------------------------------------

// What a suspended run waits for (a signal, a job, a sleep) and until when it waits by itself.
function wakeText(wake) {
  if (!wake) return "";
  return wake.until ? `${wake.waiting || "a wake"} · until ${when(wake.until)}` : wake.waiting || "a wake";
}

async function loadRuns() {
  const { type, id, tenant } = state.actor;
  const { runs } = await api("actor/workflows?" + query({ type, id, tenant }));
  fill(
    document.querySelector("#actor-runs tbody"),
    runs.map((r) =>
      el(
        "tr",
        { class: r.run_id === state.run ? "active" : "", dataset: { run: r.run_id }, onclick: () => openRun(r.run_id).catch(failed) },
        el("td", { class: "mono" }, r.run_id),
        el("td", {}, r.workflow),
        el("td", { class: r.status === "failed" || r.status === "diverged" ? "error" : "" }, r.status + (r.cancel_requested && !r.finished_at ? " (cancel requested)" : "")),
        el("td", {}, wakeText(r.wake)),
        el("td", {}, when(r.started_at)),
      ),
    ),
  );
  if (state.run) await loadRun();
}

async function openRun(runId) {
  state.run = runId;
  for (const tr of document.querySelectorAll("#actor-runs tbody tr")) {
    tr.classList.toggle("active", tr.dataset.run === runId);
  }
  await loadRun();
}

async function loadRun() {
  const run = await api("workflows/" + encodeURIComponent(state.run));
  document.getElementById("run").hidden = false;
  renderRun(run, "run");
}

// One run's facts, step timeline and signals, into the elements `${prefix}-title`, -facts,
// -steps and -signals (the actor's run, or the workflows tab's).
function renderRun(run, prefix) {
  document.getElementById(`${prefix}-title`).textContent = `${run.workflow} · ${run.run_id}`;
  const facts = [
    ["status", run.status + (run.cancel_requested && !run.finished_at ? " (cancel requested)" : "")],
    ["actor", prefix === "run" ? "" : refText(run.ref)],
    ["waits for", wakeText(run.wake)],
    ["attempts", run.attempts],
    ["started", when(run.started_at)],
    ["deadline", when(run.deadline)],
    ["finished", when(run.finished_at)],
    ["result", run.status === "completed" ? JSON.stringify(run.result) : ""],
    ["error", run.error ? `${run.error.type}: ${run.error.message}` : ""],
  ].filter(([, v]) => v !== "" && v !== null && v !== undefined);
  document
    .getElementById(`${prefix}-facts`)
    .replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { dataset: { fact: k } }, String(v))]));
  // The step timeline, in seq order: a pending step is the one under way (or waited on). Each
  // step's bar spans its start to its record on the run's own time line.
  const began = Date.parse(run.started_at);
  const ended = run.finished_at ? Date.parse(run.finished_at) : Date.now();
  const span = Math.max(ended - began, 1);
  document.getElementById(`${prefix}-steps`).replaceChildren(
    ...run.steps.map((step) => {
      const from = step.started_at ? Date.parse(step.started_at) : began;
      const to = step.recorded_at ? Date.parse(step.recorded_at) : ended;
      const bar = el("i", {});
      bar.style.left = `${Math.max(0, ((from - began) / span) * 100)}%`;
      bar.style.width = `${Math.max(0, Math.min(100, ((to - from) / span) * 100))}%`;
      return el(
        "li",
        { class: step.status, dataset: { seq: String(step.seq) } },
        el("span", { class: "tag" }, `${step.kind} ${step.name}`),
        " ",
        el("span", { class: "mono" }, step.status === "done" ? JSON.stringify(step.outcome) : step.detail || ""),
        " ",
        el("span", { class: "muted" }, step.status === "done" ? when(step.recorded_at) : `pending since ${when(step.started_at)}`),
        el("span", { class: "span", title: `${when(step.started_at)} → ${when(step.recorded_at) || "now"}` }, bar),
      );
    }),
  );
  fill(
    document.querySelector(`#${prefix}-signals tbody`),
    run.signals.map((g) =>
      el(
        "tr",
        { class: g.state === "pending" ? "" : "finished" },
        el("td", {}, g.name),
        el("td", { class: g.state === "set_aside" ? "error" : "" }, g.state === "consumed" ? `consumed at step ${g.consumed_seq}` : g.state.replace("_", " ")),
        el("td", { class: "mono" }, JSON.stringify(g.payload)),
        el("td", {}, when(g.sent_at)),
      ),
    ),
  );
}

// --- the overview: charts of the last hour ----------------------------------------------------

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

function shortNumber(n) {
  if (n >= 10000) return `${Math.round(n / 1000)}k`;
  if (n >= 1000) return `${(n / 1000).toFixed(1)}k`;
  return n >= 10 || Number.isInteger(n) ? String(Math.round(n)) : n.toFixed(1);
}

// The top of a chart's scale: 1, 2 or 5 times a power of ten, at or above `n`.
function niceMax(n) {
  if (n <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(n));
  return [1, 2, 5, 10].map((f) => f * power).find((m) => m >= n);
}

// A chart of `points` over the last hour: `lines` are drawn as lines (a null value is a gap),
// `bars` stacked per interval. Each series is {label, color, value: point -> number | null}.
function drawChart(id, points, { lines = [], bars = [], missing = "" }) {
  const figure = document.getElementById(id);
  const caption = figure.querySelector("figcaption");
  const W = 600, H = 150, left = 36, right = 8, top = 8, bottom = 18;
  const end = points.length ? points[points.length - 1].at_ms : Date.now();
  const start = end - CHART_SPAN_MS;
  const x = (ms) => left + ((ms - start) / CHART_SPAN_MS) * (W - left - right);
  const known = [...lines, ...bars].some((s) => points.some((p) => s.value(p) !== null));
  let max = 0;
  for (const p of points) {
    for (const s of lines) max = Math.max(max, s.value(p) || 0);
    max = Math.max(max, bars.reduce((sum, s) => sum + (s.value(p) || 0), 0));
  }
  max = niceMax(max);
  const y = (v) => top + (1 - v / max) * (H - top - bottom);
  const chart = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img" });
  for (const f of [0, 0.5, 1]) {
    chart.append(svg("line", { x1: left, x2: W - right, y1: y(max * f), y2: y(max * f), stroke: "#eaecf0" }));
    chart.append(svg("text", { x: left - 4, y: y(max * f) + 3, "text-anchor": "end" }, shortNumber(max * f)));
  }
  for (const [ms, anchor] of [[start, "start"], [start + CHART_SPAN_MS / 2, "middle"], [end, "end"]]) {
    chart.append(svg("text", { x: x(ms), y: H - 4, "text-anchor": anchor }, clock(ms)));
  }
  const width = Math.max(2, (x(end) - x(end - 15000)) * 0.8);
  for (const p of points) {
    let base = 0;
    for (const s of bars) {
      const v = s.value(p) || 0;
      if (v > 0) chart.append(svg("rect", { x: x(p.at_ms) - width, y: y(base + v), width, height: y(base) - y(base + v), fill: s.color, "data-series": s.label }));
      base += v;
    }
  }
  for (const s of lines) {
    let path = "";
    let pen = "M";
    for (const p of points) {
      const v = s.value(p);
      if (v === null || v === undefined) {
        pen = "M";
        continue;
      }
      path += `${pen}${x(p.at_ms).toFixed(1)},${y(v).toFixed(1)} `;
      pen = "L";
    }
    if (path) chart.append(svg("path", { d: path, fill: "none", stroke: s.color, "stroke-width": 1.6, "data-series": s.label }));
  }
  const legend = el(
    "div",
    { class: "legend" },
    ...[...lines, ...bars].map((s) => {
      const swatch = el("b", {});
      swatch.style.background = s.color;
      const last = [...points].reverse().find((p) => s.value(p) !== null);
      return el("span", {}, swatch, `${s.label} ${last ? shortNumber(s.value(last)) : "–"}`);
    }),
  );
  const children = [caption, chart, legend];
  if (!known && missing) children.push(el("p", { class: "empty" }, missing));
  figure.replaceChildren(...children);
  figure.dataset.points = String(points.length);
}

async function loadCharts() {
  const { points, sampled } = await api("series?minutes=60");
  const unsampled = "Not sampled by this runner: the $maintenance owner samples these.";
  document.getElementById("overview-note").textContent = points.length
    ? sampled
      ? ""
      : unsampled
    : "The runtime records a point every 15 s: the charts fill in as it runs.";
  drawChart("chart-commits", points, { lines: [{ label: "commits/s", color: "#2456c9", value: (p) => p.commits_per_s }] });
  drawChart("chart-lag", points, { lines: [{ label: "lag ms", color: "#b54708", value: (p) => p.relay_lag_ms }], missing: unsampled });
  drawChart("chart-backlog", points, { lines: [{ label: "rows", color: "#6941c6", value: (p) => p.outbox_rows }], missing: unsampled });
  drawChart("chart-jobs", points, {
    bars: [
      { label: "succeeded", color: "#12b76a", value: (p) => p.jobs.succeeded },
      { label: "retried", color: "#f79009", value: (p) => p.jobs.retried },
      { label: "dead", color: "#d92d20", value: (p) => p.jobs.dead },
    ],
  });
  drawChart("chart-workflows", points, {
    lines: [
      { label: "running", color: "#2456c9", value: (p) => p.workflows.running },
      { label: "suspended", color: "#6941c6", value: (p) => p.workflows.suspended },
    ],
    bars: [
      { label: "completed", color: "#12b76a", value: (p) => p.workflows.completed },
      { label: "failed", color: "#d92d20", value: (p) => p.workflows.failed },
    ],
  });
}

async function loadOverviewTab() {
  await loadOverview();
  await loadCharts();
}

// --- workflows: runs across actors ----------------------------------------------------------

function runFilters() {
  const value = (id) => document.getElementById(id).value.trim() || null;
  return { status: value("runs-status"), workflow: value("runs-workflow"), type: value("runs-type"), tenant: value("runs-tenant") };
}

function runStatus(r) {
  return r.status + (r.cancel_requested && !r.finished_at ? " (cancel requested)" : "");
}

async function loadWorkflowsTab() {
  const { runs } = await api("runs?" + query({ ...runFilters(), limit: 200 }));
  const names = new Set([...document.querySelectorAll("#runs-workflows option")].map((o) => o.value));
  for (const r of runs) if (!names.has(r.workflow)) document.getElementById("runs-workflows").append(el("option", { value: r.workflow }));
  fill(
    document.querySelector("#runs tbody"),
    runs.map((r) =>
      el(
        "tr",
        { class: r.run_id === state.wfRun ? "active" : "", dataset: { run: r.run_id }, onclick: () => openWfRun(r.run_id).catch(failed) },
        el("td", { class: "mono" }, r.run_id),
        el("td", {}, refText(r.ref)),
        el("td", {}, r.workflow),
        el("td", { class: `run-status ${r.status === "failed" || r.status === "diverged" ? "error" : ""}` }, runStatus(r)),
        el("td", {}, wakeText(r.wake)),
        el("td", {}, when(r.started_at)),
      ),
    ),
  );
  if (state.wfRun) await loadWfRun();
}

async function openWfRun(runId) {
  state.wfRun = runId;
  for (const tr of document.querySelectorAll("#runs tbody tr")) tr.classList.toggle("active", tr.dataset.run === runId);
  await loadWfRun();
}

async function loadWfRun() {
  const run = await api("workflows/" + encodeURIComponent(state.wfRun));
  document.getElementById("wf-run").hidden = false;
  renderRun(run, "wf-run");
  const ended = ["completed", "failed", "cancelled"].includes(run.status);
  document.getElementById("wf-cancel").disabled = ended || (run.cancel_requested && run.status !== "diverged");
  document.getElementById("wf-retry").hidden = run.status !== "diverged";
  document.getElementById("wf-signal").disabled = ended;
}

async function operateRun(action) {
  const runId = state.wfRun;
  if (!runId) return;
  let options = { method: "POST" };
  if (action === "cancel" && !window.confirm(`Cancel workflow run ${runId}? Its next durable await raises WorkflowCancelled.`)) return;
  if (action === "signal") {
    const name = document.getElementById("wf-signal-name").value.trim();
    let payload;
    try {
      payload = JSON.parse(document.getElementById("wf-signal-payload").value || "{}");
    } catch (e) {
      status("The signal's payload is not JSON.", true);
      return;
    }
    options = { method: "POST", body: JSON.stringify({ name, payload }) };
  }
  try {
    const result = await api(`workflows/${encodeURIComponent(runId)}/${action}`, options);
    const said = { signal: `signal ${result.signal} sent to ${runId}`, cancel: `cancel ${result.cancel} for ${runId}`, retry: result.retried ? `retried ${runId}` : `${runId} was not diverged` };
    status(said[action]);
  } catch (error) {
    failed(error);
  }
  await refresh();
}

function eventItem(e, fresh) {
  return el(
    "li",
    { class: fresh ? "new" : "", dataset: { cursor: e.cursor } },
    el("span", { class: "tag" }, e.tag),
    " ",
    el("span", { class: "mono" }, JSON.stringify(e.event)),
    " ",
    el("span", { class: "muted" }, when(e.emitted_at)),
  );
}

function follow(after, controller) {
  const { type, id, tenant } = state.actor;
  let cursor = after;
  const live = document.getElementById("events-live");
  const run = async () => {
    while (!controller.signal.aborted) {
      try {
        live.hidden = false;
        await sse(
          "actor/events?" + query({ type, id, tenant, after: cursor }),
          (event, data, frameId) => {
            if (event === "retention_gap") return;
            cursor = frameId || cursor;
            const list = document.getElementById("events");
            list.prepend(eventItem(data, true));
          },
          controller.signal,
        );
      } catch (error) {
        if (controller.signal.aborted) return;
        failed(error);
      }
      live.hidden = true;
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
    }
  };
  run();
}

// The actor's row as it commits (a commit need not emit an event): its facts and state at once,
// then the rest of the detail (outbox rows, runs) read again.
function followState(controller) {
  const { type, id, tenant } = state.actor;
  const live = document.getElementById("state-live");
  const run = async () => {
    while (!controller.signal.aborted) {
      try {
        live.hidden = false;
        await sse(
          "actor/state?" + query({ type, id, tenant }),
          (event, data) => {
            if (event === "error") throw new Refused(data.status, data);
            if (event !== "state") return;
            const moved = data.version > state.shown;
            showRow(data);
            if (moved) loadActor().catch(failed); // the first frame is the version just read
          },
          controller.signal,
        );
      } catch (error) {
        if (controller.signal.aborted) return;
        failed(error);
      }
      live.hidden = true;
      await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
    }
  };
  run();
}

// --- outbox, jobs, dead letters --------------------------------------------------------------

async function loadOutbox() {
  const { outbox } = await api("outbox?limit=200");
  fill(
    document.querySelector("#outbox tbody"),
    outbox.map((o) =>
      el(
        "tr",
        {},
        el("td", { class: "mono" }, o.id),
        el("td", {}, o.role),
        el("td", {}, refText(o.sender)),
        el("td", {}, `${o.target.type}/${o.target.id || "_"}`),
        el("td", {}, o.command),
        el("td", {}, String(o.attempts)),
        el("td", { class: "error" }, o.last_error || ""),
        el("td", {}, when(o.due_at)),
      ),
    ),
  );
}

function progressCell(job) {
  let entry = state.progress.get(job.job_id);
  const open = [...state.progress.values()].filter((e) => !e.ended).length;
  if (!entry && job.status === "running" && open < MAX_PROGRESS_FEEDS) {
    const bar = el("progress", { max: "1" });
    const label = el("span", { class: "muted progress-label" }, "");
    entry = { abort: new AbortController(), bar, label, closed: false, ended: false };
    state.progress.set(job.job_id, entry);
    watchProgress(job, entry);
  }
  if (!entry) return el("td", { class: "muted" }, job.status === "running" ? "…" : "");
  return el("td", {}, entry.bar, " ", entry.label);
}

// The close carries the job's outcome: succeeded, dead_lettered, cancelled or unknown.
function closeProgress(entry, outcome) {
  entry.closed = true;
  entry.bar.value = entry.bar.max;
  const known = outcome && outcome !== "unknown";
  entry.label.textContent = known ? `finished · ${outcome.replace("_", "-")}` : "finished";
}

async function watchProgress(job, entry) {
  const path = "jobs/progress?" + query({ type: job.ref.type, id: job.ref.id, tenant: job.ref.tenant, job_id: job.job_id });
  try {
    await sse(
      path,
      (event, message) => {
        if (event === "closed") {
          closeProgress(entry, message.outcome);
          return;
        }
        const frame = message.frame || {};
        if (typeof frame.done === "number" && typeof frame.total === "number" && frame.total > 0) {
          entry.bar.max = frame.total;
          entry.bar.value = frame.done;
          entry.label.textContent = `${frame.done}/${frame.total}` + (frame.message ? ` ${frame.message}` : "");
        } else {
          entry.bar.removeAttribute("value");
          entry.label.textContent = JSON.stringify(frame);
        }
      },
      entry.abort.signal,
    );
  } catch (error) {
    // The job ended, leaving no row to tell how, before its feed opened: nothing to follow.
    if (error instanceof Refused && error.code === "unknown_job") closeProgress(entry, "unknown");
    else failed(error);
  } finally {
    entry.ended = true;
    // A feed that ended without the close is opened again by the next poll, if still running.
    if (!entry.closed && state.progress.get(job.job_id) === entry) state.progress.delete(job.job_id);
  }
}

async function loadJobs() {
  const { jobs } = await api("jobs?limit=200");
  const current = new Set(jobs.map((j) => j.job_id));
  for (const job of jobs) state.seen.set(job.job_id, job);
  const rows = [];
  for (const [jobId, job] of state.seen) {
    const gone = !current.has(jobId);
    const entry = state.progress.get(jobId);
    if (gone && !entry) {
      state.seen.delete(jobId); // left the outbox unwatched: nothing more to show
      continue;
    }
    // A gone job with an open feed keeps its row: the feed ends with the job's close.
    const shown = gone ? (entry.closed ? "finished" : "ending") : job.status;
    rows.push(
      el(
        "tr",
        {
          class: [shown === "finished" ? "finished" : "", state.job && state.job.job.job_id === jobId ? "active" : ""].join(" ").trim(),
          dataset: { job: jobId },
          onclick: () => openJob(job),
        },
        el("td", { class: "mono" }, jobId),
        el("td", {}, refText(job.ref)),
        el("td", {}, job.job),
        el("td", { class: "job-status" }, shown),
        el("td", {}, String(job.attempts)),
        progressCell(job),
        el("td", { class: "error" }, job.last_error || ""),
      ),
    );
  }
  fill(document.querySelector("#jobs tbody"), rows);
}

// --- a job's output stream --------------------------------------------------------------------

function openJob(job) {
  closeJobFeed();
  const entry = { job, after: 0, abort: null, closed: false };
  state.job = entry;
  document.getElementById("job").hidden = false;
  document.getElementById("job-title").textContent = `${job.job} · ${job.job_id} · ${refText(job.ref)}`;
  document.getElementById("job-output").replaceChildren();
  document.getElementById("job-outcome").textContent = "";
  for (const tr of document.querySelectorAll("#jobs tbody tr")) tr.classList.toggle("active", tr.dataset.job === job.job_id);
  followJob(entry);
}

function closeJobFeed() {
  if (state.job && state.job.abort) state.job.abort.abort();
}

// One item of the stream: an attempt's start strikes through what earlier attempts streamed.
function showItem(entry, event, item) {
  const output = document.getElementById("job-output");
  entry.after = item.seq;
  if (event === "attempt") {
    for (const chunk of output.querySelectorAll(".chunk")) chunk.classList.add("superseded");
    output.append(el("span", { class: "attempt" }, `attempt ${item.attempt}`));
  } else if (event === "chunk") {
    const text = typeof item.data === "string" ? item.data : JSON.stringify(item.data);
    const kind = typeof item.data === "string" ? "chunk" : "chunk value";
    output.append(el("span", { class: kind, dataset: { seq: String(item.seq), attempt: String(item.attempt) } }, text));
  } else if (event === "closed") {
    entry.closed = true;
    document.getElementById("job-outcome").textContent = `finished · ${item.outcome.replace("_", "-")}`;
  }
}

// Follows the job's output from the last item shown: a feed that ended without the close (or
// was closed when another tab was shown) resumes where it stopped.
async function followJob(entry) {
  const { job } = entry;
  const controller = new AbortController();
  entry.abort = controller;
  const live = document.getElementById("job-live");
  while (!controller.signal.aborted && !entry.closed) {
    const params = { type: job.ref.type, id: job.ref.id, tenant: job.ref.tenant, job_id: job.job_id, after: entry.after };
    try {
      live.hidden = false;
      await sse("jobs/stream?" + query(params), (event, item) => showItem(entry, event, item), controller.signal);
    } catch (error) {
      if (controller.signal.aborted) break;
      if (error instanceof Refused && error.status !== 401 && error.status !== 403 && error.status < 500) {
        // Nothing (more) to read: no row names the job any more, or retention took its stream.
        entry.closed = true;
        document.getElementById("job-outcome").textContent = error.message;
      } else failed(error);
    }
    live.hidden = true;
    if (!entry.closed && !controller.signal.aborted) await new Promise((resolve) => setTimeout(resolve, RECONNECT_MS));
  }
  live.hidden = true;
}

async function loadLetters() {
  const { dead_letters: letters } = await api("dead-letters?limit=200");
  fill(
    document.querySelector("#letters tbody"),
    letters.map((d) =>
      el(
        "tr",
        { class: d.ambiguous ? "ambiguous" : "", dataset: { job: d.job_id } },
        el("td", { class: "mono" }, d.job_id),
        el("td", {}, refText(d.ref)),
        el("td", {}, d.job),
        el("td", {}, String(d.attempts)),
        d.ambiguous
          ? el(
              "td",
              { class: "warning", title: "The job may have reached its provider before it died." },
              "yes: may already have been applied",
            )
          : el("td", {}, "no"),
        el("td", { class: "error" }, d.cause),
        el("td", {}, when(d.dead_at)),
        el(
          "td",
          {},
          el("button", { type: "button", class: "retry", onclick: () => operate(d, "retry") }, "Retry"),
          el("button", { type: "button", class: "discard", onclick: () => operate(d, "discard") }, "Discard"),
        ),
      ),
    ),
  );
}

function confirmed(letter, action) {
  const jobId = letter.job_id;
  if (action === "discard") return window.confirm(`Discard dead letter ${jobId}? This cannot be undone.`);
  // As `akter dead-letters retry` warns: an ambiguous letter's call may have been applied.
  if (letter.ambiguous) {
    return window.confirm(
      `Dead letter ${jobId} is ambiguous: the provider may already have applied the call. ` +
        "Retrying runs it again under a new job id. Retry anyway?",
    );
  }
  return true;
}

async function operate(letter, action) {
  const jobId = letter.job_id;
  if (!confirmed(letter, action)) return;
  try {
    const result = await api(`dead-letters/${encodeURIComponent(jobId)}/${action}`, { method: "POST" });
    status(action === "retry" ? `retried ${jobId} as job ${result.new_job_id}` : `discarded ${jobId}`);
  } catch (error) {
    failed(error);
  }
  await refresh();
}

// --- parked rows (evolution E3) --------------------------------------------------------------

async function loadParked() {
  const { parked } = await api("parked");
  fill(
    document.querySelector("#parked tbody"),
    parked.map((p) =>
      el(
        "tr",
        { dataset: { row: p.id } },
        el("td", { class: "mono" }, p.id),
        el("td", {}, p.kind),
        el("td", {}, `${p.actor_type}/${p.actor_id}`),
        el("td", {}, p.command),
        el("td", { class: "error" }, p.error),
        el("td", {}, when(p.parked_at)),
        el(
          "td",
          {},
          el("button", { type: "button", class: "retry", onclick: () => operateParked(p, "retry") }, "Retry"),
          el("button", { type: "button", class: "discard", onclick: () => operateParked(p, "discard") }, "Discard"),
        ),
      ),
    ),
  );
}

async function operateParked(row, action) {
  let options = { method: "POST" };
  if (action === "discard") {
    // A discard is audited with the reason given (v_operator_audit): ask for one.
    const reason = window.prompt(`Discard parked row ${row.id}? It is deleted and audited. Reason:`);
    if (!reason || !reason.trim()) return;
    options = { method: "POST", body: JSON.stringify({ reason }) };
  }
  try {
    await api(`parked/${encodeURIComponent(row.id)}/${action}`, options);
    status(action === "retry" ? `retried ${row.id}` : `discarded ${row.id}`);
  } catch (error) {
    failed(error);
  }
  await refresh();
}

// --- subscriptions (the subscriptions spec) -----------------------------------------------------

async function loadSubscriptions() {
  const { subscriptions } = await api("subscriptions");
  fill(
    document.querySelector("#subscriptions tbody"),
    subscriptions.map((s) =>
      el(
        "tr",
        { dataset: { subscription: s.subscription } },
        el("td", { class: "mono" }, s.subscription),
        el("td", {}, s.subscriber_type),
        el("td", {}, String(s.pending)),
        el("td", { class: s.parked ? "error" : "" }, String(s.parked)),
        el("td", {}, `${s.lag_ms} ms`),
      ),
    ),
  );
}

// --- owned tables (docs/guides/owned-tables.md): one tenant's rows, read-only -------------------

// The tables, as the server last listed them, by name; the page shown and its cursor.
const tables = { known: new Map(), shown: null, next: null };

// The poll refreshes the list of tables only: a page of rows is read when the operator asks,
// so paging is never reset under them.
async function loadTables() {
  const { tables: found } = await api("tables");
  const select = document.getElementById("tables-table");
  const names = found.map((t) => t.table);
  if (names.join("\n") === [...tables.known.keys()].join("\n")) return;
  tables.known = new Map(found.map((t) => [t.table, t]));
  const chosen = select.value;
  select.replaceChildren(...found.map((t) => el("option", { value: t.table }, `${t.table} (${t.owner})`)));
  if (names.includes(chosen)) select.value = chosen;
  showFilters();
}

function showFilters() {
  const table = tables.known.get(document.getElementById("tables-table").value);
  const columns = table ? table.columns.filter((c) => c !== table.tenant_column) : [];
  fill(
    document.getElementById("tables-filters"),
    columns.map((c) => el("label", {}, c, " ", el("input", { dataset: { column: c }, autocomplete: "off" }))),
  );
  fill(document.querySelector("#tables-rows thead"), []);
  fill(document.querySelector("#tables-rows tbody"), []);
  document.getElementById("tables-more").hidden = true;
}

async function readTable(more) {
  const table = tables.known.get(document.getElementById("tables-table").value);
  if (!table) return;
  const params = { table: table.table, tenant: document.getElementById("tables-tenant").value.trim() || "default", limit: 50 };
  for (const input of document.querySelectorAll("#tables-filters input")) {
    if (input.value !== "") params[input.dataset.column] = input.value;
  }
  if (more) params.after = tables.next;
  const page = await api("table?" + query(params));
  const head = document.querySelector("#tables-rows thead");
  const body = document.querySelector("#tables-rows tbody");
  if (!more) {
    fill(head, [el("tr", {}, ...table.columns.map((c) => el("th", {}, c)))]);
    fill(body, []);
  }
  body.append(
    ...page.rows.map((row) =>
      el("tr", {}, ...table.columns.map((c) => el("td", { class: "mono" }, row[c] === null ? "null" : typeof row[c] === "object" ? JSON.stringify(row[c]) : String(row[c])))),
    ),
  );
  tables.next = page.next;
  document.getElementById("tables-more").hidden = !page.next;
}

// --- tabs and the refresh loop ---------------------------------------------------------------

// An open actor's workflow runs (and the run shown) follow the poll: a run moves without events.
async function loadActorsTab() {
  await loadOverview();
  if (state.actor) await loadRuns();
}

const loaders = {
  overview: loadOverviewTab,
  actors: loadActorsTab,
  workflows: loadWorkflowsTab,
  outbox: loadOutbox,
  jobs: loadJobs,
  letters: loadLetters,
  parked: loadParked,
  subscriptions: loadSubscriptions,
  tables: loadTables,
};

async function refreshOnce() {
  try {
    if (state.tab !== "actors" && state.tab !== "overview") await loadOverview();
    await loaders[state.tab]();
    document.getElementById("login").hidden = true;
    if (document.getElementById("status").className === "error") status("");
  } catch (error) {
    failed(error);
  }
}

// One refresh at a time: a refresh asked for while one runs makes that one run once more.
function refresh() {
  if (state.refreshing) {
    state.again = true;
    return state.refreshing;
  }
  state.refreshing = (async () => {
    do {
      state.again = false;
      await refreshOnce();
    } while (state.again);
  })().finally(() => {
    state.refreshing = null;
  });
  return state.refreshing;
}

// The next poll starts POLL_MS after the previous one ended; a hidden tab does not poll.
function schedule() {
  clearTimeout(state.timer);
  state.timer = null;
  if (document.visibilityState === "hidden") return;
  state.timer = setTimeout(async () => {
    state.timer = null;
    await refresh();
    schedule();
  }, POLL_MS);
}

function visibilityChanged() {
  if (document.visibilityState === "hidden") {
    clearTimeout(state.timer);
    state.timer = null;
    return;
  }
  refresh().then(schedule);
}

function showTab(tab) {
  const left = state.tab;
  state.tab = loaders[tab] ? tab : "overview";
  tab = state.tab;
  // Live feeds belong to their tab: each holds a connection (see MAX_PROGRESS_FEEDS).
  if (left === "actors" && tab !== "actors") closeActorFeeds();
  if (left === "jobs" && tab !== "jobs") closeJobFeed();
  if (tab === "actors" && left !== "actors" && state.actor && !state.feed) {
    openActor(state.actor.type, state.actor.id, state.actor.tenant).catch(failed);
  }
  if (tab === "jobs" && left !== "jobs" && state.job && !state.job.closed) followJob(state.job);
  sessionStorage.setItem(TAB_KEY, tab);
  for (const button of document.querySelectorAll(".tab")) button.classList.toggle("active", button.dataset.tab === tab);
  for (const panel of document.querySelectorAll(".panel")) panel.hidden = panel.id !== `tab-${tab}`;
  refresh();
}

function start() {
  takeToken();
  for (const button of document.querySelectorAll(".tab")) button.addEventListener("click", () => showTab(button.dataset.tab));
  document.getElementById("actors-more").addEventListener("click", () => loadActors().catch(failed));
  document.getElementById("login-submit").addEventListener("click", () => {
    const header = document.getElementById("login-header").value.trim();
    const value = document.getElementById("login-value").value.trim();
    sessionStorage.setItem(AUTH_KEY, JSON.stringify({ header, value }));
    if (state.actor) openActor(state.actor.type, state.actor.id, state.actor.tenant).catch(failed);
    refresh();
  });
  for (const id of ["runs-status", "runs-workflow", "runs-type", "runs-tenant"]) {
    document.getElementById(id).addEventListener("change", () => refresh());
  }
  document.getElementById("tables-table").addEventListener("change", showFilters);
  document.getElementById("tables-read").addEventListener("click", () => readTable(false).catch(failed));
  document.getElementById("tables-more").addEventListener("click", () => readTable(true).catch(failed));
  document.getElementById("wf-cancel").addEventListener("click", () => operateRun("cancel"));
  document.getElementById("wf-retry").addEventListener("click", () => operateRun("retry"));
  document.getElementById("wf-signal").addEventListener("click", () => operateRun("signal"));
  document.addEventListener("visibilitychange", visibilityChanged);
  // The first screen is the overview; a reload keeps the tab the operator was on.
  showTab(sessionStorage.getItem(TAB_KEY) || "overview");
  schedule();
}

document.addEventListener("DOMContentLoaded", start);
