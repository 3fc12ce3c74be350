// The twinflow console's page: polls the console's JSON API and draws what it answers.
// Plain JavaScript, no library and no build step: the console is served by twinflow itself,
// on machines that may have no internet. Every value from the server is written as text
// (textContent), never as HTML.
"use strict";

const POLL_MS = 1000;          // the snapshot
const FAILURES_MS = 5000;      // the failed messages' list
const DRILLS_MS = 30000;       // the drill reports
const SVG = "http://www.w3.org/2000/svg";

const state = {shape: null, who: null, selected: new Set(), failures: [], pending: null};

// ---- talking to the console -------------------------------------------------------------
function credentials() {
  return {name: sessionStorage.getItem("tf-name") || "", token: sessionStorage.getItem("tf-token") || ""};
}

async function api(path, options = {}) {
  const {name, token} = credentials();
  const headers = {"X-Twinflow-Operator": name};
  if (token) headers["Authorization"] = "Bearer " + token;
  if (options.method === "POST") {
    headers["X-Twinflow-Console"] = "1";   // an action: see access.py
    headers["Content-Type"] = "application/json";
  }
  const reply = await fetch("/console/api/" + path, {...options, headers, cache: "no-store"});
  let body = {};
  try { body = await reply.json(); } catch (e) { body = {error: "not JSON (" + reply.status + ")"}; }
  return {status: reply.status, body};
}

// ---- small helpers ---------------------------------------------------------------------------
const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.setAttribute("class", v);
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function fmtCount(n) { return n === undefined || n === null ? "-" : Number(n).toLocaleString("en-US"); }
function fmtRate(r) { return r === undefined || r === null ? "-" : Number(r).toFixed(r < 10 ? 1 : 0); }
function fmtSeconds(s) {
  if (s === undefined || s === null || s === "" || isNaN(Number(s))) return "-";
  s = Number(s);
  return s < 1 ? (s * 1000).toFixed(0) + " ms" : s < 120 ? s.toFixed(2) + " s" : (s / 60).toFixed(1) + " min";
}
function fmtTime(t) {
  if (!t) return "-";
  const d = new Date(Number(t) * 1000);
  if (isNaN(d.getTime())) return String(t);   // not a time: shown as the text it is
  return d.toISOString().replace("T", " ").slice(0, 23) + "Z";
}
function ago(t, now) { return t ? fmtSeconds(Math.max(0, now - Number(t))) + " ago" : "-"; }

function toast(text, ok) {
  const box = $("#action-result");
  box.textContent = text;
  box.className = "toast " + (ok ? "ok" : "bad");
  box.hidden = false;
}

function confirmAction(text) {
  return new Promise((resolve) => {
    $("#confirm-text").textContent = text;
    $("#confirm").hidden = false;
    const done = (answer) => { $("#confirm").hidden = true; resolve(answer); };
    $("#confirm-yes").onclick = () => done(true);
    $("#confirm-no").onclick = () => done(false);
  });
}

// ---- who is looking ---------------------------------------------------------------------------
async function whoami() {
  const {body} = await api("whoami");
  state.who = body;
  $("#flow-name").textContent = body.flow || "";
  document.title = "twinflow " + (body.flow || "") + " console";
  if (!body.may_look) {
    $("#sign-in").hidden = false;
    $("#panels").hidden = true;
    $("#sign-in-reason").textContent = credentials().token ? body.reason : "";
    $("#who").textContent = "";
    $("#sign-out").hidden = true;
    return false;
  }
  $("#sign-in").hidden = true;
  $("#panels").hidden = false;
  $("#who").textContent = body.who + (body.may_act ? ": may act" : ": read only");
  $("#sign-out").hidden = body.open;
  for (const b of document.querySelectorAll(".act")) b.hidden = !body.may_act;
  $("#handover").hidden = !(body.may_act && body.handover);
  return true;
}

