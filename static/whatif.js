// The what-if panels (templates/_whatif.html) over web/whatif.py: A/B side by side on the same
// seeded traffic, predict-then-run on the live charts, and a lesson's at-scale experiments.
// It reads window.servelab (app.js) and listens to the same /live socket; it adds traces to the
// live charts (#chart-<metric>) and draws its own A/B charts. Everything here is simulated.
(function () {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const COLORS = { a: "#e8590c", b: "#0ca678" };
  const LAYOUT = {
    height: 180, margin: { l: 44, r: 8, t: 6, b: 28 }, showlegend: true, legend: { orientation: "h", y: -0.3, font: { size: 10 } },
    xaxis: { ticksuffix: " s", gridcolor: "#eef0f4" }, yaxis: { rangemode: "tozero", gridcolor: "#eef0f4" },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "rgba(0,0,0,0)", font: { family: "inherit", size: 11 },
  };
  const fmt = (v, digits) => (v === null || v === undefined ? "–" : Number(v).toLocaleString(undefined, { maximumFractionDigits: digits }));
  const ROWS = [ // the A/B table: [key, label, format, better when higher (null: neither)]
    ["output_tok_s", "Output tokens/s", (v) => fmt(v, 0), true],
    ["ttft_p50_s", "TTFT p50", (v) => fmt(v, 3) + " s", false], ["ttft_p99_s", "TTFT p99", (v) => fmt(v, 3) + " s", false],
    ["tpot_p50_s", "TPOT p50", (v) => fmt(v * 1000, 1) + " ms", false], ["tpot_p99_s", "TPOT p99", (v) => fmt(v * 1000, 1) + " ms", false],
    ["itl_p99_s", "ITL p99 (the longest stalls)", (v) => fmt(v * 1000, 1) + " ms", false],
    ["goodput_req_s", "Goodput at the TTFT target", (v) => fmt(v, 2) + " req/s", true],
    ["goodput_share", "… share of requests", (v) => fmt(v * 100, 1) + "%", true],
    ["gpus_used", "GPUs used", (v) => fmt(v, 0), null], ["gpu_hours", "GPU-hours", (v) => fmt(v, 3), false],
    ["cost_per_mtok_usd", "Cost per million output tokens", (v) => "$" + fmt(v, 3), false],
    ["completed", "Completed requests", (v) => fmt(v, 0), true], ["refused", "Refused or expired", (v) => fmt(v, 0), false],
    ["prefix_hit_rate", "Prefix-cache hit rate (prompt tokens)", (v) => fmt(v * 100, 1) + "%", true],
    ["spec_tokens_per_step", "Speculating: tokens per verify step", (v) => fmt(v, 2), true],
    ["spec_acceptance", "Speculating: guesses kept", (v) => fmt(v * 100, 1) + "%", true],
    ["simulated_s", "Simulated seconds", (v) => fmt(v, 1), null],
  ];
  // The keys the A/B form shows at once; the rest sit under "more levers".
  const COMMON = ["request_rate", "prompt_tokens", "output_tokens", "num_requests", "ttft_target_ms", "model", "device",
    "gpu_count", "tensor_parallel", "weight_dtype", "prefill_gpus", "decode_gpus", "max_num_seqs", "paged", "gpu_hour_usd"];
  const NAMES = { traffic: "t", a: "a", b: "b" }; // a shared link's key prefixes (web/whatif.py)

  // Runs go to the server's what-if worker one at a time (web/whatif_worker.py): while this one
  // waits, `status` says its place in line. In a class only the instructor may start one: the
  // request presents the token this browser keeps (app.js), as the socket does.
  async function post(url, body, status) {
    const ticket = Math.random().toString(36).slice(2) + Date.now().toString(36);
    const headers = { "Content-Type": "application/json", "X-ServeLab-Token": localStorage.getItem("servelab-token") || "" };
    const running = status ? status.textContent : "";
    const poll = status ? setInterval(async () => {
      try {
        const line = await (await fetch("/whatif/queue?ticket=" + ticket)).json();
        if (line.position > 0) status.textContent = "in line for the what-if worker: " + line.position + (line.position === 1 ? " run" : " runs") + " ahead of yours…";
        else if (line.position === 0) status.textContent = running;
      } catch (err) { /* the answer itself says what went wrong */ }
    }, 700) : null;
    try {
      const res = await fetch(url + (url.includes("?") ? "&" : "?") + "ticket=" + ticket, { method: "POST", headers: headers, body: JSON.stringify(body || {}) });
      const data = await res.json();
      if (!res.ok) throw Object.assign(new Error(data.error.message), { param: data.error.param });
      return data;
    } finally {
      if (poll) clearInterval(poll);
    }
  }

  // ---- results: table, badges, overlaid charts ---------------------------------------------------
  function series(rows, metric) {
    const t = rows.map((r) => r.t);
    if (metric === "kv") return [[t, rows.map((r) => (r.kv_total_blocks ? (100 * r.kv_used_blocks) / r.kv_total_blocks : null))]];
    if (metric === "ttft") return [[t, rows.map((r) => r.ttft_p99_s)], [t, rows.map((r) => r.ttft_p50_s), "dot"]];
    if (metric === "tokens_per_s") return [[t, rows.map((r) => r.output_tok_s)]];
    return [[t, rows.map((r) => r[metric])]];
  }
  function render(box, result) {
    box.hidden = false;
    for (const side of ["a", "b"]) {
      $(`.sim-badge[data-side=${side}]`, box).textContent = side.toUpperCase() + " · " + result[side].label + " · " + result[side].badge;
      $(`[data-head=${side}]`, box).textContent = side.toUpperCase() + ": " + result[side].label;
      $(`[data-command=${side}]`, box).textContent = result[side].command;
    }
    $("[data-digest]", box).textContent = "Both sides replayed the same " + result.traffic.requests + " requests (workload " + result.traffic.workload_digest + ").";
    const body = $("tbody", box);
    body.innerHTML = "";
    for (const [key, label, show, higher] of ROWS) {
      const a = result.a.row[key], b = result.b.row[key];
      const tr = document.createElement("tr");
      tr.dataset.key = key;
      let delta = "";
      if (typeof a === "number" && typeof b === "number" && a !== 0) {
        const d = (b / a - 1) * 100;
        delta = (d >= 0 ? "+" : "") + fmt(d, 1) + "%" + (Math.abs(d) < 0.5 || higher === null ? "" : (d > 0) === higher ? " better" : " worse");
      }
      for (const text of [label, show(a), show(b), delta]) {
        const td = document.createElement("td");
        td.textContent = text;
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
    for (const el of $$(".ab-chart", box)) {
      const traces = [];
      for (const side of ["a", "b"]) {
        for (const [x, y, dash] of series(result[side].timeline, el.dataset.abMetric)) {
          traces.push({ x: x, y: y, mode: "lines", name: side.toUpperCase() + (dash ? " p50" : ""), line: { color: COLORS[side], width: 2, dash: dash || "solid" } });
        }
      }
      Plotly.react(el, traces, LAYOUT, { displayModeBar: false, responsive: true });
    }
    box.dataset.filled = "1";
  }

  // ---- A/B form ---------------------------------------------------------------------------------
  const form = $("#ab-form");
  let meta = null;
  function fieldInput(group, f, defaults) {
    const label = document.createElement("label");
    label.textContent = f.key;
    let input;
    if (f.kind === "str" || f.kind === "bool") {
      input = document.createElement("select");
      const choices = f.kind === "bool" ? ["true", "false"] : f.choices;
      input.appendChild(new Option("(default)", ""));
      for (const c of choices) input.appendChild(new Option(c, c));
    } else {
      input = document.createElement("input");
      input.type = "number";
      input.step = "any";
      if (f.min !== null) input.min = f.min;
      if (f.max !== null) input.max = f.max;
    }
    input.name = NAMES[group] + "." + f.key;
    const shown = defaults[f.key];
    if (shown !== undefined && input.tagName === "INPUT") input.placeholder = shown;
    const err = document.createElement("span");
    err.className = "field-error";
    label.append(input, err);
    return label;
  }
  function readForm() {
    const body = { traffic: {}, a: {}, b: {} };
    const preset = $("#ab-preset").value;
    if (preset) body.preset = preset;
    for (const input of $$("[name]", form)) {
      if (input.value === "") continue;
      const [prefix, key] = input.name.split(".");
      const group = prefix === "t" ? "traffic" : prefix;
      body[group][key] = input.value; // text, typed by the server (engine/sim/compare.py)
    }
    // The user's price, as set on the lab's gpu_hour_usd lever, unless a side names its own; it
    // goes into the request (and so the shared link) only when it is not the default.
    const lab = window.servelab && window.servelab.lab;
    const price = lab && lab.levers ? lab.levers[meta.price.key] : undefined;
    for (const side of ["a", "b"]) {
      if (price !== undefined && price !== meta.defaults.side[meta.price.key] && !(meta.price.key in body[side])) {
        body[side][meta.price.key] = String(price);
      }
    }
    return body;
  }
  function fillForm(values) {
    for (const input of $$("[name]", form)) {
      const [prefix, key] = input.name.split(".");
      const group = prefix === "t" ? "traffic" : prefix;
      const v = (values[group] || {})[key];
      input.value = v === undefined ? "" : String(v);
    }
  }
  function link(body) {
    const q = new URLSearchParams();
    q.set("ab", body.preset || "1");
    for (const group of ["traffic", "a", "b"]) for (const [k, v] of Object.entries(body[group])) q.set(NAMES[group] + "." + k, v);
    return location.pathname + "?" + q.toString();
  }
  async function runAB() {
    const status = $("#ab-status");
    for (const label of $$(".ab-fields label", form)) { label.classList.remove("invalid"); $(".field-error", label).textContent = ""; }
    const body = readForm();
    status.classList.remove("error");
    status.textContent = "simulating A, then B…";
    $("#ab-run").disabled = true;
    try {
      const result = await post("/whatif/ab", body, status);
      render($("#ab-results"), result);
      const href = link(body);
      history.replaceState(null, "", href);
      $("#ab-link").href = href;
      $("#ab-link").hidden = false;
      status.textContent = "Done: " + result.traffic.requests + " requests on each side.";
    } catch (err) {
      status.classList.add("error");
      status.textContent = (err.param ? err.param + ": " : "") + err.message;
      const [group, key] = (err.param || "").split(".");
      const input = group && $(`[name="${NAMES[group] || group}.${key}"]`, form);
      if (input) {
        input.closest("label").classList.add("invalid");
        $(".field-error", input.closest("label")).textContent = err.message;
      }
    } finally {
      $("#ab-run").disabled = false;
    }
  }
  async function setUpAB() {
    meta = await (await fetch("/whatif/presets")).json();
    const select = $("#ab-preset");
    for (const [key, preset] of Object.entries(meta.presets)) select.appendChild(new Option(preset.title, key));
    const price = Object.assign({}, meta.side[0], { key: meta.price.key, kind: "float", min: 0, max: 1000, choices: [] });
    for (const group of ["traffic", "a", "b"]) {
      const box = $(`fieldset[data-group=${group}] .ab-fields`, form);
      const fields = group === "traffic" ? meta.traffic : [...meta.side, price];
      const defaults = group === "traffic" ? meta.defaults.traffic : meta.defaults.side;
      const more = document.createElement("details");
      more.innerHTML = "<summary>more levers</summary>";
      const moreBox = document.createElement("div");
      moreBox.className = "ab-fields";
      more.appendChild(moreBox);
      for (const f of fields) (COMMON.includes(f.key) ? box : moreBox).appendChild(fieldInput(group, f, defaults));
      box.after(more);
    }
    select.addEventListener("change", () => {
      const preset = meta.presets[select.value];
      fillForm(preset ? { traffic: preset.traffic, a: strip(preset.a), b: strip(preset.b) } : {});
    });
    form.addEventListener("submit", (ev) => { ev.preventDefault(); runAB(); });
    // A shared link: ?ab=PRESET|1&t.KEY=..&a.KEY=..&b.KEY=.. fills the form and runs it.
    const q = new URLSearchParams(location.search);
    if (q.has("ab")) {
      const preset = meta.presets[q.get("ab")];
      if (preset) select.value = q.get("ab");
      const values = preset ? { traffic: Object.assign({}, preset.traffic), a: strip(preset.a), b: strip(preset.b) } : { traffic: {}, a: {}, b: {} };
      for (const [name, v] of q.entries()) {
        const [prefix, key] = name.split(".");
        const group = { t: "traffic", a: "a", b: "b" }[prefix];
        if (group && key) values[group][key] = v;
      }
      fillForm(values);
      runAB();
    }
  }
  const strip = (side) => Object.fromEntries(Object.entries(side || {}).filter(([k]) => k !== "label"));
  if (form) setUpAB();

  // ---- a lesson's at-scale experiments ----------------------------------------------------------
  const atScale = $("#at-scale");
  for (const btn of $$("[data-at-scale]")) {
    btn.addEventListener("click", async () => {
      const status = $("#at-scale-status");
      status.classList.remove("error");
      status.textContent = "simulating A, then B…";
      try {
        const result = await post(`/whatif/lesson/${atScale.dataset.step}?index=${btn.dataset.atScale}`, null, status);
        render($("#at-scale-results"), result);
        status.textContent = result.title + ": " + result.watch;
        btn.dispatchEvent(new CustomEvent("servelab-result")); // a prediction asked first answers now (predict.js)
      } catch (err) {
        status.classList.add("error");
        status.textContent = err.message;
      }
    });
  }

  // ---- predict, then run ------------------------------------------------------------------------
  // Predicted series drawn dashed on the live charts, from the moment the traffic is started; the
  // live measurement then draws over them, and the gap at the same second is shown as a number.
  const PREDICTED = { // live chart -> [predicted column, trace name, colour of the live trace it shadows]
    ttft: [["ttft_p50", "predicted p50", "#3b5bdb"], ["ttft_p99", "predicted p99", "#e8590c"]],
    tokens_per_s: [["tokens_per_s", "predicted tok/s", "#3b5bdb"]],
    queue_depth: [["queue_depth", "predicted queue", "#3b5bdb"]],
    running: [["running", "predicted running", "#3b5bdb"]],
    kv_blocks: [["kv_used_blocks", "predicted used", "#3b5bdb"]],
  };
  const socket = window.servelab && window.servelab.socket;
  let t0 = null, lastTime = null, prediction = null;
  if (socket) {
    socket.on("metrics", (snap) => {
      if (t0 === null) t0 = snap.time;
      lastTime = snap.time;
      if (prediction) showGap(snap);
    });
  }
  function nearest(series, t) {
    let best = null;
    for (const row of series) if (best === null || Math.abs(row.t - t) < Math.abs(best.t - t)) best = row;
    return best;
  }
  function gapText(label, live, predicted, unit, digits) {
    if (live === null || live === undefined || predicted === null || predicted === undefined || predicted === 0) return null;
    const d = (live / predicted - 1) * 100;
    return `measured ${label} ${fmt(live, digits)}${unit} vs predicted ${fmt(predicted, digits)}${unit}: ${d >= 0 ? "+" : ""}${fmt(d, 0)}%`;
  }
  function showGap(snap) {
    const elapsed = snap.time - prediction.start;
    if (elapsed < 2 || elapsed > prediction.horizon_s + 1) return; // the first seconds hold too few requests
    const row = nearest(prediction.series, elapsed);
    const parts = [gapText("TTFT p50", snap.ttft_p50, row.ttft_p50, " s", 3), gapText("tokens/s", snap.tokens_per_s, row.tokens_per_s, "", 1)]
      .filter((p) => p !== null);
    if (!parts.length) return;
    const el = $("#predict-gap");
    el.hidden = false;
    el.textContent = `at ${fmt(elapsed, 0)} s: ` + parts.join(" · ");
    el.dataset.elapsed = elapsed;
  }
  async function predictThenRun() {
    const status = $("#predict-status");
    status.classList.remove("error");
    status.textContent = "the simulator is predicting the charts at these levers…";
    try {
      const result = await post("/whatif/predict", null, status);
      const start = lastTime === null ? Date.now() / 1000 : lastTime;
      const offset = t0 === null ? 0 : start - t0; // the live charts' x: seconds since their first snapshot
      prediction = Object.assign(result, { start: start });
      for (const [metric, columns] of Object.entries(PREDICTED)) {
        const el = document.getElementById("chart-" + metric);
        if (!el || !el.data) continue;
        const old = el.data.map((tr, i) => (tr.meta === "predicted" ? i : -1)).filter((i) => i >= 0);
        if (old.length) Plotly.deleteTraces(el, old);
        Plotly.addTraces(el, columns.map(([col, name, color]) => ({
          x: result.series.map((r) => +(offset + r.t).toFixed(2)), y: result.series.map((r) => r[col]),
          name: name, mode: "lines", meta: "predicted", line: { dash: "dash", width: 1.5, color: color },
        })));
      }
      document.body.dataset.predicted = "1";
      status.textContent = `${result.badge}: ${result.requests} requests over ${fmt(result.horizon_s, 0)} s (dashed). Starting the traffic…`;
      socket.emit("flood", { action: "start" }, (ack) => {
        status.classList.toggle("error", !ack.ok);
        status.textContent = ack.ok ? `${result.badge} (dashed); the live traffic is on. Command: ${result.command}` : ack.error.message;
      });
    } catch (err) {
      status.classList.add("error");
      status.textContent = (err.param ? err.param + ": " : "") + err.message;
    }
  }
  if ($("#predict-run")) $("#predict-run").addEventListener("click", predictThenRun);
})();
