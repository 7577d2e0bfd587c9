// shardctl dashboard: reads /api/ every second and draws the current view. Every text that comes
// from the server goes into the page as text (textContent), never as HTML.
"use strict";

const REFRESH_MS = 1000;
const COLORS = { d: "#2f9e44", p: "#ced4da", r: "#1c7ed6", y: "#f08c00", f: "#e03131", c: "#495057" };
const CELL_NAMES = { d: "done", p: "pending", r: "running", y: "retrying", f: "failed", c: "not run (cancelled)" };

let info = { read_only: true, queue: "" };
let view = null;
let busy = false;
// the queue shown: `?queue=NAME` in the address (another queue of the same Redis, read-only),
// else the coordinator's own
const shownQueue = new URLSearchParams(location.search).get("queue") || "";

// ---- helpers ------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function token() { return sessionStorage.getItem("shardctl-token") || ""; }
function ownQueue() { return shownQueue === "" || shownQueue === info.queue; }
function canAct() { return !info.read_only && token() !== "" && ownQueue(); }

// `path` of the queue shown (the API's `queue` parameter when it is not the coordinator's own)
function ofQueue(path) {
  // (the list of every queue is the same from any of them)
  if (ownQueue() || path === "queues") return path;
  return path + (path.includes("?") ? "&" : "?") + "queue=" + encodeURIComponent(shownQueue);
}

async function api(path) {
  const r = await fetch("/api/" + ofQueue(path), { headers: { Accept: "application/json" }, cache: "no-store" });
  const body = await r.json().catch(() => ({ error: "not JSON" }));
  if (!r.ok) throw new Error(body.error || ("HTTP " + r.status));
  return body;
}

async function act(path, what) {
  // (the queue shown, so that the server refuses an action on a queue it does not maintain)
  const r = await fetch("/api/" + ofQueue(path), { method: "POST", headers: { Authorization: "Bearer " + token() } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) { flash(what + " refused: " + (body.error || ("HTTP " + r.status)), true); return; }
  flash(what + ": done", false);
  refreshSoon();
}

function flash(text, error) {
  const f = document.getElementById("flash");
  f.textContent = text;
  f.className = error ? "error" : "";
  f.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.hidden = true; }, 6000);
}

function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return s.toFixed(0) + "s ago";
  if (s < 3600) return (s / 60).toFixed(0) + "m ago";
  if (s < 86400) return (s / 3600).toFixed(1) + "h ago";
  return (s / 86400).toFixed(1) + "d ago";
}

function span(s) {
  if (!isFinite(s)) return "?";
  if (s < 60) return s.toFixed(1) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
  return Math.floor(s / 86400) + "d" + (s % 86400 >= 3600 ? Math.floor((s % 86400) / 3600) + "h" : "");
}

// every time on the page: one zone, a 24-hour clock; UTC unless the viewer asked for the
// browser's own zone (kept in localStorage)
function localZone() { return localStorage.getItem("shardctl-zone") === "local"; }
function pad(n) { return String(n).padStart(2, "0"); }
function zoneName(d) {
  if (!localZone()) return "UTC";
  const off = -d.getTimezoneOffset();
  return "UTC" + (off >= 0 ? "+" : "-") + pad(Math.floor(Math.abs(off) / 60)) + ":" + pad(Math.abs(off) % 60);
}
function parts(d) {
  return localZone() ? [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(), d.getMinutes(), d.getSeconds()]
    : [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate(), d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()];
}
function when(ms) {
  if (!ms) return "-";
  const d = new Date(ms), p = parts(d);
  return p[0] + "-" + pad(p[1]) + "-" + pad(p[2]) + " " + pad(p[3]) + ":" + pad(p[4]) + ":" + pad(p[5]) + " " + zoneName(d);
}
function clock(ms) {
  const d = new Date(ms), p = parts(d);
  return pad(p[3]) + ":" + pad(p[4]) + ":" + pad(p[5]) + " " + zoneName(d);
}