// ---- the flow graph ---------------------------------------------------------------------------
function layout(shape) {
  // Columns by distance from the input along the links; a sort that pairs with an action goes
  // under it; a node nothing reaches goes in the last column.
  const depth = {[shape.input]: 0};
  const queue = [shape.input];
  while (queue.length) {
    const name = queue.shift();
    for (const link of shape.links.filter((l) => l.from === name)) {
      if (!(link.to in depth)) { depth[link.to] = depth[name] + 1; queue.push(link.to); }
    }
  }
  for (const n of shape.nodes) {
    if (!(n.name in depth) && n.pairs_with in depth) depth[n.name] = depth[n.pairs_with];
  }
  const last = Math.max(0, ...Object.values(depth)) + 1;
  for (const n of shape.nodes) if (!(n.name in depth)) depth[n.name] = last;
  const linked = new Set(shape.links.map((l) => l.from + "." + l.outlink));
  const columns = {};
  const boxes = {};
  const W = 190, GAP_X = 150, H = 58, LINE = 16, GAP_Y = 28;
  for (const n of shape.nodes) (columns[depth[n.name]] = columns[depth[n.name]] || []).push(n);
  let height = 0;
  for (const [col, nodes] of Object.entries(columns)) {
    let y = 10;
    for (const n of nodes) {
      const exits = n.outlinks.filter((o) => !linked.has(n.name + "." + o));
      boxes[n.name] = {x: 10 + col * (W + GAP_X), y, w: W, h: H, exits, node: n};
      y += H + exits.length * LINE + GAP_Y;
    }
    height = Math.max(height, y);
  }
  const width = 10 + (Math.max(...Object.keys(columns).map(Number)) + 1) * (W + GAP_X);
  return {boxes, width, height, LINE};
}

