// The prompt box and step 3's long prompt: the learner's own requests over the OpenAI API, in the
// same queue as the traffic. readStream (an OpenAI SSE response, message by message) is shared with
// classroom.js as window.servelab.readStream. Loaded after app.js, which makes window.servelab.
(function () {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);
  // The page's own API requests: with SERVELAB_API_KEYS set, the server accepts them by this
  // header and the page's session cookie (web/page_session.py); classroom.js uses them too.
  const API_HEADERS = (window.servelab.apiHeaders = { "Content-Type": "application/json", "X-ServeLab-Page": "1" });

  // ---- step 3: one long prompt (random token ids, so the prefix cache cannot answer it) ---------
  const longPrompt = $("#long-prompt");
  if (longPrompt) {
    longPrompt.addEventListener("click", async () => {
      const n = Number(longPrompt.dataset.tokens), timing = $("#prompt-timing");
      const ids = Array.from({ length: n }, () => 1000 + Math.floor(Math.random() * 30000));
      timing.classList.remove("error");
      timing.textContent = "a " + n + "-token prompt is in the queue: watch the ITL chart…";
      const start = performance.now();
      const res = await fetch("/v1/completions", { method: "POST", headers: API_HEADERS,
        body: JSON.stringify({ model: (window.servelab.lab || {}).model, prompt: ids, max_tokens: 8 }) });
      const body = await res.json();
      timing.classList.toggle("error", !res.ok);
      timing.textContent = res.ok ? n + "-token prompt answered in " + Math.round(performance.now() - start) + " ms"
        : res.status + ": " + body.error.message;
    });
  }

  // ---- the learner's own prompt, streamed over the OpenAI API ------------------------------------
  const form = $("#prompt-form");
  // An OpenAI SSE response, message by message (an in-band error throws); classroom.js uses it too.
  async function readStream(res, onMessage) {
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, cut).trim();
        buf = buf.slice(cut + 2);
        if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
        const msg = JSON.parse(line.slice(6));
        if (msg.error) throw new Error(msg.error.message);
        onMessage(msg);
      }
    }
  }
  window.servelab.readStream = readStream;
  if (form) {
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const out = $("#prompt-output"), timing = $("#prompt-timing");
      out.textContent = "";
      timing.classList.remove("error");
      timing.textContent = "queued…";
      const start = performance.now();
      let first = null, tokens = 0, server = null;
      try {
        const res = await fetch("/v1/chat/completions", {
          method: "POST", headers: API_HEADERS,
          body: JSON.stringify({ model: (window.servelab.lab || {}).model, stream: true, max_tokens: Number($("#prompt-max").value),
            messages: [{ role: "user", content: $("#prompt-text").value }] }),
        });
        if (!res.ok) {
          const body = await res.json();
          throw new Error(res.status + ": " + body.error.message + (res.headers.get("Retry-After") ? " (retry after " + res.headers.get("Retry-After") + " s)" : ""));
        }
        await readStream(res, (msg) => {
          if (msg.servelab) server = msg.servelab;
          if (!msg.choices.length) return;
          const text = (msg.choices[0].delta || {}).content || "";
          if (text) {
            if (first === null) first = performance.now();
            tokens += 1;
            out.textContent += text;
          }
          timing.textContent = "time to first token " + (first === null ? "…" : Math.round(first - start) + " ms") + " · " + tokens + " chunks";
        });
        // What this browser measured, then the server's own figures for the same request.
        const ms = (v) => (v === null || v === undefined ? "–" : Math.round(v * 1000) + " ms");
        timing.textContent = "time to first token " + Math.round((first || performance.now()) - start) + " ms (you) · " +
          (server ? ms(server.ttft_s) + " (server; " + ms(server.queue_time_s) + " of it queued)" : "server figure not reported") +
          " · total " + Math.round(performance.now() - start) + " ms";
      } catch (err) {
        timing.classList.add("error");
        timing.textContent = err.message;
      }
    });
  }
})();