function stateBadge(s) { return el("span", { class: "state " + s, text: s }); }

function rateEta(t) {
  const ended = t.done + t.failed;
  const since = t.retried_ms || t.created_ms;
  const end = t.finished_ms || Date.now();
  const secs = Math.max(0.001, (end - since) / 1000);
  if (["completed", "failed", "cancelled"].includes(t.state)) return { rate: "", eta: "took " + span(secs) };
  if (t.retried_ms) return { rate: "", eta: "retried " + span(secs) + " ago" };
  const perSec = ended / secs;
  return { rate: rate(perSec), eta: perSec > 0 ? "eta " + span((t.total - ended) / perSec) : "eta ?" };
}

function taskLink(id) { return el("a", { href: "#/task/" + encodeURIComponent(id), text: id }); }

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
    el("tbody", {}, rows));
}

// ---- views --------------------------------------------------------------------------------

// Each view builds its skeleton once (buttons stay the same elements between refreshes) and
// fills its data sections at every refresh.

function queueView() {
  const counts = el("div", { class: "cards" });
  const controls = el("div", { class: "actions" });
  const pause = el("button", { id: "pause", onclick: () => act("queue/pause", "pause") }, "Pause queue");
  const resume = el("button", { id: "resume", onclick: () => act("queue/resume", "resume") }, "Resume queue");
  if (canAct()) controls.append(pause, resume);
  const executors = el("div");
  const tasks = el("div");
  const recent = el("div", { id: "recent" });
  const root = el("section", {}, el("h2", { text: "Queue" }), counts, controls,
    el("h2", { text: "Unfinished tasks" }), tasks,
    el("h2", { text: "Recently finished" }), recent,
    el("h2", { text: "Executors" }), executors);
  return {
    root,
    async refresh() {
      const [q, page, ended] = await Promise.all([api("queue"), api("tasks?state=unfinished&limit=20"),
        api("tasks?state=finished&limit=" + RECENT)]);
      const card = (n, label) => el("div", { class: "card" }, el("div", { class: "n", text: n }), label);
      counts.replaceChildren(
        card(q.waiting, "waiting"), card(q.active, "active"), card(q.delayed, "delayed"),
        card(q.paused ? "paused" : "running", "claims"),
        card(q.limit ? q.limit.max + " / " + span(q.limit.per_ms / 1000) : "none", "rate limit"),
        card(q.tasks.unfinished, "unfinished tasks"), card(q.tasks.finished, "finished tasks"),
        card(q.executors.length, "live executors"), card(q.coordinators.length, "coordinators"));
      pause.hidden = q.paused;
      resume.hidden = !q.paused;
      tasks.replaceChildren(page.tasks.length ? taskTable(page.tasks) : el("p", { class: "muted", text: "No unfinished task." }));
      recent.replaceChildren(ended.tasks.length ? finishedTable(ended.tasks)
        : el("p", { class: "muted", text: "No finished task." }));
      executors.replaceChildren(q.executors.length ? table(
        ["node", "host", "pid", "concurrency", "shards held", "routed waiting", "done", "failed", "throughput", "up for", "heartbeat"],
        q.executors.map((n) => el("tr", { "data-node": n.node },
          el("td", { text: n.node }), el("td", { text: n.host }), el("td", { class: "num", text: n.pid ?? "?" }),
          el("td", { class: "num", text: n.concurrency ?? "?" }), el("td", { class: "num", text: n.active }),
          el("td", { class: "num", text: n.waiting }), el("td", { class: "num", text: n.done }),
          el("td", { class: "num", text: n.failed }),
          el("td", { class: "num", text: perSecond(n.done + n.failed, n.up_ms) }), el("td", { text: span(n.up_ms / 1000) }),
          el("td", { text: (n.heartbeat_age_ms / 1000).toFixed(1) + "s ago" }))))
        : el("p", { class: "muted", text: "No live executor: nothing runs shards of this queue." }));
    },
  };
}

