// The operator's page (docs/page.md): polls the controller it came from, draws
// what it says, and sends an action only with the token a person typed in.
// No request goes to any other host; nothing here builds HTML from data.
"use strict";

const STATUS_EVERY_MS = 1000;    // /v1/status and /v1/nodes: at most every 2 s (docs/page.md)
const INCIDENTS_EVERY_MS = 5000;
const TOKEN_KEY = "spark-watchdog-token";
const LIVE_SIGNALS = new Set(["agent_progress", "agent_answer", "gpu", "vllm", "host"]);
const STATE_WORDS = { fencing: "power cycle in progress", booting: "booting after power cycle", held: "held", watching: "" };
const MEASURES = [
  ["mem_available_bytes", "MemAvailable", (v) => v / 1073741824, "GiB"],
  ["mem_pressure_full_avg10", "PSI full", (v) => v, "%"],
  ["gpu_power_w", "GPU power", (v) => v, "W"],
  ["gpu_sm_clock_mhz", "SM clock", (v) => v, "MHz"],
  ["vllm_running", "vLLM running", (v) => v, ""],
  ["vllm_waiting", "vLLM waiting", (v) => v, ""],
];

const $ = (id) => document.getElementById(id);
const seen = new Map();          // node -> [[time, label]]: what this page watched happen
let status = null;
let nodesView = null;
let openIncident = null;
let pending = null;              // the action the dialog confirms

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  if (seconds < 90) return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  return `${(seconds / 3600).toFixed(1)} h ago`;
}

function clock(iso) {
  if (!iso) return "–";
  const when = new Date(iso);
  return Number.isNaN(when.getTime()) ? String(iso) : when.toLocaleString();
}

async function getJson(path) {
  const answer = await fetch(path, { cache: "no-store", credentials: "omit" });
  const body = await answer.json().catch(() => ({}));
  if (!answer.ok) throw new Error(body.error || `${answer.status} ${answer.statusText}`);
  return body;
}

// -- the cluster and its nodes ---------------------------------------------------

function noteSeen(node) {
  // A fencing node's verdict is host_frozen: the power cycle is what happens to it.
  const label = node.state === "fencing" ? `${node.verdict}, power cycle` : node.verdict;
  const list = seen.get(node.name) || [];
  if (!list.length || list[list.length - 1][1] !== label) {
    list.push([new Date(), label]);
    while (list.length > 10) list.shift();
    seen.set(node.name, list);
  }
}

// Each verdict's colour and words come with /v1/nodes, from the controller's
// one table of verdicts (spark_watchdog/verdicts.py): this page keeps no list.
function verdictRow(verdict) {
  const table = nodesView && nodesView.verdicts ? nodesView.verdicts : {};
  return Object.prototype.hasOwnProperty.call(table, verdict) ? table[verdict] : { colour: "unknown", words: "" };
}

function signalsOf(node, extra) {
  const list = el("div", { class: "signals" });
  const signals = (extra && extra.signals) || { agent_progress: node.agent_silent_s };
  const names = { agent_progress: "agent", agent_answer: "agent answer", ssh_banner: "SSH banner", ssh_any: "SSH any", peers: "seen by peers", gpu: "GPU", vllm: "vLLM", journal: "journal", host: "host" };
  for (const [key, label] of Object.entries(names)) {
    if (!(key in signals)) continue;
    const age = signals[key];
    // Red: a signal that should refresh every poll is older than freeze_after. The
    // journal is read every 30 s, and a healthy node's banner only now and then.
    const old = LIVE_SIGNALS.has(key) && (age === null || age > (status ? status.freeze_after_s : 30));
    list.append(el("span", { class: old ? "old" : "", "data-signal": key }, `${label}: ${ago(age)}`));
  }
  return list;
}

function servingOf(extra) {
  if (!extra || !extra.serving) return null;
  const s = extra.serving;
  const asked = nodesView && nodesView.serving_profile ? nodesView.serving_profile.asked : null;
  const effective = s.effective ? Object.entries(s.effective).filter(([, v]) => v !== null).map(([k, v]) => `${k} ${v}`).join(", ") : "";
  const match = s.effective_matches_profile === false ? " (differs from the profile!)" : "";
  return el("p", { class: "muted" },
    `serving: ${s.state || "unknown"}, profile ${s.profile || "–"} (controller asks ${asked || "as configured"})` +
    (effective ? `; in force: ${effective}${match}` : ""));
}