function drawGraph(shape) {
  const {boxes, width, height, LINE} = layout(shape);
  const svg = el("svg:svg", {width, height, viewBox: `0 0 ${width} ${height}`, id: "graph-svg"});
  const defs = el("svg:defs", {}, el("svg:marker", {id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse"}, el("svg:path", {d: "M 0 0 L 10 5 L 0 10 z"})));
  svg.append(defs);
  for (const link of shape.links) {
    const a = boxes[link.from], b = boxes[link.to];
    const x1 = a.x + a.w, y1 = a.y + a.h / 2, x2 = b.x, y2 = b.y + b.h / 2;
    svg.append(el("svg:path", {d: `M ${x1} ${y1} C ${x1 + 50} ${y1}, ${x2 - 50} ${y2}, ${x2} ${y2}`,
      class: "link", "marker-end": "url(#arrow)"}));
    const label = el("svg:text", {x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 6, class: "link-label",
      "data-link": link.from + "." + link.outlink, "text-anchor": "middle"});
    label.append(el("svg:tspan", {class: "outlink-name"}, link.outlink + " "));
    label.append(el("svg:tspan", {class: "count"}, ""));
    label.append(el("svg:tspan", {class: "rate"}, ""));
    svg.append(label);
  }
  for (const n of shape.nodes.filter((n) => n.pairs_with && boxes[n.pairs_with])) {
    // The claim pair: the master escalates what its action processed to the worker's sort.
    const a = boxes[n.pairs_with], b = boxes[n.name], x = a.x + a.w - 24;
    svg.append(el("svg:path", {d: `M ${x} ${a.y + a.h} L ${x} ${b.y}`, class: "claim", "marker-end": "url(#arrow)"}));
    svg.append(el("svg:text", {x: x + 6, y: (a.y + a.h + b.y) / 2, class: "link-label"}, "claims"));
  }
  for (const [name, box] of Object.entries(boxes)) {
    const g = el("svg:g", {class: "node kind-" + box.node.kind, "data-node": name});
    g.append(el("svg:rect", {x: box.x, y: box.y, width: box.w, height: box.h, rx: 6}));
    g.append(el("svg:text", {x: box.x + 8, y: box.y + 18, class: "node-name"}, name));
    g.append(el("svg:text", {x: box.x + box.w - 8, y: box.y + 18, class: "node-kind"},
      box.node.kind + (box.node.pairs_with ? " of " + box.node.pairs_with : "")));
    g.append(el("svg:text", {x: box.x + 8, y: box.y + 40, class: "node-held", "data-held": name}, "holds -"));
    box.exits.forEach((outlink, i) => {
      const y = box.y + box.h + 12 + i * LINE;
      g.append(el("svg:path", {d: `M ${box.x + 14} ${box.y + box.h} L ${box.x + 14} ${y - 4} L ${box.x + 28} ${y - 4}`,
        class: "exit", "marker-end": "url(#arrow)"}));
      const label = el("svg:text", {x: box.x + 32, y, class: "exit-label", "data-outlink": name + "." + outlink});
      label.append(el("svg:tspan", {class: "outlink-name"}, outlink + " "));
      label.append(el("svg:tspan", {class: "count"}, "-"));
      label.append(el("svg:tspan", {class: "rate"}, ""));
      g.append(label);
    });
    svg.append(g);
  }
  $("#graph").replaceChildren(svg);
}

function heldText(node, entry) {
  if (!entry) return "holds -";
  const parts = [];
  for (const [k, v] of Object.entries(entry)) if (k !== "kind" && typeof v !== "object") parts.push(k + " " + fmtCount(v));
  return parts.join(", ") || "holds 0";
}

function updateGraph(snap) {
  for (const [name, o] of Object.entries(snap.outlinks || {})) {
    const label = document.querySelector(`[data-outlink="${CSS.escape(name)}"]`);
    if (!label) continue;
    label.querySelector(".count").textContent = fmtCount(o.count);
    label.querySelector(".rate").textContent = "  " + fmtRate(o.rate) + "/s";
  }
  for (const [name, o] of Object.entries(snap.links || {})) {
    const label = document.querySelector(`[data-link="${CSS.escape(name)}"]`);
    if (!label) continue;
    label.querySelector(".count").textContent = fmtCount(o.count);
    label.querySelector(".rate").textContent = "  " + fmtRate(o.rate) + "/s";
  }
  const master = (snap.peers || []).find((p) => p.role === "master" && !p.silent);
  const worker = (snap.peers || []).find((p) => p.role === "worker" && !p.silent);
  const held = (master && master.pending_nodes) || {};
  for (const n of state.shape.nodes) {
    const text = document.querySelector(`[data-held="${CSS.escape(n.name)}"]`);
    if (!text) continue;
    if (n.pairs_with) {
      // The claim pair's sort runs on the worker: what it bakes and holds overdue, per ruleset in the tooltip.
      const sort = ((worker && worker.pending_nodes) || {})[n.name];
      const rules = Object.entries((sort && sort.rulesets) || {})
        .map(([r, c]) => `${r}: baking ${fmtCount(c.baking)}, overdue ${fmtCount(c.overdue)}`).join("\n");
      text.textContent = sort ? `baking ${fmtCount(sort.baking)}, overdue ${fmtCount(sort.overdue)}` : "no worker";
      text.replaceChildren(text.textContent, el("svg:title", {}, rules || "no ruleset holds anything"));
    } else {
      text.textContent = heldText(n.name, held[n.name]);
    }
  }
}

// ---- the peers, the timeline, the events ----------------------------------------------------
function updatePeers(snap) {
  const body = $("#peers tbody");
  const rows = (snap.peers || []).slice().sort((a, b) => (a.peer_id + a.shard).localeCompare(b.peer_id + b.shard));
  body.replaceChildren(...rows.map((p) => {
    const suspended = p.suspended && typeof p.suspended === "object" ? Object.keys(p.suspended).join(", ")
      : typeof p.suspended === "string" && p.suspended.startsWith("{") ? "malformed" : "";
    const batch = p.last_batch_at ? `${ago(p.last_batch_at, snap.at)}, ${fmtCount(p.last_batch_size)} msgs in ` +
      fmtSeconds(p.last_batch_s) : "-";
    const claims = p.role === "worker" ? `baking ${fmtCount(p.baked)}, claimed ${fmtCount(p.claimed)}` : "-";
    const role = el("span", {class: "role badge " + p.role}, p.role);
    const silent = p.silent ? el("span", {class: "badge silent", title: "its status was last written " +
      fmtSeconds(p.age_s) + " ago"}, "silent " + fmtSeconds(p.age_s)) : "";
    const malformed = Array.isArray(p.malformed) && p.malformed.length ? el("span", {class: "badge malformed",
      title: "not as a peer writes it; not counted"}, "malformed " + p.malformed.join(", ")) : "";
    return el("tr", {"data-peer": p.peer_id, "data-shard": p.shard, class: "role-" + p.role + (p.silent ? " silent" : "")},
      el("td", {class: "peer"}, p.peer_id + (snap.shards > 1 ? " / " + p.shard : "")),
      el("td", {}, role, " ", silent, " ", malformed),
      el("td", {class: "epoch"}, p.epoch || "-"),
      el("td", {}, p.grpc_address || "-"),
      el("td", {class: "lag"}, `${fmtCount(p.uplink_lag)} / ${fmtSeconds(p.uplink_lag_s)}`),
      el("td", {class: "batch"}, batch),
      el("td", {}, fmtCount(p.pending)),
      el("td", {}, claims),
      el("td", {class: suspended ? "bad" : ""}, suspended || "no"),
      el("td", {}, p.version || "-"));
  }));
  const master = rows.filter((p) => p.role === "master" && !p.silent).map((p) => p.peer_id);
  $("#master").textContent = master.length ? [...new Set(master)].join(", ") : "none";
}

function updateFailovers(snap) {
  const box = $("#failovers");
  if (!(snap.failovers || []).length) return;
  box.replaceChildren(...snap.failovers.map((f) => {
    const known = f.phases.filter((p) => p.s !== null && p.s !== undefined);
    const total = known.reduce((a, p) => a + p.s, 0) || 1;
    const bar = el("div", {class: "bar"}, ...known.map((p) => {
      const part = el("span", {class: "part phase-" + p.phase, title: p.phase + " " + fmtSeconds(p.s)});
      part.style.width = Math.max(1, 100 * p.s / total) + "%";
      return part;
    }));
    const list = el("table", {class: "phases"}, el("tbody", {}, ...f.phases.map((p) => el("tr",
      {class: "phase", "data-phase": p.phase, "data-at": p.at === null ? "" : p.at},
      el("td", {}, el("span", {class: "swatch phase-" + p.phase}),
        el("span", {class: "phase-name"}, p.phase.replace("_", " "))),
      el("td", {class: "phase-s"}, p.s === null ? (p.at === null ? "not recorded" : "") : "+" + fmtSeconds(p.s)),
      el("td", {class: "muted"}, p.at ? fmtTime(p.at).slice(11) : "")))));
    return el("div", {class: "failover", "data-epoch": f.epoch, "data-peer": f.peer, "data-cause": f.cause},
      el("h3", {}, `epoch ${f.epoch}: ${f.peer} promoted (${f.cause}` + (f.old_master ? ` from ${f.old_master}` : "") +
        `), ${fmtTime(f.at)}`,
        el("span", {class: "muted"}, `  ${fmtSeconds(f.total_s)} in all, ${fmtCount(f.rolled_back)} rolled back`)),
      bar, list);
  }));
}

function updateEvents(snap) {
  $("#events tbody").replaceChildren(...(snap.events || []).map((e) => {
    const detail = Object.entries(e).filter(([k]) => !["id", "event", "peer", "epoch", "at", "flow"].includes(k))
      .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v)
        : k.endsWith("_at") && Number(v) > 0 ? fmtTime(v).slice(11) : v)).join(" ");
    return el("tr", {"data-event": e.event}, el("td", {}, fmtTime(e.at)), el("td", {}, e.event),
      el("td", {}, e.peer || "-"), el("td", {}, e.epoch || "-"), el("td", {class: "detail"}, detail));
  }));
}