// the finished tasks the front page lists (the last to end), failed ones first
const RECENT = 10;

// why a finished task failed, in one line (empty for one that did not fail)
function failureSummary(t) {
  if (t.state !== "failed") return "";
  if (t.halted) return t.halted;
  if (t.aggregation_error !== null && t.aggregation_error !== undefined) {
    return "aggregation failed: " + t.aggregation_error.split("\n")[0];
  }
  const first = t.first_failure ? ": first, shard " + t.first_failure : "";
  return t.failed + " of " + t.total + " shards failed" + first;
}

function outcome(t) {
  const cancelled = t.cancelled ? ", " + t.cancelled + " cancelled" : "";
  if (t.state === "cancelled") return t.done + " of " + t.total + " done before the cancel";
  return t.done + " of " + t.total + " done" + (t.failed ? ", " + t.failed + " failed" : "") + cancelled;
}

function finishedTable(tasks) {
  const failedFirst = [...tasks].sort((a, b) => (b.state === "failed") - (a.state === "failed"));
  return table(["task", "kind", "outcome", "shards", "ended", "took", "why it failed"],
    failedFirst.map((t) => el("tr", { "data-state": t.state },
      el("td", {}, taskLink(t.task_id)), el("td", { text: t.kind }), el("td", {}, stateBadge(t.state)),
      el("td", { text: outcome(t) }), el("td", { text: when(t.finished_ms) }),
      el("td", { class: "num", text: t.finished_ms ? span((t.finished_ms - (t.retried_ms || t.created_ms)) / 1000) : "" }),
      el("td", { class: "reason", text: failureSummary(t) }))));
}

// a task's progress bar, red once it failed
function progressBar(t, id) {
  const attrs = { id, max: Math.max(1, t.total), value: t.done + t.failed };
  if (t.state === "failed") attrs.class = "failed";
  return el("progress", attrs);
}

// a rate as people read it: 3 significant digits at most ("1,234/s", "19.8/s", "0.52/s")
function rate(perSec) {
  if (!isFinite(perSec) || perSec <= 0) return "0/s";
  if (perSec >= 100) return Math.round(perSec).toLocaleString("en-US") + "/s";
  return Number(perSec.toPrecision(3)) + "/s";
}

// `n` over `ms`, as a rate
function perSecond(n, ms) { return ms > 0 ? rate(n / (ms / 1000)) : "-"; }

function taskTable(tasks) {
  return table(["task", "kind", "state", "progress", "done", "failed", "total", "rate", "eta", "age"],
    tasks.map((t) => {
      const { rate, eta } = rateEta(t);
      return el("tr", {},
        el("td", {}, taskLink(t.task_id)), el("td", { text: t.kind }), el("td", {}, stateBadge(t.state)),
        el("td", {}, progressBar(t)),
        el("td", { class: "num", text: t.done }), el("td", { class: "num", text: t.failed }),
        el("td", { class: "num", text: t.total }), el("td", { class: "num", text: rate }), el("td", { text: eta }),
        el("td", { text: ago(t.created_ms) }));
    }));
}

