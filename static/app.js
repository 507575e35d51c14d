// ServeLab's browser side: one Socket.IO connection to /live, charts fed by Plotly.extendTraces,
// levers sent as set_levers, traffic as flood, scenario cards as scenario. No framework.
(function () {
  "use strict";
  const WINDOW_POINTS = 360; // about a minute of snapshots
  const LEVER_INPUTS = "#lever-form [name], #mode-form [name]";
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));

  // The instructor's token arrives once as ?token=..., then lives in this browser only.
  const params = new URLSearchParams(location.search);
  if (params.has("token")) {
    localStorage.setItem("servelab-token", params.get("token"));
    params.delete("token");
    history.replaceState(null, "", location.pathname + (params.toString() ? "?" + params : ""));
  }
  const socket = io("/live", { auth: { token: localStorage.getItem("servelab-token") || "" } });
  window.servelab = { socket: socket, snapshots: 0, role: null, lab: null };

  // ---- charts ----------------------------------------------------------------------------------
  const sum = (obj) => Object.values(obj || {}).reduce((a, b) => a + b, 0);
  const CHARTS = {
    queue_depth: [["queued", (s) => s.queue_depth]],
    running: [["running", (s) => s.running], ["waiting in replicas", (s) => s.waiting]],
    kv_blocks: [["used", (s) => s.kv_used_blocks], ["total", (s) => s.kv_total_blocks, "dot"]],
    // The server's TTFT (from its one arrival stamp) beside what the lab's clients measured at their end.
    ttft: [["server p50", (s) => s.ttft_p50], ["server p99", (s) => s.ttft_p99], ["clients p50", (s) => s.client_ttft_p50, "dot"],
           ["clients p99", (s) => s.client_ttft_p99, "dot"], ["target (p99)", (s) => s.ttft_target_ms / 1000, "dash"]],
    itl: [["p50", (s) => s.itl_p50], ["p99", (s) => s.itl_p99]],
    tpot: [["p50", (s) => s.tpot_p50], ["p99", (s) => s.tpot_p99]],
    tokens_per_s: [["tok/s", (s) => s.tokens_per_s]],
    rejected: [["queue full (429)", (s) => s.rejected.queue_full || 0], ["rate limited (429)", (s) => s.rejected.rate_limited || 0],
               ["deadline", (s) => s.rejected.deadline || 0]],
    preempted: [["preemptions", (s) => s.preempted]],
    replicas: [["ready", (s) => s.replicas.ready || 0],
               ["starting / provisioning", (s) => (s.replicas.starting || 0) + (s.replicas.provisioning || 0)],
               ["draining", (s) => s.replicas.draining || 0], ["failed", (s) => s.replicas.failed || 0],
               ["warm pool", (s) => (s.replicas.warm || 0) + (s.replicas.warming || 0), "dot"]],
    batch_size: [["batch", (s) => s.batch_size], ["slots", (s) => s.max_num_seqs, "dot"]],
    allreduce_ms: [["all-reduce ms per step", (s) => s.allreduce_ms], ["ITL p50 ms", (s) => (s.itl_p50 === null ? null : s.itl_p50 * 1000)]],
    // Prompt tokens found in the prefix cache at admission, over the snapshot's window, as a percent.
    prefix_hit_rate: [["hit rate %", (s) => (s.prefix_hit_rate == null ? null : s.prefix_hit_rate * 100)]],
    // Speculative decoding over the window: guesses the model kept, and a speculating decode's tokens a step.
    speculation: [["guesses kept %", (s) => (s.spec_acceptance == null ? null : s.spec_acceptance * 100)],
                  ["tokens per step x 10", (s) => (s.spec_tokens_per_step == null ? null : s.spec_tokens_per_step * 10), "dot"]],
    stage_idle: [0, 1, 2, 3].map((i) => ["stage " + i + " idle %", (s) => (s.stage_idle && i < s.stage_idle.length ? s.stage_idle[i] * 100 : null)]),
    scaling: [["scale changes", (s) => s.scale_changes_total], ["replicas ordered", (s) => s.replicas_ordered_total],
              ["streams cut mid-stream", (s) => s.streams_cut_mid_stream]],
  };
  const COLORS = ["#3b5bdb", "#e8590c", "#2b8a3e", "#c2255c", "#7048e8"];
  const charts = $$(".chart").filter((el) => el.dataset.metric in CHARTS).map((el) => { // traces.js draws the rest
    const spec = CHARTS[el.dataset.metric];
    const traces = spec.map(([name, , dash], i) => ({
      x: [], y: [], name: name, mode: "lines", line: { width: 2, color: COLORS[i % COLORS.length], dash: dash || "solid" },
    }));
    Plotly.newPlot(el, traces, {
      height: 190, margin: { l: 44, r: 8, t: 6, b: 28 }, showlegend: true,
      legend: { orientation: "h", y: -0.25, font: { size: 10 } },
      xaxis: { title: { text: "" }, ticksuffix: " s", gridcolor: "#eef0f4" },
      yaxis: { rangemode: "tozero", gridcolor: "#eef0f4" },
      paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { family: "inherit", size: 11 },
    }, { displayModeBar: false, responsive: true });
    return { el: el, spec: spec };
  });
  // One run is one fleet (the live engine, or one simulated fleet from simulated time 0): a new
  // run clears the charts, so simulated seconds never mix with the live engine's.
  let t0 = null, run = null;
  function resetCharts(simulated) {
    for (const c of charts) {
      Plotly.restyle(c.el, { x: c.spec.map(() => []), y: c.spec.map(() => []) });
      // The axis title needs room below the ticks: the legend moves down under it.
      Plotly.relayout(c.el, simulated
        ? { "xaxis.title.text": "simulated time", "xaxis.title.font.size": 10, "xaxis.title.standoff": 2, "margin.b": 44, "legend.y": -0.5 }
        : { "xaxis.title.text": "", "margin.b": 28, "legend.y": -0.25 });
    }
  }
  // Snapshots that arrived since the last draw, drawn together: one extendTraces per chart for
  // all of them (a run's change in between resets the charts first).
  function plot(snaps) {
    let batch = [];
    const flush = () => {
      if (!batch.length) return;
      for (const c of charts) {
        const xs = c.spec.map(() => []), ys = c.spec.map(() => []);
        for (const [t, snap] of batch) {
          c.spec.forEach(([, f], i) => { const v = f(snap); xs[i].push(t); ys[i].push(v === null || v === undefined ? null : v); });
        }
        Plotly.extendTraces(c.el, { x: xs, y: ys }, c.spec.map((_, i) => i), WINDOW_POINTS);
      }
      batch = [];
    };
    for (const snap of snaps) {
      if (snap.run !== run) {
        flush();
        if (run !== null) resetCharts(snap.executor === "sim");
        else if (snap.executor === "sim") resetCharts(true);
        run = snap.run;
        t0 = null;
      }
      if (t0 === null) t0 = snap.time;
      batch.push([+(snap.time - t0).toFixed(2), snap]);
    }
    flush();
  }

  // ---- panels -----------------------------------------------------------------------------------
  const fmt = (v, digits) => (v === null || v === undefined ? "–" : Number(v).toLocaleString(undefined, { maximumFractionDigits: digits }));
  const ENV = {
    weight_mb_held: (v) => fmt(v, 0) + " MB", weight_mb_per_device: (v) => fmt(v, 0) + " MB",
    kv_kb_per_token: (v) => fmt(v, 1) + " KB", kv_mb_per_sequence: (v) => fmt(v, 1) + " MB",
    kv_budget_mb: (v) => fmt(v, 0) + " MB", sequences_fit: (v) => fmt(v, 0),
    copy_gbs: (v) => fmt(v, 1) + " GB/s", decode_step_ms: (v) => fmt(v, 1) + " ms", capacity_tok_s: (v) => fmt(v, 0) + " tok/s",
  };
  function showLab(lab) {
    window.servelab.lab = lab;
    const env = lab.envelope;
    for (const dd of $$("[data-env]")) dd.textContent = env ? ENV[dd.dataset.env](env[dd.dataset.env]) : "waiting for a replica…";
    for (const input of $$(LEVER_INPUTS)) {
      if (document.activeElement === input || input.dataset.pending) continue;
      setInput(input, lab.levers[input.name]);
    }
    const simulated = lab.executor === "sim";
    document.body.classList.toggle("simulated", simulated);
    // The simulated clock runs at `speed` x wall time when the machine keeps up; said when it does not.
    const sim = lab.sim, slow = sim && sim.achieved_speed > 0 && sim.achieved_speed < 0.9 * sim.speed;
    const pace = sim ? " at " + (slow ? sim.achieved_speed + "x of the " + sim.speed + "x asked (this machine is behind)" : sim.speed + "x") : "";
    for (const b of $$(".mode-badge")) { b.hidden = !simulated; b.textContent = lab.badge || ""; }
    const share = $("#share-link");
    if (share) {
      const defaults = JSON.parse(share.dataset.defaults), query = new URLSearchParams();
      for (const [key, value] of Object.entries(lab.levers)) if (key in defaults && defaults[key] !== value) query.set(key, value);
      share.href = location.pathname + (query.toString() ? "?" + query : "");
    }
    if ($("#levers-note")) $("#levers-note").textContent = simulated ? "change the simulated fleet" : "change the live engine";
    const t = lab.traffic;
    if ($("#traffic-state")) {
      $("#traffic-state").textContent = t.running ? "on" : "off";
      $("#traffic-state").className = "small " + (t.running ? "on" : "muted");
      $("#traffic-rate").textContent = fmt(t.rate, 1);
      $("#traffic-sent").textContent = t.sent;
      $("#traffic-refused").textContent = t.refused;
    }
    $("#status-text").textContent = lab.status + (simulated ? pace : "");
    const what = $("#engine-badge .muted");
    // A remote backend names itself ("remote: vLLM at http://..., model X"); static/remote.js does the rest.
    if (what) what.textContent = lab.backend ? "· " + lab.backend : "· " + lab.model + " · " + lab.device + " · " + lab.dtype;
    $("#status-dot").className = "dot " + lab.status;
    // What the engine runs on this machine and why; why it cannot serve, when it cannot.
    const strip = $("#engine-strip"), e = lab.engine;
    if (strip && e) strip.textContent = "engine: " + e.dtype + " (" + e.dtype_reason + "); linear " + e.linear +
      ", attention " + e.attention + ", " + e.threads + " threads · " + e.hardware;
    const problem = $("#problem-banner");
    if (problem && lab.problem !== undefined) {
      problem.hidden = !lab.problem;
      problem.textContent = lab.problem ? "Cannot serve: " + lab.problem : "";
    }
    if ($("#live-status")) {
      $("#live-status").textContent = lab.status;
      $("#live-replicas").textContent = Math.floor(lab.levers.gpu_count / (lab.levers.tensor_parallel * (lab.levers.pipeline_parallel || 1)));
      $("#live-kv").textContent = lab.levers.kv_budget_mb + " MB per device";
    }
  }
  function showShape(shape) {
    if (!shape || !$("#shape-stage")) return;
    $("#shape-stage").textContent = shape.stage + ". " + shape.title;
    $("#shape-stage").dataset.stage = shape.stage;
    const path = $("#shape-path");
    path.innerHTML = "";
    for (const p of shape.path) {
      const li = document.createElement("li");
      li.className = "stage " + p.state;
      li.textContent = p.title;
      path.appendChild(li);
    }
    const reasons = $("#shape-reasons");
    reasons.innerHTML = "";
    for (const r of shape.reasons) {
      const li = document.createElement("li");
      li.textContent = r;
      reasons.appendChild(li);
    }
    for (const dt of $$("#tradeoffs dt")) dt.classList.toggle("current", Number(dt.dataset.stage) <= shape.stage);
  }
  function showBottlenecks(list) {
    const ul = $("#bottleneck-list");
    if (!ul) return;
    ul.innerHTML = "";
    for (const b of list) {
      const li = document.createElement("li");
      li.className = "bn " + b.level;
      const pct = b.ratio === null ? 0 : Math.min(100, Math.round(b.ratio * 100));
      li.innerHTML = '<div class="bn-head"><span></span><b></b></div><div class="bar"><i></i></div><small></small>';
      li.querySelector("span").textContent = b.label;
      li.querySelector("b").textContent = b.ratio === null ? "–" : Math.round(b.ratio * 100) + "%";
      li.querySelector("i").style.width = pct + "%";
      li.querySelector("small").textContent = b.text;
      ul.appendChild(li);
    }
  }

  // ---- the stream -------------------------------------------------------------------------------
  socket.on("hello", (msg) => {
    window.servelab.role = msg.role;
    showLab(msg.lab);
    const badge = $("#role-badge");
    if (msg.role !== "open") {
      badge.hidden = false;
      badge.textContent = msg.role === "instructor" ? "instructor" : "watching";
    }
    if (msg.role === "viewer") {
      document.body.classList.add("viewer");
      for (const el of $$(LEVER_INPUTS + ", #traffic button, [data-scenario], [data-evolution], #apply-preset")) el.disabled = true;
      const status = $("#lever-status");
      if (status) status.textContent = "The instructor holds the levers; you are watching the same engine.";
    } else if (!linkApplied) {
      linkApplied = true;
      applyLink();
    }
  });
  // Every snapshot is kept, but the charts and panels redraw at most every DRAW_EVERY_MS: drawing
  // each of five or six a second cost a page a third of a core, a student's laptop's cost.
  const DRAW_EVERY_MS = 400;
  let undrawn = [], drawTimer = null, lastDraw = 0;
  function draw() {
    drawTimer = null;
    lastDraw = performance.now();
    const snaps = undrawn, snap = snaps[snaps.length - 1];
    undrawn = [];
    if (!snap) return;
    if (charts.length) plot(snaps);
    showLab(snap.lab);
    showBottlenecks(snap.bottlenecks);
    showShape(snap.shape);
    if ($("#live-running")) {
      $("#live-running").textContent = snap.running;
      $("#live-queue").textContent = snap.queue_depth;
      $("#live-tps").textContent = fmt(snap.tokens_per_s, 0);
    }
  }
  socket.on("metrics", (snap) => {
    window.servelab.snapshots += 1;
    undrawn.push(snap);
    if (drawTimer === null) drawTimer = setTimeout(draw, Math.max(0, lastDraw + DRAW_EVERY_MS - performance.now()));
  });
  socket.on("connect_error", (err) => { $("#status-text").textContent = "disconnected: " + err.message; });
  socket.on("disconnect", () => { $("#status-text").textContent = "disconnected"; $("#status-dot").className = "dot failed"; });

  const timeline = $("#timeline");
  const shown = () => new Set($$(".event-filter:checked").map((el) => el.value));
  socket.on("event", (e) => {
    if (!timeline) return;
    const li = document.createElement("li");
    li.className = "ev ev-" + e.kind;
    li.dataset.kind = e.kind;
    li.hidden = e.kind !== "summary" && !shown().has(e.kind);
    // A simulated fleet's events are stamped in simulated seconds.
    const when = e.sim ? "t=" + Number(e.time).toFixed(1) + " s" : new Date(e.time * 1000).toLocaleTimeString();
    li.innerHTML = "<time></time> <em></em> <span></span>";
    li.querySelector("time").textContent = when;
    li.querySelector("em").textContent = e.kind;
    li.querySelector("span").textContent = e.message;
    timeline.prepend(li);
    while (timeline.children.length > 200) timeline.lastChild.remove();
  });
  for (const box of $$(".event-filter")) {
    box.addEventListener("change", () => {
      const keep = shown();
      for (const li of $$("#timeline li")) li.hidden = li.dataset.kind !== "summary" && !keep.has(li.dataset.kind);
    });
  }

  // ---- levers -----------------------------------------------------------------------------------
  // A lever's refusal goes next to the lever it names (a link or a card sets several at once).
  function showLeverError(ack, fallback) {
    for (const el of $$(".lever.invalid")) { el.classList.remove("invalid"); $(".lever-error", el).textContent = ""; }
    if (ack.ok) return;
    const named = ack.error.param && $('.lever[data-key="' + ack.error.param + '"]');
    const label = named || fallback;
    if (!label) return;
    label.classList.add("invalid");
    $(".lever-error", label).textContent = ack.error.message;
  }
  // A shared link: /lab?executor=sim&model=llama-3.1-70b&gpu_count=8 sets those levers on load.
  let linkApplied = false;
  function applyLink() {
    const levers = {};
    for (const [key, raw] of params) {
      if (key === "token") continue;
      const input = $('[name="' + key + '"]');
      const kind = input ? input.dataset.kind : null;
      levers[key] = kind === "bool" ? ["1", "true", "on", "yes"].includes(raw.toLowerCase())
        : kind === "str" || isNaN(Number(raw)) || raw.trim() === "" ? raw : Number(raw);
    }
    if (!Object.keys(levers).length) return;
    socket.emit("set_levers", levers, (ack) => {
      showLeverError(ack, null);
      if (ack.ok) showLab(Object.assign({}, window.servelab.lab, { levers: ack.levers }));
      showResult(ack);
      window.servelab.linkResult = ack;
    });
  }
  function setInput(input, value) {
    if (input.type === "checkbox") input.checked = !!value;
    else input.value = value;
  }
  function readInput(input) {
    const kind = input.dataset.kind;
    if (kind === "bool") return input.checked;
    if (kind === "str") return input.value;
    const n = Number(input.value);
    return input.value.trim() === "" || isNaN(n) ? input.value : n;
  }
  function showResult(ack, where) {
    const el = where || $("#lever-status");
    if (!el) return;
    el.classList.toggle("error", !ack.ok);
    el.textContent = ack.ok ? (ack.rebuild ? "Rebuilding replicas with the new settings…" : "Applied.") : ack.error.message;
  }
  for (const input of $$(LEVER_INPUTS)) {
    input.addEventListener("change", () => {
      const label = input.closest(".lever");
      input.dataset.pending = "1";
      socket.emit("set_levers", { [input.name]: readInput(input) }, (ack) => {
        delete input.dataset.pending;
        showLeverError(ack, label);
        if (!ack.ok && window.servelab.lab) setInput(input, window.servelab.lab.levers[input.name]);
        else if (ack.ok) showLab(Object.assign({}, window.servelab.lab, { levers: ack.levers }));
        showResult(ack);
      });
    });
  }
  const preset = $("#apply-preset");
  if (preset) preset.addEventListener("click", () => socket.emit("set_levers", JSON.parse(preset.dataset.levers), (ack) => showResult(ack)));

  // ---- traffic and scenarios ---------------------------------------------------------------------
  const flood = (msg) => socket.emit("flood", msg, (ack) => showResult(ack, $("#lever-status")));
  if ($("#traffic-start")) $("#traffic-start").addEventListener("click", () => flood({ action: "start" }));
  if ($("#traffic-stop")) $("#traffic-stop").addEventListener("click", () => flood({ action: "stop" }));
  if ($("#flood-button")) {
    $("#flood-button").addEventListener("click", () =>
      flood({ action: "ramp", to: Number($("#ramp-to").value), over_s: Number($("#ramp-s").value) }));
  }
  const step = Number(document.body.dataset.step) || null;
  for (const btn of $$("[data-scenario], [data-evolution]")) {
    btn.addEventListener("click", () => {
      const msg = btn.dataset.evolution !== undefined ? { evolution: Number(btn.dataset.evolution) }
        : { step: step, kind: btn.dataset.kind, index: Number(btn.dataset.scenario) };
      socket.emit("scenario", msg, (ack) => {
        const out = $("#scenario-result");
        out.classList.toggle("error", !ack.ok);
        out.textContent = ack.ok ? ack.title + ": levers set" + (ack.rebuild ? " (rebuilding replicas)" : "") + ". Watch: " + ack.watch
          : ack.error.message;
        if (ack.ok && !window.servelab.lab.traffic.running) flood({ action: "start" });
      });
    });
  }

  // ---- the decision question ---------------------------------------------------------------------
  for (const btn of $$(".option")) {
    btn.addEventListener("click", () => {
      for (const other of $$(".option")) {
        other.classList.toggle("chosen", other === btn);
        other.classList.add(other.dataset.correct === "true" ? "correct" : "wrong");
        other.parentElement.querySelector(".why").hidden = false;
      }
    });
  }
})();