function panel(selector, problem, draw, part = "snapshot") {
  // Draw one part of a panel; a problem the console reported, or one drawing met, is shown in the
  // panel (a note per part: the snapshot's, the failures list's, the drills').
  const box = document.querySelector(selector);
  let note = box.querySelector(`:scope > .problem[data-part="${part}"]`);
  let text = problem ? "Part of this panel could not be read: " + problem : "";
  try { draw(); } catch (e) { text = "This panel could not be drawn: " + e; }
  if (!text) { if (note) note.remove(); return; }
  if (!note) { note = el("p", {class: "problem bad", "data-part": part}); box.querySelector("h2").after(note); }
  note.textContent = text;
}

function updateSuspensions(snap) {
  // The flow's suspensions as Redis holds them; one that is not a record twinflow wrote says so.
  const items = Object.entries(snap.suspended || {}).map(([node, s]) => el("li", {"data-node": node},
    s && s.malformed !== undefined ? el("span", {class: "bad"}, `${node}: malformed (${s.malformed})`)
      : `${node}: ${(s && s.reason) || "suspended"} since ${fmtTime(s && s.since)}` + (s && s.until ? `, until ${fmtTime(s.until)}` : "")));
  $("#suspensions").replaceChildren(...(items.length ? [el("b", {}, "Suspended: "), el("ul", {}, ...items)] : []));
}