function powerOf(extra) {
  if (!extra || !extra.power) return null;
  const path = extra.power.map((d) => [d.type, d.host, d.outlet !== undefined ? `outlet ${d.outlet}` : null, d.url].filter(Boolean).join(" ")).join(" → ");
  return el("p", { class: "muted" }, `power path: ${path || "none"}`);
}

function nodeCard(node) {
  const extra = nodesView ? (nodesView.nodes || []).find((n) => n.name === node.name) : null;
  const row = verdictRow(node.verdict);
  const card = el("article", { class: `card v-${row.colour}`, "data-node": node.name, "aria-label": `Node ${node.name}` });
  const stateWord = STATE_WORDS[node.state] || node.state;
  card.append(el("h3", {}, node.name, el("span", { class: "verdict", "data-verdict": node.verdict, title: row.words }, node.verdict)));
  if (stateWord) card.append(el("p", { class: "state", "data-state": node.state, text: stateWord }));
  const reasons = el("ul", { class: "reasons" });
  for (const reason of node.reasons || []) reasons.append(el("li", { text: reason }));
  card.append(reasons, signalsOf(node, extra), powerOf(extra), servingOf(extra));
  if (node.held_reason) card.append(el("p", { class: "banner", text: `held: ${node.held_reason}` }));
  if (node.incident_id) {
    card.append(el("p", {}, el("button", { type: "button", "data-incident": node.incident_id, "aria-label": `Open incident ${node.incident_id} of ${node.name}` }, `Incident #${node.incident_id}`)));
  }
  if (node.hardware_suspect) card.append(el("p", { class: "error", text: `hardware suspect: ${node.freezes_in_window} freezes` }));
  const history = el("ol", { class: "seen", "aria-label": `What this page saw of ${node.name}` });
  for (const [when, label] of seen.get(node.name) || []) history.append(el("li", { "data-seen": label, text: `${when.toLocaleTimeString()} ${label}` }));
  card.append(history);
  const buttons = el("div", { class: "buttons" });
  const held = node.state === "held";
  buttons.append(el("button", { type: "button", class: "action", "data-action": held ? "release" : "hold", "data-target": node.name, "aria-label": `${held ? "Release" : "Hold"} ${node.name}` }, held ? "Release" : "Hold"));
  card.append(buttons);
  return card;
}

function drawCluster() {
  const facts = $("cluster-facts");
  facts.replaceChildren();
  const add = (term, value) => facts.append(el("dt", { text: term }), el("dd", { text: value }));
  if (status.standby) {
    const leader = status.standby.leader;
    add("this controller", `standby (${status.standby.holder || "?"})`);
    add("leader", leader && !leader.expired ? `${leader.holder}, epoch ${leader.epoch}` : "nobody leads");
    $("nodes").replaceChildren(el("p", { text: "This controller of a pair stands by: open the leader's page for the nodes." }));
    $("cluster-hold").hidden = true;
    $("step-down").hidden = true;
    return;
  }
  const lead = status.leadership;
  add("pair", lead ? `this controller leads (${lead.holder}, epoch ${lead.epoch})` : "a lone controller");
  add("history", status.history);
  add("witness", typeof status.witness === "string" ? status.witness : JSON.stringify(status.witness));
  add("serving profile", status.serving_profile || "as configured");
  add("dry run", status.dry_run ? "yes: nothing is power-cycled" : "no");
  add("circuit breaker", nodesView && nodesView.breaker_open ? "OPEN: too many nodes look frozen at once, nothing is fenced" : status.cluster_hold ? "latched (cluster held)" : "closed");
  add("poll sweep", `${status.ticks} sweeps, last ${status.last_sweep_s} s`);
  $("cluster-hold").hidden = !status.cluster_hold;
  $("cluster-hold-text").textContent = status.cluster_hold ? `Cluster held (breaker or an operator): ${status.cluster_hold}` : "";
  $("step-down").hidden = !lead;
  for (const node of status.nodes || []) noteSeen(node);
  const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset : {};
  $("nodes").replaceChildren(...(status.nodes || []).map(nodeCard));
  if (focused.action && focused.target) {
    // Redrawn every second: keep a keyboard user's place.
    const again = document.querySelector(`#nodes button[data-target="${CSS.escape(focused.target)}"]`);
    if (again) again.focus();
  }
  syncFilterNodes();
  syncFilterKinds();
  lockActions();
}