function tasksView(params) {
  const state = params.get("state") || "all";
  const offset = Number(params.get("offset") || 0);
  const select = el("select", { id: "state-filter", onchange: (e) => { location.hash = "#/tasks?state=" + e.target.value; } },
    ["all", "unfinished", "finished", "running", "delayed", "aggregating", "completed", "failed", "cancelled"]
      .map((s) => el("option", { value: s, selected: s === state, text: s })));
  const list = el("div");
  const pager = el("div", { class: "pager" });
  const root = el("section", {}, el("h2", { text: "Tasks" }), el("label", {}, "state ", select), list, pager);
  return {
    root,
    async refresh() {
      const page = await api("tasks?state=" + encodeURIComponent(state) + "&offset=" + offset + "&limit=50");
      list.replaceChildren(page.tasks.length ? taskTable(page.tasks) : el("p", { class: "muted", text: "No task here." }));
      const base = "#/tasks?state=" + encodeURIComponent(state) + "&offset=";
      pager.replaceChildren(
        offset > 0 ? el("a", { href: base + Math.max(0, offset - 50), text: "← newer" }) : "",
        // (a state filter's offsets are places in the index of every task, not ranks among its own)
        el("span", { class: "muted", text: state === "all" && page.tasks.length
          ? "tasks " + (offset + 1) + " to " + (offset + page.tasks.length) + " of " + page.indexed : "" }),
        page.next_offset !== null && page.next_offset !== undefined ? el("a", { href: base + page.next_offset, text: "older →" }) : "");
    },
  };
}