async function poll() {
  try {
    const {status, body} = await api("snapshot");
    if (status === 401 || status === 403) { await whoami(); return; }
    const snap = body;
    $("#epoch").textContent = snap.epoch || "-";
    $("#uplink-count").textContent = fmtCount((snap.uplink || {}).count);
    $("#uplink-rate").textContent = fmtRate((snap.uplink || {}).rate);
    const redis = $("#redis-state");
    redis.textContent = snap.redis === "ok" ? "Redis ok" : snap.redis;
    redis.className = "state " + (snap.redis === "ok" ? "ok" : "bad");
    $("#updated").textContent = "updated " + fmtTime(snap.at);
    if (snap.redis !== "ok") return;   // keep what was drawn
    // Each panel on its own: a value it cannot draw spoils that panel (which says so), not the page.
    const problems = snap.problems || {};
    panel("#flow-panel", problems.counts, () => updateGraph(snap));
    panel("#peers-panel", problems.peers || problems.suspended, () => { updatePeers(snap); updateSuspensions(snap); });
    panel("#failovers-panel", problems.failovers, () => updateFailovers(snap));
    panel("#events-panel", problems.events, () => updateEvents(snap));
    panel("#failures-panel", problems.failures, () => {
      const c = snap.failures || {};
      $("#failure-counts").textContent = `${fmtCount(c.failed)} failed of ${fmtCount(c.entries)} audited`;
    });
  } catch (e) {
    const redis = $("#redis-state");
    redis.textContent = "console not answering";
    redis.className = "state bad";
  }
}

// ---- failed messages --------------------------------------------------------------------------
async function loadFailures() {
  const q = new URLSearchParams({status: $("#f-status").value, node: $("#f-node").value,
    reason: $("#f-reason").value, id: $("#f-id").value});
  const {status, body} = await api("failures?" + q.toString());
  if (status !== 200) {
    panel("#failures-panel", body.error || String(status), () => {}, "list");
    return;
  }
  panel("#failures-panel", null, () => drawFailures(body), "list");
}

function drawFailures(body) {
  state.failures = body.entries;
  const shown = new Set(body.entries.map((e) => e.audit_id));
  for (const ref of [...state.selected]) if (!shown.has(ref)) state.selected.delete(ref);
  $("#failures tbody").replaceChildren(...body.entries.map((e) => {
    const box = el("input", {type: "checkbox", class: "pick", "data-ref": e.audit_id});
    box.checked = state.selected.has(e.audit_id);
    box.disabled = e.status !== "FAILED";
    box.onchange = () => { box.checked ? state.selected.add(e.audit_id) : state.selected.delete(e.audit_id); pickChanged(); };
    const ref = el("a", {href: "#", class: "ref"}, e.audit_id);
    ref.onclick = (ev) => { ev.preventDefault(); showFailure(e.audit_id); };
    return el("tr", {"data-ref": e.audit_id, "data-status": e.status, "data-id": e.id || e.message_id || ""},
      el("td", {}, box), el("td", {}, ref), el("td", {class: "status"}, e.status), el("td", {}, fmtTime(e.at)),
      el("td", {}, e.node || "-"), el("td", {}, e.outlink || "-"), el("td", {}, e.id || e.message_id || "-"),
      el("td", {class: "reason"}, e.reason || ""));
  }));
  pickChanged();
}

function pickChanged() {
  const n = state.selected.size;
  $("#resubmit").disabled = n === 0;
  $("#resubmit").textContent = n ? `Resubmit ${n} selected` : "Resubmit selected";
}

