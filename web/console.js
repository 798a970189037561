// troupe console: renders /console/state, then follows /console/feed (server-sent events, one
// state a second). No framework: the page is small and must work offline.
"use strict";

const $ = (id) => document.getElementById(id);
const samples = [];  // [time_ms, tokens_generated] of recent states, for tokens/s

function text(s) {
  const span = document.createElement("span");
  span.textContent = s;
  return span.innerHTML;
}
function bytes(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
  if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
  return n + " B";
}
function ms(n) { return n >= 1000 ? (n / 1000).toFixed(2) + " s" : n.toFixed(0) + " ms"; }
function rows(id, list, cells) {
  $(id).querySelector("tbody").innerHTML = list.map((x) =>
    "<tr>" + cells(x).map((c) => (typeof c === "number" ? '<td class="num">' + c + "</td>"
                                                          : "<td>" + c + "</td>")).join("") +
    "</tr>").join("");
}
function pairs(id, obj) {
  rows(id, Object.entries(obj), ([k, v]) => [text(k), typeof v === "number" ? v : text(String(v))]);
}
function stateCell(s) { return '<span class="state-' + text(s) + '">' + text(s) + "</span>"; }

function render(st) {
  const c = st.cluster || {}, s = st.scheduler || {}, g = st.gateway || {}, m = st.model || {};
  const chat = !m.chat ? "" : m.chat.template !== "ok" ? " · chats refused: " + m.chat.template
      : " · chats" + (m.chat.tool_calls !== "none" ? " + tools (" + m.chat.tool_calls + ")" : "") +
        (m.chat.reasoning ? " + reasoning" : "");
  $("model").textContent =
      m.id + " · " + m.arch + " · " + m.n_layer + " layers · " + m.format + chat;
  const serving = c.serving && !c.condition;
  $("serving").textContent = serving ? "serving" : "not serving";
  $("serving").className = "badge " + (serving ? "ok" : "bad");
  $("condition").textContent = c.condition || "";

  samples.push([st.time_ms, s.tokens_generated || 0]);
  while (samples.length > 60) samples.shift();
  if (samples.length >= 2) {
    const a = samples[samples.length - 2], b = samples[samples.length - 1];
    const tps = b[0] > a[0] ? (b[1] - a[1]) * 1000 / (b[0] - a[0]) : 0;
    $("tps").textContent = tps.toFixed(0);
    const rates = [];
    for (let i = 1; i < samples.length; ++i) {
      const dt = samples[i][0] - samples[i - 1][0];
      rates.push(dt > 0 ? (samples[i][1] - samples[i - 1][1]) * 1000 / dt : 0);
    }
    const top = Math.max(1, ...rates);
    $("tps-chart").querySelector("polyline").setAttribute("points", rates.map((r, i) =>
      (i * 120 / Math.max(1, rates.length - 1)).toFixed(1) + "," + (30 - 28 * r / top).toFixed(1)).join(" "));
  }
  $("seqs").textContent = (s.running ?? "—") + " / " + (s.waiting ?? "—");
  const kv = s.kv_usage_perc ?? 0;
  $("kv").textContent = (100 * kv).toFixed(0) + " %";
  $("kv-bar").style.width = (100 * kv).toFixed(1) + "%";
  $("inflight").textContent = g.in_flight ?? "—";
  $("ttft").textContent = g.ttft_count ? ms(1000 * g.ttft_sum / g.ttft_count) : "—";
  $("busy").textContent = s.step_wall_seconds ?
      (100 * s.step_compute_seconds / s.step_wall_seconds).toFixed(0) + " %" : "—";

  rows("nodes", c.members || [], (n) => [text(n.name), text(n.address), stateCell(n.state),
    ms(n.heartbeat_age_ms), n.cpu_cores, bytes(n.free_memory_bytes) + " / " + bytes(n.memory_bytes)]);
  rows("actors", c.actors || [], (a) => {
    const at = a.name.lastIndexOf("@");
    return [text(at < 0 ? a.name : a.name.slice(0, at)), text(at < 0 ? "" : a.name.slice(at + 1)),
            stateCell(a.state), a.restarts];
  });
  pairs("scheduler", {
    "steps": s.steps, "tokens generated": s.tokens_generated, "preemptions": s.preemptions,
    "recomputes": s.recomputes, "step timeouts": s.step_timeouts,
    "prefix cache hits (tokens)": (s.prefix_hit_tokens ?? 0) + " of " + (s.prefix_query_tokens ?? 0),
  });
  pairs("requests", {
    "answered 2xx / 4xx / 5xx": g.http_2xx + " / " + g.http_4xx + " / " + g.http_5xx,
    "finished: stop / length": g.finished_stop + " / " + g.finished_length,
    "cancelled / failed": g.finished_cancelled + " / " + g.finished_error,
    "prompt tokens": g.prompt_tokens,
    "mean latency": g.e2e_count ? ms(1000 * g.e2e_sum / g.e2e_count) : "—",
  });
  const end = Math.max(1, ...(c.phases || []).map((p) => p.start_ms + p.duration_ms));
  rows("phases", c.phases || [], (p) => [text(p.node), text(p.name), ms(p.start_ms),
    p.done ? ms(p.duration_ms) : "running",
    '<div class="phase" style="margin-left:' + (100 * p.start_ms / end).toFixed(1) + "%;width:" +
      (100 * p.duration_ms / end).toFixed(1) + '%"></div>']);
  rows("links", c.links || [], (l) => [text(l.node), text(l.peer),
    l.messages_sent + " · " + bytes(l.bytes_sent), l.messages_received + " · " + bytes(l.bytes_received),
    text(l.large_messages), l.malformed + l.corrupted + l.oversized + l.send_errors]);
}

// ?updates=N: stop following after N updates (a headless browser's snapshot waits for the
// page's connections to end).
const limit = Number(new URLSearchParams(location.search).get("updates") || 0);

function follow() {
  const es = new EventSource("/console/feed");
  let updates = 0;
  es.onmessage = (e) => {
    render(JSON.parse(e.data));
    ++updates;
    $("feed").textContent = "live";
    if (limit && updates >= limit) {
      es.close();
      $("feed").textContent = "stopped after " + updates + " updates";
    }
  };
  es.onerror = () => { $("feed").textContent = "reconnecting…"; };
}

fetch("/console/state").then((r) => r.json()).then(render).catch(() => {}).finally(follow);