function taskView(id) {
  const head = el("div");
  const controls = el("div", { class: "actions" });
  const retry = el("button", { id: "retry", hidden: true, onclick: () => act("tasks/" + encodeURIComponent(id) + "/retry", "retry") }, "Retry failed");
  const cancel = el("button", { id: "cancel", class: "danger", hidden: true, onclick: () => { if (confirm("Cancel task " + id + "?")) act("tasks/" + encodeURIComponent(id) + "/cancel", "cancel"); } }, "Cancel task");
  if (canAct()) controls.append(retry, cancel);
  const spec = el("dl", { class: "spec" });
  const legend = el("div", { class: "legend" });
  const canvas = el("canvas", { id: "shard-map", width: 800, height: 40 });
  const mapNote = el("p", { class: "muted" });
  const reasons = el("div");
  const more = el("div", { class: "pager" });
  const causes = el("div", { id: "causes" });
  // the groups whose shards are listed (by cause), kept across refreshes
  const open = new Set();
  let groups = { groups: [], complete: true };
  const drawCauses = () => causes.replaceChildren(groups.groups.length ? causeTable(groups, open, drawCauses)
    : el("p", { class: "muted", text: "No failure." }));
  let cursors = ["0"];
  const times = el("div", { id: "times" });
  const root = el("section", {}, head, controls, el("h2", { text: "Shard map" }), legend, canvas, mapNote,
    el("h2", { text: "Where time goes" }), times,
    el("h2", { text: "Failures by cause" }), causes,
    el("h2", { text: "Failed shards" }), reasons, more, el("h2", { text: "Spec" }), spec);
  canvas.addEventListener("mousemove", (e) => {
    const m = canvas.map;
    if (!m) return;
    const r = canvas.getBoundingClientRect();
    const c = Math.floor((e.clientY - r.top) / m.size) * m.cols + Math.floor((e.clientX - r.left) / m.size);
    if (c < 0 || c >= m.cells.length) return;
    const from = c * m.per_cell, to = Math.min(m.total, from + m.per_cell) - 1;
    canvas.title = (from === to ? "shard " + from : "shards " + from + "–" + to) + ": " + CELL_NAMES[m.cells[c]];
  });
  return {
    root,
    async refresh() {
      const path = "tasks/" + encodeURIComponent(id);
      const [t, m, r, g, q] = await Promise.all([api(path), api(path + "/map"),
        api(path + "/failed?count=50&cursor=" + cursors[cursors.length - 1]), api(path + "/failures"), api("queue")]);
      groups = g;
      drawCauses();
      times.replaceChildren(...timesView(t), ...slowestView(t, q.executors));
      const { rate, eta } = rateEta(t);
      const ended = ["completed", "failed", "cancelled"].includes(t.state);
      // retry: failed shards (or a failed aggregation) and not cancelled; cancel: not ended
      retry.hidden = !(t.state !== "cancelled" && (t.failed > 0 || t.aggregation_error !== null));
      cancel.hidden = ended;
      head.replaceChildren(
        el("h2", {}, "Task ", el("span", { id: "task-id", text: t.task_id }), " ", stateBadge(t.state)),
        el("p", {}, progressBar(t, "progress"), " ",
          el("span", { id: "counts", text: t.done + " done, " + t.failed + " failed" + (t.cancelled ? ", " + t.cancelled + " cancelled" : "") + " of " + t.total }), " · " + [rate, eta].filter(Boolean).join(" · ")),
        t.stuck.length ? el("div", { class: "why", text: "Not moving: " + t.stuck.join("; ") }) : "",
        t.halted ? el("div", { class: "why", id: "halted", text: t.halted }) : "",
        t.result !== null ? el("div", {}, el("strong", { text: "Result " }), el("pre", { id: "result", text: JSON.stringify(t.result, null, 1) })) : "",
        t.aggregation_error !== null ? el("div", {}, el("strong", { text: "Aggregation failed: " }), el("pre", { id: "aggregation-error", text: t.aggregation_error })) : "");
      const row = (k, v) => [el("dt", { text: k }), el("dd", {}, v)];
      spec.replaceChildren(...[
        row("kind", t.kind), row("strategy", t.strategy), row("shards", t.total), row("items", t.items),
        row("attempts", t.attempts), row("backoff", t.backoff),
        ...(t.max_failures !== null && t.max_failures !== undefined ? row("max failures", t.max_failures) : []),
        row("sharing", el("span", { id: "sharing", text: (t.running === null || t.running === undefined ? "" : t.running + " running · ")
          + "weight " + t.weight + (t.group ? " · group " + t.group : "") + (t.max_running ? " · max-running " + t.max_running : "") })),
        row("shard timeout", t.shard_timeout_ms ? span(t.shard_timeout_ms / 1000) : "none"),
        row("keep results", t.keep_results ? "yes" : "no"), row("retention", t.retain_ms ? span(t.retain_ms / 1000) : "until cleaned"),
        row("created", when(t.created_ms)), row("starts", t.start_ms ? when(t.start_ms) : "at once"),
        row("finished", when(t.finished_ms)), row("retried", when(t.retried_ms)),
        row("payload", el("pre", { id: "payload", text: JSON.stringify(t.payload, null, 1) })),
      ].flat());
      drawMap(canvas, m);
      const count = (c) => [...m.cells].filter((x) => x === c).length;
      legend.replaceChildren(...["d", "p", "r", "y", "f", "c"].filter((c) => c !== "c" || t.state === "cancelled")
        .map((c) => el("span", {}, el("i", { class: "cell-" + c }), CELL_NAMES[c])));
      mapNote.textContent = (m.per_cell > 1 ? "each cell is " + m.per_cell + " shards, coloured by its worst; " : "one cell per shard; ")
        + m.running + " running, " + m.retrying + " retrying, " + count("f") + " cells with failures"
        + (m.reasons_complete ? "" : " (too many failures to draw them all)");
      reasons.replaceChildren(r.shards.length ? table(["shard", "state", "reason"], r.shards.map((s) =>
        el("tr", {}, el("td", { class: "num", text: s.shard }), el("td", { text: s.state }), el("td", { class: "reason", text: s.reason }))))
        : el("p", { class: "muted", text: t.aggregation_error !== null ? "No failed shard: the aggregation failed." : "No failed shard." }));
      more.replaceChildren(
        cursors.length > 1 ? el("button", { onclick: () => { cursors.pop(); refreshSoon(); } }, "← first page") : "",
        r.next_cursor ? el("button", { onclick: () => { cursors.push(r.next_cursor); refreshSoon(); } }, "more →") : "");
    },
  };
}

// a duration in ms as people read it
function ms(v) { return v < 1000 ? v + "ms" : span(v / 1000); }