function syncFilterKinds() {
  const kinds = nodesView && nodesView.incident_kinds ? nodesView.incident_kinds : [];
  const select = $("filter-kind");
  const have = [...select.options].slice(1).map((o) => o.value);
  if (!kinds.length || kinds.join() === have.join()) return;
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "", text: "all kinds" }), ...kinds.map((k) => el("option", { value: k, text: k })));
  select.value = chosen;
}

function syncFilterNodes() {
  const select = $("filter-node");
  const names = (status.nodes || []).map((n) => n.name);
  const have = [...select.options].slice(1).map((o) => o.value);
  if (names.join() === have.join()) return;
  const chosen = select.value;
  select.replaceChildren(el("option", { value: "", text: "all nodes" }), ...names.map((n) => el("option", { value: n, text: n })));
  select.value = chosen;
}

async function pollStatus() {
  try {
    status = await getJson("/v1/status");
    if (!status.standby) nodesView = await getJson("/v1/nodes").catch(() => nodesView);
    const counts = {};
    for (const node of status.nodes || []) counts[node.verdict] = (counts[node.verdict] || 0) + 1;
    $("summary").textContent = status.standby ? "This controller stands by." :
      `${(status.nodes || []).length} nodes: ` + Object.entries(counts).map(([v, n]) => `${n} ${v}`).join(", ");
    $("freshness").textContent = `updated ${new Date().toLocaleTimeString()}`;
    drawCluster();
  } catch (error) {
    $("freshness").textContent = `the controller does not answer (${error.message}); retrying`;
  }
  setTimeout(pollStatus, STATUS_EVERY_MS);
}

// -- incidents -------------------------------------------------------------------

// Where controllers run on the Sparks, this page's controller also asks the
// others for theirs (GET /v1/colocated/incidents): each incident names who
// acted, and an incident is "node#id". The page still talks to this host alone.
function incidentItem(i, merged) {
  const name = merged ? i.ref : `#${i.id}`;
  const by = merged ? ` — by ${i.by}` : "";
  return el("li", {}, el("button", {
    type: "button", "data-incident": merged ? `${i.by}/${i.id}` : String(i.id), "data-by": merged ? i.by : "",
    "aria-label": `Open incident ${name}: ${i.kind} on ${i.nodes.join(", ")}${merged ? `, handled by ${i.by}` : ""}`,
  }, `${name} ${i.kind} on ${i.nodes.join(", ")} — ${clock(i.detected_at)} — ${i.status}${i.resolution ? ` (${i.resolution})` : ""}${by}`));
}

async function pollIncidents(again = true) {
  const query = new URLSearchParams();
  if ($("filter-node").value) query.set("node", $("filter-node").value);
  if ($("filter-kind").value) query.set("kind", $("filter-kind").value);
  try {
    const known = status || await getJson("/v1/status").catch(() => null);
    const merged = Boolean(known && known.colocated);
    const body = await getJson(`${merged ? "/v1/colocated/incidents" : "/v1/incidents"}?${query}`);
    const list = $("incidents");
    list.replaceChildren(...body.incidents.map((i) => incidentItem(i, merged)));
    for (const missing of body.unreachable || []) {
      list.append(el("li", { class: "error", "data-unreachable": missing.controller,
        text: `The controller on ${missing.controller} did not answer; its incidents are not shown (${missing.error})` }));
    }
    if (!body.incidents.length) list.append(el("li", { class: "muted", text: "No incidents." }));
    if (openIncident !== null) await showIncident(openIncident, false);
  } catch (error) {
    $("incidents").replaceChildren(el("li", { class: "error", text: error.message }));
  }
  if (again) setTimeout(pollIncidents, INCIDENTS_EVERY_MS);
}