async function showFailure(ref) {
  const {status, body} = await api("failures/" + encodeURIComponent(ref));
  $("#failure-shown").hidden = false;
  $("#shown-ref").textContent = ref;
  $("#shown-body").textContent = status === 200 ? JSON.stringify(body, null, 2) : body.error;
}

async function resubmitSelected() {
  const refs = [...state.selected];
  if (!refs.length) return;
  const sure = await confirmAction(`Resubmit ${refs.length} failed message${refs.length > 1 ? "s" : ""}? ` +
    "Each runs exactly once more, from the node it failed at.");
  if (!sure) return;
  const {status, body} = await api("resubmit", {method: "POST", body: JSON.stringify({refs})});
  if (status !== 200) { toast("Resubmit refused: " + body.error, false); return; }
  const done = body.results.filter((r) => r.ok).length;
  const refused = body.results.filter((r) => !r.ok).map((r) => `${r.audit_id}: ${r.reason}`);
  toast(`${done} resubmitted` + (refused.length ? `; refused: ${refused.join("; ")}` : ""), !refused.length);
  state.selected.clear();
  loadFailures();
}

async function handover() {
  const sure = await confirmAction("Ask the master to hand its role over to a worker?");
  if (!sure) return;
  const {status, body} = await api("handover", {method: "POST", body: "{}"});
  if (status !== 200) { toast("Handover refused: " + body.error, false); return; }
  const ok = body.results.length && body.results.every((r) => r.ok);
  toast(body.results.length ? body.results.map((r) => ok ? `handed over to ${r.new_master} in ${fmtSeconds(r.seconds)}`
    : `${r.address}: ${r.reason}`).join("; ") : "no live master", ok);
}

// ---- drill reports ------------------------------------------------------------------------------
async function loadDrills() {
  const {status, body} = await api("drills");
  if (status !== 200 || !body.length) return;
  panel("#drills-panel", null, () => drawDrills(body), "drills");
}

function drawDrills(body) {
  $("#drills").replaceChildren(...body.map((f) => el("div", {class: "report", "data-file": f.file},
    el("h3", {}, f.file, el("span", {class: "muted"}, "  " + fmtTime(f.modified))),
    el("table", {}, el("thead", {}, el("tr", {}, ...["drill", "seed", "messages", "lost", "duplicated",
      "out of order", "recovery", "passed"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...f.runs.map((r) => el("tr", {class: r.passed ? "" : "bad"},
        el("td", {}, r.drill), el("td", {}, r.seed ?? "-"), el("td", {}, fmtCount(r.messages)),
        el("td", {}, r.lost ?? "-"), el("td", {}, r.duplicated ?? "-"), el("td", {}, r.out_of_order ?? "-"),
        el("td", {}, fmtSeconds(r.rto_s)), el("td", {}, r.passed ? "passed" : "FAILED"))))))));
}

// ---- start ----------------------------------------------------------------------------------------
async function start() {
  if (!(await whoami())) return;
  if (!state.shape) {
    const {body} = await api("flow");
    state.shape = body;
    drawGraph(body);
  }
  poll();
  loadFailures();
  loadDrills();
  if (!state.timers) {
    state.timers = [setInterval(poll, POLL_MS), setInterval(loadFailures, FAILURES_MS), setInterval(loadDrills, DRILLS_MS)];
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("#sign-in-form").onsubmit = (ev) => {
    ev.preventDefault();
    sessionStorage.setItem("tf-name", $("#sign-in-name").value.trim());
    sessionStorage.setItem("tf-token", $("#sign-in-token").value.trim());
    start();
  };
  $("#sign-out").onclick = () => { sessionStorage.clear(); location.reload(); };
  $("#failure-filter").onsubmit = (ev) => { ev.preventDefault(); loadFailures(); };
  $("#resubmit").onclick = resubmitSelected;
  $("#handover").onclick = handover;
  $("#shown-close").onclick = () => { $("#failure-shown").hidden = true; };
  $("#select-all").onchange = (ev) => {
    for (const box of document.querySelectorAll(".pick:not(:disabled)")) {
      box.checked = ev.target.checked;
      box.checked ? state.selected.add(box.dataset.ref) : state.selected.delete(box.dataset.ref);
    }
    pickChanged();
  };
  start();
});