// a task's shard run times: the figures, then the histogram as bars (each bar's data in its
// attributes), or why there is nothing yet
function timesView(t) {
  const d = t.durations;
  if (!d) return [el("p", { class: "muted", text: "No shard of it has completed with a run time yet." })];
  const figures = el("p", { id: "durations", text: d.count + " shards timed · p50 " + ms(d.p50_ms) + " · p90 " + ms(d.p90_ms)
    + " · p99 " + ms(d.p99_ms) + " · max " + ms(d.max_ms) });
  const most = Math.max(...d.histogram.map((b) => b.count));
  const bars = el("div", { class: "histogram", id: "histogram" }, d.histogram.map((b) => el("div", {
    class: "bar", "data-from": b.from_ms, "data-to": b.to_ms, "data-count": b.count,
    title: ms(b.from_ms) + " to " + ms(b.to_ms) + ": " + b.count + " shards",
  }, el("i"), el("span", { text: ms(b.from_ms) }))));
  // heights set through the DOM (the page's policy allows no inline style attribute)
  [...bars.children].forEach((bar, k) => { bar.firstChild.style.height = Math.max(2, Math.round(80 * d.histogram[k].count / most)) + "px"; });
  return [figures, bars, ...throughputView(t.throughput)];
}

// completions over time: a bar per bucket of time, its rate in its title and data
function throughputView(tp) {
  if (!tp || !tp.counts.length) return [];
  const most = Math.max(...tp.counts);
  const bars = el("div", { class: "histogram throughput", id: "throughput" }, tp.counts.map((c, i) => el("div", {
    class: "bar", "data-at": tp.start_ms + i * tp.width_ms, "data-count": c,
    title: clock(tp.start_ms + i * tp.width_ms) + ": " + c + " completed (" + perSecond(c, tp.width_ms) + ")",
  }, el("i"))));
  [...bars.children].forEach((bar, k) => { bar.firstChild.style.height = Math.max(c0(tp.counts[k]), Math.round(80 * tp.counts[k] / most)) + "px"; });
  const peak = perSecond(most, tp.width_ms);
  return [el("h3", { text: "Completed over time" }), el("p", { class: "muted", id: "throughput-note",
    text: "each bar is " + span(tp.width_ms / 1000) + ", from " + clock(tp.start_ms) + "; the fastest " + peak }), bars];
}

// a bar's least height: none for an empty bucket, 2 px for any other
function c0(count) { return count > 0 ? 2 : 0; }

// the task's longest running shards, as the executors' heartbeats report them (each executor
// names its 10 longest running)
function slowestView(t, executors) {
  const running = executors.flatMap((n) => n.running.filter((r) => r.task === t.task_id).map((r) => ({ ...r, node: n.node })))
    .sort((a, b) => b.running_ms - a.running_ms).slice(0, 10);
  if (!running.length) return [];
  return [el("h3", { text: "Running longest" }), table(["shard", "node", "running for"], running.map((r) =>
    el("tr", {}, el("td", { class: "num", text: r.shard }), el("td", { text: r.node }), el("td", { text: ms(r.running_ms) }))))];
}

