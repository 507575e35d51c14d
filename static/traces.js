// Request traces in the browser: the `trace` event on /live (engine/serving/telemetry/traces.py) drawn as
// swimlanes (one row per recent request, coloured by phase) and the batch step by step (each
// engine step a stacked bar of the tokens it ran, against max_batched_tokens, and its time split
// into the model's part and the host's, as the engine measured them). SVG, redrawn at
// most once a frame; names and ids are set as text, never as HTML.
// window.servelabTraces = { rows(), onUpdate(callback), highlightUser(userId) } is what other
// pages (the classroom) read.
(function () {
  "use strict";
  const socket = window.servelab && window.servelab.socket;
  if (!socket) return;
  const SVG = "http://www.w3.org/2000/svg";
  const WINDOW_ROWS = 300; // as the server's window
  const LANES_SHOWN = 120; // the newest lanes drawn (and every highlighted one)
  const STEPS_SHOWN = 60;
  const PHASES = {
    queued: ["in the central queue", "#adb5bd"],
    waiting: ["waiting in the replica", "#fcc419"],
    prefill: ["prefill (a tick per chunk)", "#4dabf7"],
    handoff: ["KV handoff to a decode replica", "#be4bdb"],
    decode: ["decode", "#51cf66"],
    preempted: ["preempted (then recomputed)", "#fa5252"],
  };
  const ENDS = {
    finished: ["finished", "#2b8a3e"], cancelled: ["cancelled", "#868e96"], refused: ["refused", "#c92a2a"],
    expired: ["expired", "#e8590c"], failed: ["failed", "#212529"],
  };

  const rows = new Map(); // id -> TraceRow, the server's window
  let steps = [], summary = {}, sampled = 0, run = null, now = 0, highlighted = null, picked = null;
  const listeners = [];

  socket.on("trace", (msg) => {
    if (msg.full || msg.run !== run) { rows.clear(); steps = []; }
    run = msg.run;
    now = msg.time;
    for (const row of msg.rows) rows.set(row.id, row);
    if (rows.size > WINDOW_ROWS) {
      const keep = Array.from(rows.values()).sort((a, b) => a.arrival - b.arrival);
      for (const row of keep.slice(0, rows.size - WINDOW_ROWS)) {
        if (!row.user || ["finished", "cancelled", "refused", "expired", "failed"].includes(row.outcome)) rows.delete(row.id);
      }
    }
    steps = steps.concat(msg.steps).slice(-STEPS_SHOWN);
    summary = msg.summary;
    sampled = msg.sampled;
    schedule();
    for (const callback of listeners) callback(api.rows(), msg);
  });

  const api = {
    rows: () => Array.from(rows.values()).sort((a, b) => a.arrival - b.arrival),
    steps: () => steps.slice(),
    summary: () => ({ summary: Object.assign({}, summary), sampled: sampled }),
    onUpdate: (callback) => { listeners.push(callback); },
    cost: () => Object.assign({}, cost),
    highlightUser: (userId) => { highlighted = userId === null || userId === undefined ? null : String(userId); schedule(); },
  };
  window.servelabTraces = api;

  // ---- drawing -----------------------------------------------------------------------------------
  // At most DRAW_HZ redraws a second: the stream ticks six times, and a page must keep up with
  // its snapshots on a busy machine (the charts beside these are Plotly's).
  const DRAW_HZ = 3;
  let pending = false, lastDraw = 0;
  function schedule() {
    if (pending) return;
    pending = true;
    const wait = Math.max(0, lastDraw + 1000 / DRAW_HZ - performance.now());
    setTimeout(() => requestAnimationFrame(() => { pending = false; lastDraw = performance.now(); draw(); }), wait);
  }
  const cost = { draws: 0, ms: 0 }; // what drawing has cost this page, for the load test
  function draw() {
    const t0 = performance.now();
    const lanes = document.getElementById("chart-swimlanes");
    if (lanes) drawSwimlanes(lanes);
    const batch = document.getElementById("chart-batch_steps");
    if (batch) drawBatch(batch);
    const stages = document.getElementById("chart-stage_steps");
    if (stages) drawStages(stages);
    cost.draws += 1;
    cost.ms += performance.now() - t0;
  }
  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (parent) parent.appendChild(node);
    return node;
  }
  function title(node, text) { el("title", {}, node).textContent = text; }
  const secs = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(3) + " s");
  const ms = (v) => (v === null || v === undefined ? "–" : (Number(v) * 1000).toFixed(1) + " ms");
  function frame(container, height, legend) {
    container.classList.add("trace-chart");
    container.style.height = "auto";
    let svg = container.querySelector("svg.trace-svg");
    if (!svg) {
      container.textContent = "";
      const key = document.createElement("div");
      key.className = "trace-legend";
      for (const [label, color] of legend) {
        const item = document.createElement("span");
        const swatch = document.createElement("i");
        swatch.style.background = color;
        item.appendChild(swatch);
        item.appendChild(document.createTextNode(label));
        key.appendChild(item);
      }
      svg = el("svg", { class: "trace-svg" }, container);
      container.appendChild(key);
      const note = document.createElement("div");
      note.className = "trace-note";
      container.appendChild(note);
    }
    const width = Math.max(240, container.clientWidth || 600);
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", "0 0 " + width + " " + height);
    svg.textContent = "";
    return { svg: svg, width: width, note: container.querySelector(".trace-note") };
  }

  // One lane's segments: [phase, from, to] from its timestamps, in time order.
  function segments(row) {
    const end = row.end !== null ? row.end : now;
    const marks = [[row.arrival, "queued"]];
    if (row.dispatched !== null) marks.push([row.dispatched, "waiting"]);
    if (row.scheduled !== null) marks.push([row.scheduled, "prefill"]);
    if (row.first_token !== null) marks.push([row.first_token, "decode"]);
    if (row.handoff) { // a prefill/decode split: the KV on its way, then decode on the other replica
      marks.push([row.handoff[0] + 1e-6, "handoff"]);
      if (row.handoff[1] !== null) marks.push([row.handoff[1], "decode"]);
    }
    row.preempted.forEach((p, i) => {
      const next = i + 1 < row.preempted.length ? row.preempted[i + 1] : Infinity;
      const redo = row.chunks.filter((c) => c[0] >= p && c[0] < next);
      marks.push([p, "preempted"]);
      if (redo.length) {
        marks.push([redo[0][0], "prefill"]);
        const resumed = row.first_token !== null && row.first_token < redo[redo.length - 1][0];
        if (resumed) marks.push([redo[redo.length - 1][0] + 1e-6, "decode"]);
      }
    });
    marks.sort((a, b) => a[0] - b[0]);
    const out = [];
    marks.forEach(([t, phase], i) => {
      const to = i + 1 < marks.length ? marks[i + 1][0] : end;
      if (to > t || (i + 1 === marks.length && phase === "preempted")) out.push([phase, t, Math.max(t, to)]);
    });
    return out;
  }
  function laneTitle(row) {
    return [
      row.id + (row.user ? " · " + row.user : "") + " · " + row.outcome + (row.replica !== null ? " on replica " + row.replica : ""),
      row.prompt_tokens + " prompt tokens, " + row.output_tokens + " of " + row.max_tokens + " generated",
      "arrival " + secs(row.arrival) + ", scheduled " + secs(row.scheduled),
      "first token " + secs(row.first_token) + ", last token " + secs(row.last_token),
      "TTFT " + secs(row.ttft) + ", TPOT " + ms(row.tpot) + (row.preempted.length ? ", preempted " + row.preempted.length + "x" : ""),
      row.chunks.length + " prefill chunk(s): " + row.chunks.map((c) => c[1]).join(" + ") + " tokens",
    ].concat(row.handoff ? ["KV handoff: " + (row.handoff[2] / 1e6).toFixed(1) + " MB, " +
      (row.handoff[1] !== null ? ms(row.handoff[1] - row.handoff[0]) : "on the way")] : []).join("\n");
  }
  function drawSwimlanes(container) {
    const all = api.rows();
    let shown = all.slice(-LANES_SHOWN);
    if (highlighted !== null) {
      const mine = all.filter((r) => r.user === highlighted && !shown.includes(r));
      shown = mine.concat(shown);
    }
    const left = 8, right = 8, top = 6, axis = 18;
    const laneH = Math.max(3, Math.min(12, Math.floor(300 / Math.max(1, shown.length))));
    const height = top + shown.length * laneH + axis;
    const { svg, width, note } = frame(container, Math.max(60, height),
      Object.values(PHASES).concat(Object.values(ENDS)));
    const t0 = shown.length ? Math.min(...shown.map((r) => r.arrival)) : now - 10;
    const span = Math.max(1, now - t0) * 1.02;
    const x = (t) => left + ((t - t0) / span) * (width - left - right);
    shown.forEach((row, i) => {
      const y = top + i * laneH;
      const mine = highlighted !== null && row.user === highlighted;
      const g = el("g", { class: "lane" + (mine ? " mine" : ""), "data-id": row.id, "data-outcome": row.outcome }, svg);
      if (row.user) g.setAttribute("data-user", row.user);
      for (const [phase, from, to] of segments(row)) {
        const w = Math.max(phase === "preempted" ? 2 : 1, x(to) - x(from));
        el("rect", { class: "seg", "data-phase": phase, x: x(from), y: y, width: w, height: laneH - 1, fill: PHASES[phase][1] }, g);
      }
      for (const [t] of row.chunks) el("line", { class: "chunk-tick", x1: x(t), x2: x(t), y1: y, y2: y + laneH - 1 }, g);
      if (ENDS[row.outcome] && row.end !== null) {
        el("rect", { class: "end", "data-phase": row.outcome, x: x(row.end), y: y, width: 3, height: laneH - 1, fill: ENDS[row.outcome][1] }, g);
      }
      if (mine) {
        el("rect", { class: "mine-outline", x: left - 4, y: y - 0.5, width: width - left - right + 6, height: laneH, fill: "none" }, g);
        const label = el("text", { class: "mine-label", x: width - right, y: y + laneH - 1, "text-anchor": "end" }, g);
        label.textContent = row.user + " · " + row.outcome;
      }
      title(g, laneTitle(row));
      g.addEventListener("click", () => { picked = picked === row.id ? null : row.id; schedule(); });
    });
    const ay = height - 4;
    el("line", { class: "axis", x1: left, x2: width - right, y1: ay - 10, y2: ay - 10 }, svg);
    const label = el("text", { class: "axis-label", x: width - right, y: ay, "text-anchor": "end" }, svg);
    label.textContent = "now · " + span.toFixed(1) + " s shown";
    const older = Object.entries(summary).map(([k, n]) => n + " " + k).join(", ");
    if (picked !== null && rows.has(picked)) {
      note.textContent = laneTitle(rows.get(picked)) + "\n(tap the row again to close)";
    } else {
      note.textContent = all.length + " recent requests" + (older ? "; earlier: " + older : "") +
        (sampled ? "; " + sampled + " not drawn (traffic too fast to draw every one)" : "") + ". Hover or tap a row.";
    }
  }

  // Each request's own hue, the same in every bar; prefill chunks solid, decode tokens light.
  function hue(id) {
    let h = 0;
    for (let i = 0; i < id.length; i++) h = (h * 31 + id.charCodeAt(i)) % 360;
    return h;
  }
  // A step's host time: what of its span the model did not take (the engine's own measurement).
  const hostOf = (s) => (s.model_s === undefined ? 0 : Math.max(0, s.end - s.start - s.model_s));
  function drawBatch(container) {
    const left = 54, right = 8, top = 8, barsH = 150, gap = 8, seqH = 40, timeH = 30, bottom = 14;
    const height = top + barsH + gap + seqH + gap + timeH + bottom;
    const { svg, width, note } = frame(container, height, [
      ["prefill chunk (a colour per request)", "hsl(210,70%,45%)"], ["decode tokens (lighter)", "hsl(210,70%,80%)"],
      ["KV handoff landing (its last block computed here)", "#be4bdb"],
      ["max_batched_tokens", "#e03131"], ["sequences / max_num_seqs", "#7048e8"],
      ["step time: model (forward + sampling)", "#adb5bd"], ["step time: host (schedule, inputs, outputs)", "#f59f00"],
    ]);
    const shown = steps.slice(-STEPS_SHOWN);
    const tall = Math.max(1, ...shown.map((s) => Math.max(s.max_batched_tokens, s.entries.reduce((a, e) => a + e.tokens, 0))));
    const slots = Math.max(1, ...shown.map((s) => s.max_num_seqs));
    const slowest = Math.max(1e-6, ...shown.map((s) => s.end - s.start));
    const bw = (width - left - right) / STEPS_SHOWN;
    const yTok = (v) => top + barsH - (v / tall) * barsH;
    const seqTop = top + barsH + gap, timeTop = seqTop + seqH + gap;
    const ySeq = (v) => seqTop + seqH - (v / slots) * seqH;
    axisText(svg, left - 4, top + 8, String(tall) + " tok");
    axisText(svg, left - 4, top + barsH, "0");
    axisText(svg, left - 4, seqTop + 8, slots + " seqs");
    axisText(svg, left - 4, timeTop + 8, (slowest * 1000).toFixed(0) + " ms");
    shown.forEach((s, i) => {
      const x0 = left + i * bw;
      const total = s.entries.reduce((a, e) => a + e.tokens, 0);
      const decodes = s.entries.filter((e) => e.phase === "decode");
      const g = el("g", { class: "bar", "data-tokens": total, "data-budget": s.max_batched_tokens, "data-seqs": s.entries.length }, svg);
      let acc = 0;
      // Many decodes in one step are one segment per request only while they stay visible.
      const parts = decodes.length > 48
        ? s.entries.filter((e) => e.phase !== "decode").concat([{ request_id: decodes.length + " decodes", phase: "decode", tokens: decodes.length }])
        : s.entries;
      for (const e of parts) {
        const y1 = yTok(acc), y2 = yTok(acc + e.tokens);
        const light = e.phase === "decode" ? "80%" : "45%";
        const fill = e.phase === "handoff" ? PHASES.handoff[1] : "hsl(" + hue(e.request_id) + ",70%," + light + ")";
        el("rect", { class: "bar-seg", "data-phase": e.phase, x: x0 + 1, y: y2, width: Math.max(1, bw - 2),
          height: Math.max(0.5, y1 - y2), fill: fill }, g);
        acc += e.tokens;
      }
      el("line", { class: "budget", x1: x0, x2: x0 + bw, y1: yTok(s.max_batched_tokens), y2: yTok(s.max_batched_tokens) }, g);
      el("rect", { class: "seq-count", x: x0 + 1, y: ySeq(s.entries.length), width: Math.max(1, bw - 2), height: seqTop + seqH - ySeq(s.entries.length) }, g);
      el("line", { class: "slots", x1: x0, x2: x0 + bw, y1: ySeq(s.max_num_seqs), y2: ySeq(s.max_num_seqs) }, g);
      // The step's time as a column: the model's part below, the host's on top of it.
      const th = ((s.end - s.start) / slowest) * timeH, hh = (hostOf(s) / slowest) * timeH;
      el("rect", { class: "step-time", x: x0 + 1, y: timeTop + timeH - th + hh, width: Math.max(1, bw - 2), height: th - hh }, g);
      el("rect", { class: "step-host", x: x0 + 1, y: timeTop + timeH - th, width: Math.max(1, bw - 2), height: hh }, g);
      const prefill = s.entries.filter((e) => e.phase === "prefill").map((e) => e.request_id + " " + e.tokens).join(", ");
      // A handed-over prompt: its KV came from the prefill replica (the bytes on its trace row).
      const landed = s.entries.filter((e) => e.phase === "handoff").map((e) => {
        const r = rows.get(e.request_id), h = r && r.handoff;
        return e.request_id + " (" + (h ? (h[2] / 1e6).toFixed(1) + " MB imported, " : "") + e.tokens + " computed)";
      }).join(", ");
      title(g, "replica " + s.replica + " · step " + ms(s.end - s.start) + " (model " + ms(s.end - s.start - hostOf(s)) +
        ", host " + ms(hostOf(s)) + ")\n" + total + " of " + s.max_batched_tokens +
        " tokens, " + s.entries.length + " of " + s.max_num_seqs + " sequences\nprefill: " + (prefill || "none") +
        (landed ? "\nKV handoff landed: " + landed : "") +
        "\ndecode: " + decodes.length + " token(s)" + (s.preempted.length ? "\npreempted: " + s.preempted.join(", ") : ""));
    });
    if (shown.length) {
      const last = shown[shown.length - 1];
      const times = shown.map((s) => s.end - s.start).sort((a, b) => a - b);
      const spent = shown.reduce((a, s) => a + (s.end - s.start), 0), host = shown.reduce((a, s) => a + hostOf(s), 0);
      note.textContent = "latest step: " + last.entries.reduce((a, e) => a + e.tokens, 0) + " of " + last.max_batched_tokens +
        " tokens, " + last.entries.length + " of " + last.max_num_seqs + " sequences; median step " + ms(times[times.length >> 1]) +
        ".\nhost " + (spent > 0 ? Math.round((100 * host) / spent) : 0) + "% of step time over the last " + shown.length +
        " steps: scheduling, building inputs and processing outputs, while the model waits.";
    } else {
      note.textContent = "No engine steps yet: start traffic or send a prompt.";
    }
  }
  // Pipeline stages over the latest steps of one replica: a lane per stage, each batch a bar where
  // the stage worked on it; the lane's shaded background shows through where it idled (the bubble).
  function drawStages(container) {
    const left = 54, right = 8, top = 6, laneH = 22, gap = 6, bottom = 16;
    const piped = steps.filter((s) => s.stages && s.stages.length > 1);
    const replica = piped.length ? piped[piped.length - 1].replica : null;
    const shown = piped.filter((s) => s.replica === replica);
    const count = shown.length ? Math.max(...shown.map((s) => s.stages.length)) : 2;
    const height = top + count * (laneH + gap) + bottom;
    const { svg, width, note } = frame(container, height, [
      ["a stage working on a batch (a colour per batch)", "hsl(210,70%,55%)"], ["idle: the bubble", "#ffe3e3"],
    ]);
    if (!shown.length) {
      note.textContent = "No pipelined steps yet: set pipeline_parallel to 2 or more and send traffic.";
      return;
    }
    const t0 = Math.min(...shown.map((s) => s.stages[0][0]));
    const t1 = Math.max(...shown.map((s) => s.stages[s.stages.length - 1][1]));
    const span = Math.max(1e-6, t1 - t0);
    const x = (t) => left + ((t - t0) / span) * (width - left - right);
    const busy = new Array(count).fill(0);
    for (let k = 0; k < count; k++) {
      const y = top + k * (laneH + gap);
      el("rect", { class: "stage-idle", x: left, y: y, width: width - left - right, height: laneH }, svg);
      axisText(svg, left - 4, y + laneH / 2 + 4, "stage " + k);
    }
    shown.forEach((s, i) => {
      s.stages.forEach(([a, b], k) => {
        busy[k] += b - a;
        const bar = el("rect", { class: "stage-busy", "data-stage": k, x: x(a), y: top + k * (laneH + gap), width: Math.max(1, x(b) - x(a)),
          height: laneH, fill: "hsl(" + ((i * 47) % 360) + ",60%,55%)" }, svg);
        title(bar, "stage " + k + " on a batch of " + s.entries.length + " sequence(s): " + ms(b - a));
      });
    });
    axisText(svg, width - right, height - 3, (span * 1000).toFixed(0) + " ms shown");
    note.textContent = "replica " + replica + ", the latest " + shown.length + " batches: " +
      busy.map((b, k) => "stage " + k + " idle " + Math.round(100 * Math.max(0, 1 - b / span)) + "%").join(", ") + ".";
  }
  function axisText(svg, x, y, text) {
    el("text", { class: "axis-label", x: x, y: y, "text-anchor": "end" }, svg).textContent = text;
  }

  const style = document.createElement("style");
  style.textContent = [
    ".chart.trace-chart { height: auto; min-height: 120px; }",
    ".chart-card:has(#chart-swimlanes), .chart-card:has(#chart-batch_steps) { grid-column: 1 / -1; }",
    ".trace-svg { display: block; } .trace-svg .lane { cursor: pointer; }",
    ".trace-svg .chunk-tick { stroke: #1c3d5a; stroke-width: 1; }",
    ".trace-svg .lane.mine .mine-outline { stroke: #7048e8; stroke-width: 1.5; }",
    ".trace-svg .mine-label { font-size: 10px; font-weight: 700; fill: #5f3dc4; }",
    ".trace-svg .axis { stroke: #dee2e6; } .trace-svg .axis-label { font-size: 10px; fill: #868e96; }",
    ".trace-svg .budget { stroke: #e03131; stroke-width: 1.5; stroke-dasharray: 4 2; }",
    ".trace-svg .slots { stroke: #7048e8; stroke-dasharray: 3 2; } .trace-svg .seq-count { fill: #b197fc; }",
    ".trace-svg .step-time { fill: #adb5bd; } .trace-svg .step-host { fill: #f59f00; }",
    ".trace-svg .stage-idle { fill: #ffe3e3; } .chart-card:has(#chart-stage_steps) { grid-column: 1 / -1; }",
    ".trace-legend { display: flex; flex-wrap: wrap; gap: 4px 12px; font-size: 10px; color: #495057; margin: 4px 0; }",
    ".trace-legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; vertical-align: -1px; }",
    ".trace-note { font-size: 11px; color: #495057; white-space: pre-line; min-height: 1.2em; margin-bottom: 4px; }",
  ].join("\n");
  document.head.appendChild(style);
  window.addEventListener("resize", schedule);
  draw();
})();
