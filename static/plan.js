// The Plan page: posts the query to /whatif/plan (the what-if worker runs it), polls its progress,
// then draws the frontier with Plotly: one curve per family, every simulated point faint, the
// chosen point starred, the TPOT target as a dashed speed. A click opens a point in the lab.
(function () {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const form = $("#plan-form");
  const chart = $("#plan-chart");
  window.servelabPlan = { plan: null };

  function query() {
    const body = {};
    for (const name of ["model"]) body[name] = form.elements[name].value;
    // The traffic is one of the two: a rate, or a closed loop of concurrent users.
    if (form.elements.traffic.value === "concurrency") body.concurrency = parseInt(form.elements.concurrency.value, 10);
    else body.rate = Number(form.elements.rate.value);
    for (const name of ["ttft_slo_ms", "tpot_slo_ms", "input_range_ratio"]) body[name] = Number(form.elements[name].value);
    for (const name of ["input_tokens", "output_tokens", "max_gpus"]) body[name] = parseInt(form.elements[name].value, 10);
    body.devices = $$('input[name="device"]:checked', form).map((i) => i.value);
    body.dtypes = $$('input[name="dtype"]:checked', form).map((i) => i.value);
    body.gpu_hour_usd = {};
    for (const d of body.devices) {
      const price = form.elements["price." + d].value;
      if (price !== "") body.gpu_hour_usd[d] = Number(price);
    }
    body.disaggregation = form.elements.disaggregation.checked;
    return body;
  }

  function shapeText(p) {
    const stages = p.pp > 1 ? " x PP" + p.pp : "";
    const split = p.prefill_replicas ? ", " + p.prefill_replicas + " prefill + " + (p.replicas - p.prefill_replicas) + " decode" : "";
    return p.replicas + " x TP" + p.tp + stages + " (" + p.gpus + " " + p.device + ", " + p.dtype + split + ", " + p.max_num_seqs + " slots)";
  }
  function hover(p) {
    return shapeText(p) + "<br>" + p.output_tok_s_per_gpu.toFixed(0) + " tok/s/GPU · " + p.tok_s_per_user.toFixed(1) + " tok/s/user" +
      "<br>TTFT p50 " + (p.ttft_p50_s * 1000).toFixed(0) + " ms · p99 " + (p.ttft_p99_s * 1000).toFixed(0) + " ms" +
      "<br>TPOT p50 " + (p.tpot_p50_s * 1000).toFixed(1) + " ms · p99 " + (p.tpot_p99_s * 1000).toFixed(1) + " ms" +
      "<br>$" + p.usd_per_m_tokens.toFixed(3) + " per M output tokens · $" + p.usd_per_hour.toFixed(2) + "/h" +
      (p.meets_slo ? "<br>meets both targets" : "") + (p.keeps_up ? "" : "<br>falls behind the traffic");
  }

  function draw(plan) {
    const points = plan.points;
    const families = {};
    for (const p of points) (families[p.family] = families[p.family] || []).push(p);
    const traces = [];
    for (const [family, members] of Object.entries(families)) {
      // The family's own frontier: what no other shape of it beats.
      const kept = members.filter((p) => p.keeps_up).sort((a, b) => b.output_tok_s_per_gpu - a.output_tok_s_per_gpu || b.tok_s_per_user - a.tok_s_per_user);
      const curve = [];
      let best = -Infinity;
      for (const p of kept) if (p.tok_s_per_user > best) { curve.push(p); best = p.tok_s_per_user; }
      traces.push({
        name: family, x: curve.map((p) => p.tok_s_per_user), y: curve.map((p) => p.output_tok_s_per_gpu), mode: "lines+markers",
        text: curve.map(hover), hoverinfo: "text", customdata: curve.map((p) => p.id), meta: "family",
      });
    }
    traces.push({
      name: "every shape simulated", x: points.map((p) => p.tok_s_per_user), y: points.map((p) => p.output_tok_s_per_gpu),
      mode: "markers", marker: { size: 5, opacity: 0.25, color: "#888" }, text: points.map(hover), hoverinfo: "text",
      customdata: points.map((p) => p.id), meta: "all",
    });
    const chosen = plan.cheapest || plan.closest;
    if (chosen) {
      const p = points[chosen.id]; // the search's point, where the chart has it
      traces.push({
        name: plan.feasible ? "cheapest that meets both targets" : "closest to the targets", x: [p.tok_s_per_user],
        y: [p.output_tok_s_per_gpu], mode: "markers", marker: { size: 16, symbol: "star", color: "#d62728" }, text: [hover(p)],
        hoverinfo: "text", customdata: [p.id], meta: "chosen",
      });
    }
    const target = 1000 / plan.query.tpot_slo_ms;
    const layout = {
      margin: { t: 10, r: 10, b: 45, l: 60 }, xaxis: { title: "tokens/s per user (1 / median TPOT)" },
      yaxis: { title: "output tokens/s per GPU" }, legend: { orientation: "h", y: -0.2 }, hovermode: "closest",
      shapes: [{ type: "line", x0: target, x1: target, yref: "paper", y0: 0, y1: 1, line: { dash: "dash", color: "#d62728" } }],
      annotations: [{ x: target, yref: "paper", y: 1, text: "TPOT target", showarrow: false, xanchor: "left" }],
    };
    Plotly.newPlot(chart, traces, layout, { displayModeBar: false, responsive: true });
    chart.on("plotly_click", (ev) => {
      const id = ev.points[0].customdata;
      if (id !== undefined) location.href = points[id].lab;
    });
  }

  function showChoice(plan) {
    $("#plan-choice").hidden = false;
    $("#plan-verdict").textContent = plan.verdict;
    const box = $("#plan-launch");
    box.textContent = "";
    const launch = (plan.cheapest || plan.closest || {}).launch || {};
    if (launch.error) { box.textContent = launch.error; return; }
    for (const server of ["servelab", "vllm", "sglang"]) {
      for (const entry of launch[server] || []) {
        const row = document.createElement("div");
        row.className = "launch-row";
        const title = document.createElement("p");
        title.className = "small";
        title.textContent = server + " · " + entry.role + " · " + entry.servers + " server(s) of " + entry.gpus_each + " GPUs";
        const pre = document.createElement("pre");
        pre.dataset.command = "";
        pre.textContent = entry.command;
        const copy = document.createElement("button");
        copy.className = "btn ghost copy-launch";
        copy.type = "button";
        copy.textContent = "Copy";
        copy.addEventListener("click", () => {
          navigator.clipboard.writeText(entry.command).then(() => { copy.textContent = "Copied"; }, () => { copy.textContent = "Select it"; });
        });
        row.append(title, pre, copy);
        box.append(row);
      }
    }
    if (launch.note) { const n = document.createElement("p"); n.className = "small muted"; n.textContent = launch.note; box.append(n); }
  }

  async function run(ev) {
    ev.preventDefault();
    const status = $("#plan-status"), error = $("#plan-error");
    error.textContent = "";
    const ticket = "plan-" + Math.random().toString(36).slice(2, 12);
    const started = Date.now();
    status.textContent = "searching…";
    $("#plan-run").disabled = true;
    const timer = setInterval(async () => {
      const seconds = Math.round((Date.now() - started) / 1000);
      try {
        const [progress, line] = await Promise.all([
          fetch("/whatif/plan/progress?ticket=" + ticket).then((r) => r.json()),
          fetch("/whatif/queue?ticket=" + ticket).then((r) => r.json()),
        ]);
        const waiting = line.position > 0 ? " · in line for the what-if worker: " + line.position + " run(s) ahead" : "";
        const lines = progress ? " · " + progress.done + " of " + progress.total + " lines searched" : "";
        status.textContent = "searching… " + seconds + " s" + lines + waiting;
      } catch (err) { /* the next tick tries again */ }
    }, 1000);
    try {
      const headers = { "Content-Type": "application/json", "X-ServeLab-Token": localStorage.getItem("servelab-token") || "" };
      const res = await fetch("/whatif/plan?ticket=" + ticket, { method: "POST", headers: headers, body: JSON.stringify(query()) });
      const body = await res.json();
      if (!res.ok) throw Object.assign(new Error(body.error.message), { param: body.error.param });
      window.servelabPlan.plan = body;
      const s = body.search;
      status.textContent = s.evaluated + " shapes simulated in " + s.wall_s.toFixed(1) + " s";
      draw(body);
      showChoice(body);
      if (measureCard) measureCard.hidden = false;
    } catch (err) {
      status.textContent = "failed";
      error.textContent = (err.param ? err.param + ": " : "") + err.message;
      error.className = "small error";
    } finally {
      clearInterval(timer);
      $("#plan-run").disabled = false;
    }
  }
  // ---- measure the plan (the remote backend): the lab's clients send the plan's traffic to the
  // remote fleet, and its own figures from the stream land beside the prediction.
  const measureCard = $("#plan-measure");
  let socket = null, latest = null;
  if (measureCard) {
    socket = io("/live", { auth: { token: localStorage.getItem("servelab-token") || "" } });
    socket.on("metrics", (m) => { latest = m; });
    $("#plan-measure-run").addEventListener("click", measure);
  }
  const emit = (event, data) => new Promise((done) => socket.emit(event, data, done));
  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
  function errorPct(measured, predicted) {
    return measured && predicted ? ((predicted - measured) / measured * 100).toFixed(0) + "%" : "–";
  }
  async function measure() {
    const plan = window.servelabPlan.plan, chosen = plan.cheapest || plan.closest, q = plan.query;
    // The lab's clients send at a rate: a closed loop's is the rate the chosen shape's run achieved.
    const rate = q.rate != null ? q.rate : Math.round(chosen.request_s * 1000) / 1000;
    // The remote's rates are over the metrics' window: it must lie inside the traffic before they count.
    const windowS = Number(measureCard.dataset.windowS);
    const status = $("#plan-measure-status"), seconds = Math.max(windowS + 5, Number($("#plan-measure-s").value) || 60);
    $("#plan-measure-run").disabled = true;
    try {
      let ack = await emit("set_levers", { request_rate: rate, prompt_tokens: q.input_tokens, output_tokens: q.output_tokens });
      if (!ack.ok) throw new Error(ack.error.message);
      ack = await emit("flood", { action: "start" });
      if (!ack.ok) throw new Error(ack.error.message);
      const rates = []; // tokens/s each second once the window is all traffic (one reading jumps with Poisson arrivals)
      for (let left = seconds; left > 0; left--) {
        const t = latest && latest.lab ? latest.lab.traffic : null;
        status.textContent = "sending " + rate + " req/s to the remote fleet: " + left + " s left" + (t ? " · " + t.sent + " sent" : "");
        await sleep(1000);
        if (seconds - left >= windowS && latest && latest.tokens_per_s != null) rates.push(latest.tokens_per_s);
      }
      const m = latest || {};
      await emit("flood", { action: "stop" });
      const mean = rates.length ? rates.reduce((a, b) => a + b, 0) / rates.length : m.tokens_per_s;
      const measured = { ttft_p50_s: m.ttft_p50, ttft_p99_s: m.ttft_p99, tpot_p50_s: m.itl_p50, tpot_p99_s: m.itl_p99,
                         output_tok_s: mean };
      if (!measured.tpot_p50_s || !measured.output_tok_s) throw new Error("the remote's metrics had no TPOT or tokens/s for the window");
      window.servelabPlan.measured = measured;
      Plotly.addTraces(chart, {
        name: "measured on the remote fleet", x: [1 / measured.tpot_p50_s], y: [measured.output_tok_s / chosen.gpus],
        mode: "markers", marker: { size: 14, symbol: "diamond", color: "#2ca02c" }, hoverinfo: "text",
        text: ["measured: TTFT p50 " + (measured.ttft_p50_s * 1000).toFixed(0) + " ms · TPOT p50 " +
               (measured.tpot_p50_s * 1000).toFixed(1) + " ms · " + measured.output_tok_s.toFixed(1) + " tok/s"],
      });
      const rows = [["", "predicted", "measured", "prediction off by"]];
      for (const [label, key, scale, unit] of [["TTFT p50", "ttft_p50_s", 1000, " ms"], ["TTFT p99", "ttft_p99_s", 1000, " ms"],
        ["TPOT p50", "tpot_p50_s", 1000, " ms"], ["TPOT p99", "tpot_p99_s", 1000, " ms"], ["output tok/s", "output_tok_s", 1, ""]]) {
        const p = chosen[key], v = measured[key];
        rows.push([label, p == null ? "–" : (p * scale).toFixed(1) + unit, v == null ? "–" : (v * scale).toFixed(1) + unit, errorPct(v, p)]);
      }
      const table = $("#plan-measure-table");
      table.textContent = "";
      for (const cells of rows) {
        const tr = document.createElement("tr");
        for (const c of cells) { const td = document.createElement("td"); td.textContent = c; tr.append(td); }
        table.append(tr);
      }
      table.hidden = false;
      status.textContent = "measured over " + seconds + " s (the remote's own figures, the lab's latest window)";
    } catch (err) {
      status.textContent = "could not measure: " + err.message;
      if (socket) socket.emit("flood", { action: "stop" }, () => {});
    } finally {
      $("#plan-measure-run").disabled = false;
    }
  }

  function showTraffic() {
    for (const label of $$("[data-traffic]", form)) label.hidden = label.dataset.traffic !== form.elements.traffic.value;
  }
  form.elements.traffic.addEventListener("change", showTraffic);
  // A link's query (/plan?model=...&rate=..., as steps 7 and 8 send it; or &concurrency=N) fills the form's fields.
  for (const [name, value] of new URLSearchParams(location.search)) {
    const field = form.elements[name];
    if (field && field.tagName) field.value = value;
    if (name === "concurrency" || name === "rate") form.elements.traffic.value = name;
  }
  showTraffic();
  form.addEventListener("submit", run);
})();