// a task's failures grouped by cause (GET /api/tasks/ID/failures); a click on a group lists its
// shards (`open` holds the causes listed)
function causeTable(g, open, redraw) {
  const rows = [];
  g.groups.forEach((c, k) => {
    const shown = open.has(c.cause);
    const state = [c.failed ? c.failed + " failed" : "", c.retrying ? c.retrying + " retrying" : "",
      c.cancelled ? c.cancelled + " cancelled" : ""].filter(Boolean).join(", ");
    const toggle = () => { if (open.has(c.cause)) open.delete(c.cause); else open.add(c.cause); redraw(); };
    rows.push(el("tr", { class: "cause", "data-group": k, onclick: toggle, title: "show or hide its shards" },
      el("td", { class: "num", text: c.count }), el("td", { class: "cause-example" }, el("span", { class: "twisty", text: shown ? "▾ " : "▸ " }), c.example),
      el("td", { text: state }), el("td", { text: when(c.first_ms) }), el("td", { text: when(c.last_ms) }),
      el("td", { text: c.nodes.map(([n, k]) => n + " ×" + k).join(", ") }),
      el("td", { text: c.attempts.map(([a, k]) => "#" + a + " ×" + k).join(", ") })));
    if (shown) {
      const more = c.count > c.shards.length ? el("p", { class: "muted", text: "and " + (c.count - c.shards.length) + " more" }) : "";
      rows.push(el("tr", { class: "cause-shards", "data-group": k }, el("td", {}), el("td", { colspan: 6 },
        table(["shard", "state", "node", "attempt", "failed at", "reason"], c.shards.map((s) => el("tr", {},
          el("td", { class: "num", text: s.shard }), el("td", { text: s.state }), el("td", { text: s.node ?? "-" }),
          el("td", { class: "num", text: s.attempt ?? "-" }), el("td", { text: when(s.at_ms) }),
          el("td", { class: "cause-example", text: s.summary })))), more)));
    }
  });
  const note = g.complete ? "" : el("p", { class: "muted", text: "grouped the first " + g.read + " failures" });
  return el("div", {}, table(["shards", "cause (an example)", "state", "first", "last", "nodes", "attempts"], rows), note);
}

function drawMap(canvas, m) {
  const n = m.cells.length;
  const width = Math.min(800, Math.max(200, canvas.parentElement ? canvas.parentElement.clientWidth : 800));
  const size = Math.max(2, Math.min(24, Math.floor(Math.sqrt((width * 320) / Math.max(1, n)))));
  const cols = Math.max(1, Math.floor(width / size));
  const rows = Math.max(1, Math.ceil(n / cols));
  if (canvas.width !== cols * size) canvas.width = cols * size;
  if (canvas.height !== rows * size) canvas.height = rows * size;
  const ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const gap = size >= 6 ? 1 : 0;
  for (let i = 0; i < n; i++) {
    ctx.fillStyle = COLORS[m.cells[i]] || "#000";
    ctx.fillRect((i % cols) * size, Math.floor(i / cols) * size, size - gap, size - gap);
  }
  canvas.map = { ...m, size, cols };
  canvas.dataset.cellSize = size;
  canvas.dataset.cols = cols;
  canvas.dataset.cells = n;
  canvas.dataset.perCell = m.per_cell;
}

function schedulesView() {
  const list = el("div");
  return {
    root: el("section", {}, el("h2", { text: "Schedules" }), list),
    async refresh() {
      const all = await api("schedules");
      list.replaceChildren(all.length ? table(["name", "cron", "zone", "kind", "shards", "next fire", "last fire", "last task"],
        all.map((s) => el("tr", {}, el("td", { text: s.name }), el("td", { text: s.cron }), el("td", { text: s.tz }),
          el("td", { text: s.fields.kind ?? "?" }), el("td", { class: "num", text: s.fields.total ?? "?" }),
          el("td", { text: s.state.next_fire_ms ? when(s.state.next_fire_ms) : "never" }),
          el("td", { text: when(s.state.last_fire_ms) }),
          el("td", {}, s.state.last_task ? taskLink(s.state.last_task) : "-"))))
        : el("p", { class: "muted", text: "No schedules. `shardctl schedule add` makes one; a coordinator fires them." }));
    },
  };
}

function eventsView() {
  const list = el("div");
  return {
    root: el("section", {}, el("h2", { text: "Events (newest first)" }), list),
    async refresh() {
      const events = await api("events?count=100");
      list.replaceChildren(events.length ? table(["time", "event", "task", "details"], events.map((e) => {
        const rest = Object.entries(e).filter(([k]) => !["id", "time_ms", "event", "task"].includes(k))
          .map(([k, v]) => k + "=" + (typeof v === "string" ? v : JSON.stringify(v))).join(" ");
        return el("tr", {}, el("td", { text: when(e.time_ms) }), el("td", { text: e.event }),
          el("td", {}, e.task ? taskLink(String(e.task)) : ""), el("td", { class: "reason", text: rest }));
      })) : el("p", { class: "muted", text: "The event log is empty (or turned off: shardctl config --events-maxlen)." }));
    },
  };
}