function chart(rows, field, label, scale, unit, detected) {
  const points = rows.map((r) => [r.t - detected, r[field] === null || r[field] === undefined ? null : scale(r[field])]).filter((p) => p[1] !== null);
  const box = el("figure", { class: "chart", "data-chart": field });
  if (points.length < 2) return null;
  const xs = points.map((p) => p[0]); const ys = points.map((p) => p[1]);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs, 0)];
  const [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x) => ((x - x0) / (x1 - x0 || 1)) * 100;
  const sy = (y) => (y1 > y0 ? 38 - ((y - y0) / (y1 - y0)) * 36 : 20);  // flat: across the middle
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 100 40");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `${label} from ${x0.toFixed(0)} s to ${x1.toFixed(0)} s of detection`);
  const line = document.createElementNS(ns, "polyline");
  line.setAttribute("class", "line");
  line.setAttribute("points", points.map(([x, y]) => `${sx(x).toFixed(2)},${sy(y).toFixed(2)}`).join(" "));
  const mark = document.createElementNS(ns, "line");
  mark.setAttribute("class", "detect");
  for (const [k, v] of [["x1", sx(0)], ["x2", sx(0)], ["y1", 0], ["y2", 40]]) mark.setAttribute(k, String(v));
  svg.append(line, mark);
  const last = ys[ys.length - 1];
  box.append(el("p", {}, el("strong", { text: label }), el("span", { text: `${y0.toFixed(1)}–${y1.toFixed(1)} ${unit}, last ${last.toFixed(1)}` })), svg,
    el("p", { class: "muted" }, el("span", { text: `${x0.toFixed(0)} s` }), el("span", { text: "detected" })));
  return box;
}

function drawCharts(evidence, detected) {
  const recorder = evidence && evidence.flight_recorder;
  const charts = $("charts");
  charts.replaceChildren();
  if (!recorder || !Array.isArray(recorder.fields) || !Array.isArray(recorder.samples) || !recorder.samples.length) {
    charts.append(el("p", { class: "muted", text: "No flight recorder samples for this incident." }));
    return;
  }
  const rows = recorder.samples.map((s) => Object.fromEntries(recorder.fields.map((f, i) => [f, s[i]])));
  for (const [field, label, scale, unit] of MEASURES) {
    const drawn = chart(rows, field, label, scale, unit, detected);
    if (drawn) charts.append(drawn);
  }
}

function pre(value) { return el("pre", { text: JSON.stringify(value, null, 2) }); }

// ``id``: this controller's incident number, or "node/number" for any controller's.
async function showIncident(id, scroll = true) {
  const [node, number] = String(id).includes("/") ? String(id).split("/", 2) : [null, String(id)];
  let body;
  try {
    body = node === null ? await getJson(`/v1/incidents/${encodeURIComponent(number)}`) :
      await getJson(`/v1/colocated/incidents/${encodeURIComponent(node)}/${encodeURIComponent(number)}`);
  } catch (error) {
    $("incident-facts").replaceChildren(el("dd", { class: "error", text: error.message }));
    return;
  }
  openIncident = id;
  const by = node === null ? null : body.by;
  if (node !== null) body = body.timeline;
  const i = body.incident;
  const section = $("incident");
  section.hidden = false;
  $("incident-title").textContent = `Incident ${by === null ? `#${i.id}` : `${by}#${i.id}`}: ${i.kind} on ${i.nodes.join(", ")}`;
  const facts = $("incident-facts");
  facts.replaceChildren();
  const add = (t, v) => facts.append(el("dt", { text: t }), el("dd", { text: v }));
  if (by !== null) add("handled by", `the controller on ${by}`);
  add("status", `${i.status}${i.resolution ? ` (${i.resolution})` : ""}${i.dry_run ? ", dry run" : ""}`);
  add("detected", clock(i.detected_at));
  add("last seen healthy", clock(i.fault_onset));
  add("time to detect", i.time_to_detect_s === null ? "–" : `${i.time_to_detect_s.toFixed(1)} s`);
  add("time to recover", i.time_to_recover_s === null ? "–" : `${i.time_to_recover_s.toFixed(1)} s`);
  drawCharts(i.evidence, Date.parse(i.detected_at) / 1000);
  $("steps").replaceChildren(...body.steps.map((s) => el("li", {}, `${clock(s.at)} ${s.node || "cluster"}: ${s.step}`,
    Object.keys(s.detail || {}).length ? el("details", {}, el("summary", { text: "detail" }), pre(s.detail)) : null)));
  $("actions").tBodies[0].replaceChildren(...body.actions.map((a) => el("tr", {},
    ...[a.id, a.node, a.operation, a.device, clock(a.requested_at), clock(a.verified_at), a.result + (a.error ? `: ${a.error}` : "")].map((v) => el("td", { text: String(v ?? "–") })))));
  $("boots").replaceChildren(...(body.boots.length ? body.boots.map((b) => el("details", {},
    el("summary", { text: `${b.node} boot ${b.boot_id.slice(0, 8)}: ${clock(b.first_entry)} to ${clock(b.last_entry)}, ${b.clean_shutdown === false ? "ended without a shutdown" : b.clean_shutdown ? "clean shutdown" : "still running or unknown"}` }),
    pre(b.evidence))) : [el("p", { class: "muted", text: "No boots linked yet." })]));
  const evidence = Object.entries(i.evidence || {}).filter(([k]) => k !== "flight_recorder");
  const restarts = body.serving_restarts.map((r) => ["serving restart " + r.id, r]);
  $("evidence").replaceChildren(...[...evidence, ...restarts].map(([k, v]) => el("details", {}, el("summary", { text: k }), pre(v))));
  if (scroll) section.scrollIntoView({ block: "start" });
}

