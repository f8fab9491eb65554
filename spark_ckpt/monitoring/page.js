// The checkpoint page: reads the server's API (/checkpoints, /checkpoints/config,
// /checkpoints/details/<id>, /charts/*.svg) and nothing else, every few seconds.
// Query parameters: refresh=<seconds> (default 3; 0: never).
"use strict";

const params = new URLSearchParams(location.search);
const EVERY_S = Number(params.get("refresh") ?? 3);
let selected = null; // the checkpoint whose subtasks are shown
let timer = null;

const $ = (id) => document.getElementById(id);

function pad(n) { return String(n).padStart(2, "0"); }
function when(ms) {
  if (ms === null || ms === undefined || ms < 0) return "—";
  const d = new Date(ms);
  return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())} UTC`;
}
function ms(v) {
  if (v === null || v === undefined) return "—";
  if (v < 1000) return `${Math.round(v)} ms`;
  if (v < 60000) return `${(v / 1000).toFixed(v < 10000 ? 2 : 1)} s`;
  return `${(v / 60000).toFixed(1)} min`;
}
function bytes(v) {
  if (v === null || v === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${i ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}
function num(v) { return v === null || v === undefined ? "—" : Number(v).toLocaleString("en"); }

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
function fill(tableId, rows, build) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren();
  for (const row of rows) {
    const tr = document.createElement("tr");
    build(tr, row);
    body.appendChild(tr);
  }
}

async function getJson(url) {
  const r = await fetch(url, { cache: "no-store" });
  const doc = await r.json();
  if (r.status === 404) return null;
  if (!r.ok) throw new Error(doc.error || `${url}: HTTP ${r.status}`);
  return doc;
}
async function getText(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.text();
}

function sizes(e) {
  if (e.checkpointed_size === undefined) return "—";
  return `${bytes(e.checkpointed_size)} / ${bytes(e.state_size)}`;
}

function renderOverview(doc) {
  const c = doc.counts;
  $("pipeline").textContent = doc.pipeline;
  $("root").textContent = doc.root;
  const state = $("state");
  state.textContent = doc.running ? "running" : "stopped";
  state.className = `badge ${doc.running ? "running" : "stopped"}`;
  const counts = [
    ["triggered", c.total], ["in progress", c.in_progress], ["completed", c.completed],
    ["of them savepoints", c.savepoints], ["failed", c.failed],
    ["of them aborted (not counted against tolerable failures)", c.aborted],
    ["restored", c.restored],
  ];
  fill("counts", counts, (tr, [k, v]) => {
    const th = document.createElement("th"); th.textContent = k; tr.appendChild(th);
    cell(tr, num(v)).dataset.count = k;
  });
  const l = doc.latest;
  const latest = [
    ["completed", l.completed], ["savepoint", l.savepoint], ["failed", l.failed],
  ];
  fill("latest", latest, (tr, [k, e]) => {
    cell(tr, k, "text");
    cell(tr, e ? e.id : "none");
    cell(tr, e ? when(e.failure_timestamp ?? e.latest_ack_timestamp) : "—");
    cell(tr, e ? ms(e.end_to_end_duration) : "—");
    cell(tr, e ? sizes(e) : "—");
    cell(tr, e && e.failure_reason ? `${e.failure_reason}: ${e.failure_message}` : "",
      e && e.failure_reason ? "reason" : "text");
  });
  const r = l.restored;
  const tr = document.createElement("tr");
  cell(tr, "restore", "text");
  cell(tr, r ? r.id : "none");
  cell(tr, r ? when(r.restore_timestamp) : "—");
  cell(tr, "—"); cell(tr, "—");
  cell(tr, r ? `run ${r.run_id.slice(0, 8)} (attempt ${r.attempt})` +
    (r.restored_from ? `, from ${r.restored_from}` : "") +
    (r.is_savepoint ? ", a savepoint" : "") : "", "text");
  $("latest").querySelector("tbody").appendChild(tr);
}

function renderHistory(doc) {
  fill("history", doc.history, (tr, e) => {
    tr.className = e.status;
    tr.dataset.id = e.id;
    if (e.id === selected) tr.classList.add("selected");
    cell(tr, e.id);
    cell(tr, e.checkpoint_type.toLowerCase().replace("_", " "), "text");
    cell(tr, e.outcome, "text");
    cell(tr, `${e.num_acknowledged_subtasks}/${e.num_subtasks ?? "?"}`);
    cell(tr, when(e.trigger_timestamp));
    cell(tr, ms(e.end_to_end_duration));
    cell(tr, sizes(e));
    cell(tr, ms(e.alignment_duration));
    cell(tr, ms(e.start_delay));
    cell(tr, num(e.in_flight_rows));
    cell(tr, num(e.keys_changed));
    tr.addEventListener("click", () => { location.hash = `checkpoint=${e.id}`; });
  });
}

function renderSummary(doc) {
  const s = doc.summary;
  const rows = [
    ["end to end duration", s.end_to_end_duration, ms],
    ["checkpointed size", s.checkpointed_size, bytes],
    ["full state size", s.state_size, bytes],
    ["in-flight data", s.persisted_data, bytes],
    ["alignment", s.alignment_duration, ms],
    ["start delay", s.start_delay, ms],
  ];
  fill("summary", rows, (tr, [name, v, f]) => {
    cell(tr, name, "text");
    for (const k of ["min", "avg", "max", "p50", "p95", "p99"]) cell(tr, f(v[k]));
  });
}

function renderFailures(doc) {
  const failed = doc.history.filter((e) => e.status === "FAILED");
  fill("failures", failed, (tr, e) => {
    tr.dataset.id = e.id;
    cell(tr, e.id);
    cell(tr, e.checkpoint_type.toLowerCase(), "text");
    cell(tr, when(e.failure_timestamp));
    cell(tr, ms(e.end_to_end_duration));
    cell(tr, `${e.failure_reason}${e.outcome === "aborted" ? " (aborted)" : ""}`, "reason");
    cell(tr, e.failure_message, "reason");
  });
}

function renderRuns(doc) {
  fill("runs", doc.runs, (tr, r) => {
    cell(tr, r.run_id.slice(0, 12), "text");
    cell(tr, r.attempt);
    cell(tr, r.state, "text");
    cell(tr, when(r.updated));
    cell(tr, r.restored_from === null ? "fresh start" : `checkpoint ${r.restored_from}`, "text");
    const skipped = r.skipped.map((s) => `skipped damaged ${s.checkpoint_id}: ${s.reason}`);
    cell(tr, [r.error || "", ...skipped].filter(Boolean).join("; "), "reason");
  });
}

function renderSources(doc) {
  fill("sources", doc.sources, (tr, s) => {
    cell(tr, s.channel);
    cell(tr, num(s.position - s.start));
    cell(tr, num(s.position));
    cell(tr, num(s.head));
    cell(tr, num(s.pending));
  });
}

function renderConfig(cfg) {
  const rows = cfg === null ? [["configuration", "no run recorded one yet"]] : [
    ["mode", `${cfg.mode} (${cfg.alignment})`],
    ["interval", cfg.interval === null ? "periodic checkpoints off" : ms(cfg.interval)],
    ["timeout", ms(cfg.timeout)],
    ["minimum pause", ms(cfg.min_pause)],
    ["max concurrent", cfg.max_concurrent],
    ["tolerable failed checkpoints", cfg.tolerable_failed_checkpoints],
    ["retained checkpoints", cfg.retained_checkpoints],
    ["statistics history", cfg.history_size],
    ["retention when cancelled", cfg.externalization.delete_on_cancellation ? "deleted" :
      (cfg.externalization.enabled ? "retained" : "not externalized")],
    ["checkpoint storage", cfg.checkpoint_storage],
    ["savepoint directory", cfg.savepoint_dir ?? "<root>/savepoints"],
    ["restart strategy", JSON.stringify(cfg.restart_strategy)],
  ];
  fill("config", rows, (tr, [k, v]) => {
    const th = document.createElement("th"); th.textContent = k; tr.appendChild(th);
    cell(tr, String(v), "text");
  });
}

async function renderDetails(doc) {
  const fromHash = /checkpoint=(\d+)/.exec(location.hash);
  if (fromHash) selected = Number(fromHash[1]);
  if (selected === null) {
    const done = doc.history.find((e) => e.status === "COMPLETED");
    if (!done) return;
    selected = done.id;
  }
  const d = await getJson(`/checkpoints/details/${selected}`);
  if (d === null) {
    $("details-id").textContent = selected;
    $("details-head").textContent = "not in the statistics history (still in progress?)";
    fill("subtasks", [], () => {});
    fill("stages", [], () => {});
    return;
  }
  $("details-id").textContent = `${d.id} (${d.outcome})`;
  $("details-head").textContent =
    `${d.checkpoint_type.toLowerCase()} triggered ${when(d.trigger_timestamp)}, ` +
    `${d.num_acknowledged_subtasks}/${d.num_subtasks ?? "?"} subtasks acknowledged, ` +
    `end to end ${ms(d.end_to_end_duration)}` +
    (d.failure_reason ? `; failed: ${d.failure_reason}: ${d.failure_message}` : "");
  // a job of several keyed stages: one row per stage (Flink's per-vertex summary)
  const stages = (d.stages || []).length > 1 ? d.stages : [];
  $("stages").hidden = stages.length === 0;
  fill("stages", stages, (tr, g) => {
    tr.dataset.stage = g.stage;
    cell(tr, g.stage, "text");
    cell(tr, g.vertex, "text");
    cell(tr, num(g.subtasks));
    cell(tr, bytes(g.state_bytes));
    cell(tr, bytes(g.checkpointed_size));
    cell(tr, ms(g.alignment));
    cell(tr, ms(g.sync));
    cell(tr, ms(g.async));
  });
  fill("subtasks", d.subtasks, (tr, s) => {
    tr.dataset.subtask = s.subtask;
    cell(tr, s.subtask, "text");
    cell(tr, ms(s.checkpoint.sync));
    cell(tr, ms(s.checkpoint.async));
    cell(tr, ms(s.alignment.duration));
    cell(tr, ms(s.start_delay));
    cell(tr, bytes(s.state_size));
    cell(tr, bytes(s.checkpointed_size));
    cell(tr, num(s.keys_changed));
    cell(tr, num(s.in_flight_rows));
    cell(tr, s.cache ? `${s.cache.hits} in place, ${s.cache.rebuilds} rebuilt` : "in the driver",
      "text");
    const b = s.state_backend;
    cell(tr, b ? b.backend : "", "text");
    cell(tr, b ? bytes(b.memory_bytes) : "");
    cell(tr, b ? bytes(b.disk_bytes) : "");
    cell(tr, b && b.cache_hit_rate !== null ? `${(100 * b.cache_hit_rate).toFixed(1)}%` : "");
  });
}

async function refresh() {
  try {
    const [doc, cfg, duration, size] = await Promise.all([
      getJson("/checkpoints"), getJson("/checkpoints/config"),
      getText("/charts/duration.svg"), getText("/charts/size.svg"),
    ]);
    renderOverview(doc);
    renderHistory(doc);
    renderSummary(doc);
    renderFailures(doc);
    renderRuns(doc);
    renderSources(doc);
    renderConfig(cfg);
    $("chart-duration").innerHTML = duration;
    $("chart-size").innerHTML = size;
    await renderDetails(doc);
    $("error").hidden = true;
    $("refreshed").textContent = when(Date.now());
    document.body.dataset.loaded = String(Number(document.body.dataset.loaded || 0) + 1);
  } catch (e) {
    $("error").textContent = String(e.message || e);
    $("error").hidden = false;
  }
}

function schedule() {
  if (timer !== null) clearInterval(timer);
  timer = null;
  if (EVERY_S > 0 && $("auto").checked) timer = setInterval(refresh, EVERY_S * 1000);
}

$("every").textContent = EVERY_S > 0 ? EVERY_S : "—";
$("auto").addEventListener("change", schedule);
window.addEventListener("hashchange", () => { selected = null; refresh(); });
refresh();
schedule();