// ---- routing and refresh --------------------------------------------------------------------

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  const parts = path.split("/").filter(Boolean);
  let name = parts[0] || "queue";
  if (name === "task" && parts[1]) view = taskView(decodeURIComponent(parts.slice(1).join("/")));
  else if (name === "tasks") view = tasksView(params);
  else if (name === "schedules") view = schedulesView();
  else if (name === "events") view = eventsView();
  else { name = "queue"; view = queueView(); }
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("current", a.dataset.route === (name === "task" ? "tasks" : name));
  document.getElementById("main").replaceChildren(view.root);
  refreshSoon();
}

async function refresh() {
  if (busy || !view) return;
  busy = true;
  const current = view;
  try {
    await current.refresh();
    document.getElementById("updated").textContent = "updated " + clock(Date.now());
  } catch (e) {
    if (current === view) document.getElementById("updated").textContent = "not updated: " + e.message;
  } finally {
    busy = false;
  }
}

function refreshSoon() { setTimeout(refresh, 0); }

// the queue switcher: every queue of the Redis (docs/dashboard.md), read every 2 s
async function showQueues() {
  const select = document.getElementById("queue-switch");
  let all;
  try { all = await api("queues"); } catch (e) { return; }
  const shown = ownQueue() ? info.queue : shownQueue;
  const names = all.queues.map((q) => q.queue);
  if (!names.includes(shown)) all.queues.push({ queue: shown, maintained: false, tasks: { unfinished: "?" } });
  select.replaceChildren(...all.queues.map((q) => el("option", { value: q.queue, selected: q.queue === shown,
    text: q.queue + " · " + q.tasks.unfinished + " unfinished" + (q.paused ? " · paused" : "") + (q.maintained ? "" : " · read-only") })));
  select.title = all.more ? "more queues than listed" : "";
}

function showMode() {
  document.getElementById("queue-name").textContent = "queue";
  const mode = document.getElementById("mode");
  const form = document.getElementById("token-form");
  if (!ownQueue()) {
    mode.textContent = "read-only: this coordinator maintains queue " + info.queue;
    form.hidden = true;
    return;
  }
  if (info.read_only) {
    mode.textContent = "read-only (the coordinator has no --ui-token-file)";
    form.hidden = true;
    return;
  }
  form.hidden = false;
  document.getElementById("token").hidden = token() !== "";
  document.getElementById("token-use").hidden = token() !== "";
  document.getElementById("token-forget").hidden = token() === "";
  mode.textContent = token() ? "actions allowed with your token" : "enter the token to act";
}

async function start() {
  document.getElementById("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = document.getElementById("token").value.trim();
    if (t) sessionStorage.setItem("shardctl-token", t);
    document.getElementById("token").value = "";
    showMode();
    route();
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem("shardctl-token");
    showMode();
    route();
  });
  try {
    info = await api("info");
  } catch (e) {
    document.getElementById("main").replaceChildren(el("p", { text: "Cannot reach the dashboard's API: " + e.message }));
    return;
  }
  showMode();
  const zone = document.getElementById("zone");
  const showZone = () => { zone.textContent = localZone() ? "times in your zone (show UTC)" : "times in UTC (show your zone)"; };
  showZone();
  zone.addEventListener("click", () => {
    localStorage.setItem("shardctl-zone", localZone() ? "utc" : "local");
    showZone();
    route();
  });
  const select = document.getElementById("queue-switch");
  select.addEventListener("change", () => {
    const q = select.value;
    location.search = q === info.queue ? "" : "?queue=" + encodeURIComponent(q);
  });
  showQueues();
  setInterval(showQueues, 2 * REFRESH_MS);
  window.addEventListener("hashchange", route);
  route();
  setInterval(refresh, REFRESH_MS);
}

start();
