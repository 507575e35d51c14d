// Remote mode (issue 17): the lab drives and watches an existing vLLM / SGLang / ServeLab server.
// On app.js's socket: a banner names the remote and what is wrong with it (unreachable, not
// OpenAI-compatible, metrics missing), the levers the remote owns are shown read-only with the
// remote's value where it reveals one, and a chart the remote's metrics cannot fill says so.
// Nothing here runs unless the lab says its executor is "remote".
(function () {
  "use strict";
  const servelab = window.servelab;
  if (!servelab || !servelab.socket) return;
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  // Which snapshot key says whether a chart can fill (static/app.js CHARTS names the charts).
  const CHART_KEYS = {
    queue_depth: ["queue_depth"], running: ["running"], kv_blocks: ["kv_used_blocks"], ttft: ["ttft_p50", "client_ttft_p50"],
    itl: ["itl_p50"], tokens_per_s: ["tokens_per_s"], preempted: ["preempted"], batch_size: ["batch_size"],
    allreduce_ms: ["allreduce_ms", "itl_p50"], scaling: ["scale_changes_total"], stage_idle: ["stage_idle"],
  };
  // The snapshot keys a remote may not expose, in the charts' words.
  const MISSING_WORDS = {
    allreduce_ms: "all-reduce time", stage_idle: "pipeline stages' idle share", max_num_seqs: "batch slots", waiting: "waiting inside replicas (its queue is one number)",
    kv_total_blocks: "KV block count (the KV chart shows percent)", kv_used_blocks: "KV use", queue_depth: "queue depth",
    running: "running requests", ttft_p50: "TTFT", itl_p50: "ITL", e2el_p50: "e2e latency", queue_time_p50: "queue time",
    tokens_per_s: "output tokens/s", preempted: "preemptions", prefix_hit_rate: "prefix-cache hit rate",
    streams_cut_mid_stream: "streams cut by scale-in", scale_changes_total: "scale changes", replicas_ordered_total: "replicas ordered",
  };
  // Panels that model ServeLab's own engine on this machine: nothing to say about a remote.
  const LOCAL_PANELS = ["#envelope", "#shape", "#bottlenecks", "#predict"];
  let styled = false;

  function style() {
    if (styled) return;
    styled = true;
    const css = document.createElement("style");
    css.textContent = ".remote-banner{margin:0 0 16px;border-left:4px solid #3b5bdb}.remote-banner.trouble{border-left-color:#c92a2a;background:#fff5f5}" +
      ".remote-banner ul{margin:4px 0 0 18px;padding:0}.lever.remote-owned{opacity:.75}.remote-value{display:block;color:#5c6370}" +
      ".remote-missing{color:#c92a2a;font-size:11px;margin-left:6px}";
    document.head.appendChild(css);
  }

  function banner() {
    let el = $("#remote-banner");
    if (!el) {
      el = document.createElement("section");
      el.id = "remote-banner";
      el.className = "card remote-banner";
      el.setAttribute("role", "status");
      el.innerHTML = "<b></b> <span class='small'></span><ul class='small problems'></ul><p class='small muted missing'></p>";
      const main = $("main");
      main.insertBefore(el, main.firstChild);
    }
    return el;
  }

  function showRemote(lab, snap) {
    if (!lab || lab.executor !== "remote" || !lab.remote) return;
    style();
    document.body.classList.add("remote");
    const remote = lab.remote, el = banner();
    el.classList.toggle("trouble", remote.problems.length > 0);
    $("b", el).textContent = lab.backend + " · " + lab.status;
    $("span", el).textContent = "The lab sends its traffic to this server through its own clients and proxy; " +
      "the levers marked \u201cremote\u201d belong to the server and are shown read-only.";
    const ul = $(".problems", el);
    ul.innerHTML = "";
    for (const p of remote.problems) {
      const li = document.createElement("li");
      li.textContent = p;
      ul.appendChild(li);
    }
    const missing = snap && snap.missing ? snap.missing : [];
    $(".missing", el).textContent = missing.length ? "Not in the remote's metrics (charted as gaps): " + missing.map((k) => MISSING_WORDS[k] || k).join(", ") : "";
    for (const label of $$(".lever[data-key]")) {
      const key = label.dataset.key, text = remote.readonly[key];
      const input = $("[name]", label);
      if (key === "executor") {
        if (input) input.disabled = true;
        continue;
      }
      if (text === undefined) continue;
      if (input) input.disabled = true;
      label.classList.add("remote-owned");
      const tag = $(".tag", label);
      if (tag) { tag.textContent = "remote"; tag.className = "tag tag-remote"; }
      let note = $(".remote-value", label);
      if (!note) {
        note = document.createElement("small");
        note.className = "remote-value";
        label.insertBefore(note, $(".lever-error", label));
      }
      note.textContent = text.startsWith("the simulated") ? text : "remote: " + text;
    }
    // The failure gallery: a defence that lives in the remote server cannot be broken from here.
    for (const tr of $$(".failure-row[data-lever]")) {
      const button = $(".failure-toggle", tr);
      if (remote.readonly[tr.dataset.lever] === undefined || !button) continue;
      button.disabled = true;
      if (!$(".remote-value", tr)) {
        const note = document.createElement("small");
        note.className = "remote-value";
        note.textContent = "the remote server's own defence: not the lab's to switch";
        button.parentElement.appendChild(note);
      }
    }
    for (const sel of LOCAL_PANELS) { const panel = $(sel); if (panel) panel.hidden = true; }
    if ($("#levers-note")) $("#levers-note").textContent = "the lab's traffic, clients and proxy; the rest belong to the remote";
    if ($("#mode-note")) $("#mode-note").textContent = "Remote backend: no simulated mode here (run python app.py without --backend remote for it).";
    if (snap) markCharts(snap);
  }

  function markCharts(snap) {
    for (const chart of $$(".chart[data-metric]")) {
      const keys = CHART_KEYS[chart.dataset.metric];
      if (!keys) continue;
      const empty = keys.every((k) => (snap.missing || []).includes(k) || snap[k] === undefined);
      const caption = chart.parentElement.querySelector("figcaption");
      let note = caption && $(".remote-missing", caption);
      if (caption && !note) {
        note = document.createElement("span");
        note.className = "remote-missing";
        caption.appendChild(note);
      }
      if (note) note.textContent = empty ? "not in the remote's metrics" : "";
    }
  }

  servelab.socket.on("hello", (msg) => showRemote(msg.lab, null));
  servelab.socket.on("metrics", (snap) => { servelab.lastRemoteSnapshot = snap; showRemote(snap.lab, snap); });
})();