// -- actions ---------------------------------------------------------------------

function lockActions() {
  const has = Boolean(token());
  for (const button of document.querySelectorAll("button.action")) {
    button.disabled = !has;
    if (!has) button.title = "Enter the controller's token first";
    else button.removeAttribute("title");
  }
  $("access-state").textContent = has ? "Actions on: the token is kept in this tab until it closes." :
    "Read-only: enter the controller's token to hold, release or step down.";
  $("mode").textContent = has ? "Actions on (this tab)" : "Read-only: enter the token to act";
  $("token-form").hidden = has;
  $("token-forget").hidden = !has;
}

const WHAT = {
  hold: (t) => `Hold ${t}? Nothing automatic (no power cycle, no serving restart) will touch ${t} until it is released.`,
  release: (t) => t === "*" ? "Clear the cluster hold? Automatic recovery resumes on every node not held on its own." :
    `Release ${t}? Automatic recovery of ${t} resumes: a frozen host will be power-cycled.`,
  "step-down": () => "Step down the pair's leader? It stops acting and exits; the standby takes over once its lease runs out.",
};

function ask(action, target) {
  pending = { action, target };
  $("confirm-title").textContent = action === "step-down" ? "Step down the leader" : `${action[0].toUpperCase()}${action.slice(1)} ${target === "*" ? "the cluster" : target}`;
  $("confirm-text").textContent = WHAT[action](target);
  $("confirm-reason-row").hidden = action !== "hold";
  $("confirm-reason").required = action === "hold";
  $("confirm-reason").value = "";
  $("confirm-error").textContent = "";
  $("confirm").showModal();
}

async function confirmAction(event) {
  event.preventDefault();
  if (!pending) return;
  const body = pending.action === "step-down" ? {} : { node: pending.target };
  if (pending.action === "hold") {
    const reason = $("confirm-reason").value.trim();
    if (!reason) { $("confirm-error").textContent = "Say why: the reason is shown with the hold."; return; }
    body.reason = reason;
  }
  const answer = await fetch(`/v1/actions/${pending.action}`, {
    method: "POST", cache: "no-store", credentials: "omit",
    headers: { "Content-Type": "application/json", Authorization: `Bearer ${token() || ""}` },
    body: JSON.stringify(body),
  }).catch((error) => ({ ok: false, status: 0, json: async () => ({ error: error.message }) }));
  const reply = await answer.json().catch(() => ({}));
  if (!answer.ok) {
    if (answer.status === 401) sessionStorage.removeItem(TOKEN_KEY);
    $("confirm-error").textContent = `Not done: ${reply.error || answer.status}`;
    lockActions();
    return;
  }
  $("confirm").close();
  pending = null;
}

function wire() {
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token-input").value.trim();
    $("token-input").value = "";
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    lockActions();
  });
  $("token-forget").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); lockActions(); });
  $("confirm-form").addEventListener("submit", confirmAction);
  $("confirm-cancel").addEventListener("click", () => { pending = null; $("confirm").close(); });
  $("cluster-release").addEventListener("click", () => ask("release", "*"));
  $("step-down").addEventListener("click", () => ask("step-down", ""));
  $("incident-close").addEventListener("click", () => { openIncident = null; $("incident").hidden = true; });
  $("incident-filter").addEventListener("change", () => pollIncidents(false));
  $("incident-filter").addEventListener("submit", (event) => event.preventDefault());
  document.body.addEventListener("click", (event) => {
    const button = event.target.closest("button");
    if (!button) return;
    if (button.dataset.incident) showIncident(button.dataset.incident);
    else if (button.dataset.action && !button.disabled) ask(button.dataset.action, button.dataset.target);
  });
  lockActions();
  pollStatus();
  pollIncidents();
}

document.addEventListener("DOMContentLoaded", wire);
