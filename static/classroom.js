// Classroom mode (web/classroom.py), over the /live socket app.js opened. Two pages:
// class-teach (the instructor: students and their latest TTFT, class flood, poll, predictions)
// and class-join (a student: join with a name, their own requests highlighted in the swimlanes,
// their place in the queue, a prompt box whose requests carry `user` = their id, the class flood
// sent from this browser, poll and prediction answers). Whatever a person typed is set as text.
(function () {
  "use strict";
  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const page = document.body.dataset.page;
  const code = $("#class-head").dataset.code;
  const socket = window.servelab.socket;
  const classroom = (window.servelab.classroom = { state: null, student: null, flood: { sent: 0, done: 0, refused: 0, skipped: 0, inFlight: 0 } });
  const traces = () => window.servelabTraces || null; // static/traces.js, where the swimlanes exist
  const say = (text, error) => { const el = $("#class-status"); el.textContent = text; el.classList.toggle("error", !!error); };
  const ms = (s) => (s === null || s === undefined ? "–" : Math.round(s * 1000) + " ms");

  function emit(event, data) {
    return new Promise((resolve) => socket.emit(event, Object.assign({ code: code }, data || {}), (ack) => {
      if (!ack.ok) say(ack.error.message, true);
      resolve(ack);
    }));
  }

  // Options of a poll or prediction; a student's buttons answer it, the teacher's show counts.
  function drawOptions(list, q, onPick) {
    list.textContent = "";
    q.options.forEach((text, i) => {
      const li = document.createElement("li");
      const button = document.createElement("button");
      button.type = "button";
      button.className = "option";
      button.textContent = text;
      button.disabled = !onPick || q.phase !== "open";
      if (q.mine === i) button.classList.add("chosen");
      if (q.correct !== undefined) button.classList.add(i === q.correct ? "correct" : "wrong");
      if (onPick) button.addEventListener("click", () => onPick(i));
      li.appendChild(button);
      if (q.counts) {
        const count = document.createElement("span");
        count.className = "count";
        count.dataset.index = i;
        count.textContent = " " + q.counts[i];
        li.appendChild(count);
      }
      if (q.whys && q.whys[i]) {
        const why = document.createElement("p");
        why.className = "why";
        why.textContent = q.whys[i];
        li.appendChild(why);
      }
      list.appendChild(li);
    });
  }

  // ---- the instructor --------------------------------------------------------------------------
  const latestTtft = {}; // user -> {arrival, ttft}: kept after the row leaves the traces window
  function teacherRows() {
    const t = traces();
    if (!t) return;
    for (const row of t.rows()) {
      if (!row.user || row.ttft === null || row.ttft === undefined) continue;
      const seen = latestTtft[row.user];
      if (!seen || row.arrival >= seen.arrival) latestTtft[row.user] = { arrival: row.arrival, ttft: row.ttft };
    }
    for (const cell of $$("#student-list [data-ttft]")) cell.textContent = ms((latestTtft[cell.dataset.ttft] || {}).ttft);
  }
  function drawTeacher(state) {
    $("#student-count").textContent = state.student_count;
    const body = $("#student-list");
    body.textContent = "";
    for (const s of state.students) {
      const tr = document.createElement("tr");
      tr.dataset.student = s.id;
      const name = document.createElement("td");
      name.className = "student-name";
      name.textContent = s.name;
      const ttft = document.createElement("td");
      ttft.dataset.ttft = s.id;
      ttft.textContent = ms((latestTtft[s.id] || {}).ttft);
      tr.append(name, ttft);
      body.appendChild(tr);
    }
    const f = state.flood;
    $("#flood-state").textContent = f.running ? "on" : "off";
    $("#flood-status").textContent = f.running
      ? f.per_student.toFixed(2) + " req/s from each of " + state.student_count + " browsers (" + f.total.toFixed(1) + " req/s in all)"
      : "";
    const poll = state.poll;
    $("#poll-phase").textContent = poll ? poll.phase + " · " + poll.answered + " answered" : "closed";
    if (poll) drawOptions($("#poll-options"), poll, null);
    else $("#poll-options").textContent = "";
    const predict = state.predict;
    $("#predict-phase").textContent = predict ? predict.phase + " · " + predict.answered + " guessed" : "closed";
    $("#predict-apply").disabled = !predict || predict.phase !== "open";
    if (predict) drawOptions($("#predict-options"), predict, null);
    teacherRows();
  }
  function teacher() {
    const attach = () => emit("class_teach").then((ack) => { if (ack.ok) show(ack.state); });
    socket.on("connect", attach);
    if (socket.connected) attach();
    const t = traces();
    if (t) t.onUpdate(teacherRows);
    const flood = (action) => emit("class_flood", { action: action, rate: Number($("#flood-rate").value),
      prompt_tokens: Number($("#flood-prompt").value), output_tokens: Number($("#flood-output").value) });
    $("#flood-start").addEventListener("click", () => flood("start"));
    $("#flood-stop").addEventListener("click", () => flood("stop"));
    $("#poll-open").addEventListener("click", () => emit("class_poll", { action: "open" }));
    $("#poll-reveal").addEventListener("click", () => emit("class_poll", { action: "reveal" }));
    $("#poll-close").addEventListener("click", () => emit("class_poll", { action: "close" }));
    for (const b of $$("[data-ask]")) b.addEventListener("click", () => emit("class_predict", { action: "ask", index: Number(b.dataset.ask) }));
    $("#predict-apply").addEventListener("click", () => emit("class_predict", { action: "apply" }));
    $("#class-end").addEventListener("click", () => emit("class_end").then((ack) => { if (ack.ok) say("The class has ended."); }));
  }

  // ---- a student -------------------------------------------------------------------------------
  const stored = () => JSON.parse(sessionStorage.getItem("servelab-class-" + code) || "null");
  async function join(name) {
    const res = await fetch("/join/" + encodeURIComponent(code), {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ name: name }) });
    const body = await res.json();
    if (!res.ok) {
      $("#join-status").textContent = res.status + ": " + body.error.message;
      $("#join-status").classList.add("error");
      return null;
    }
    sessionStorage.setItem("servelab-class-" + code, JSON.stringify(body));
    return body;
  }
  async function attach() {
    const me = stored();
    if (!me) return;
    let ack = await emit("class_attach", { student_id: me.student_id, key: me.key });
    if (!ack.ok && ack.error.code === "forbidden") { // left the list (a reload, a lost connection): join again
      sessionStorage.removeItem("servelab-class-" + code);
      if (await join(me.name)) ack = await emit("class_attach", { student_id: stored().student_id, key: stored().key });
    }
    if (!ack.ok) return;
    classroom.student = ack.student;
    $("#join").hidden = true;
    $("#student-view").hidden = false;
    $("#student-hello").textContent = "You are " + ack.student.name;
    $("#class-status").textContent = "";
    if (traces()) traces().highlightUser(ack.student.id);
    show(ack.state);
    window.dispatchEvent(new Event("resize")); // the charts were drawn while hidden
  }
  // "you are #N in the queue": the first of my requests not yet running, among every request
  // still in the central queue or waiting inside a replica, by arrival.
  function queuePosition() {
    const t = traces(), me = classroom.student;
    if (!t || !me) return;
    const waiting = t.rows().filter((r) => r.outcome === "queued" || r.outcome === "waiting").sort((a, b) => a.arrival - b.arrival);
    const at = waiting.findIndex((r) => r.user === me.id);
    const mine = t.rows().filter((r) => r.user === me.id);
    const el = $("#queue-position");
    el.dataset.position = at < 0 ? "" : String(at + 1);
    el.textContent = at >= 0 ? "you are #" + (at + 1) + " in the queue (" + waiting.length + " waiting)"
      : mine.some((r) => r.outcome === "prefill" || r.outcome === "decode") ? "your request is running"
        : "none of your requests is waiting";
  }
  function drawStudent(state) {
    const f = state.flood;
    $("#flood-state").textContent = f.running ? "on" : "off";
    runFlood(f);
    const poll = state.poll;
    $("#class-poll").hidden = !poll;
    if (poll) {
      $("#poll-question").textContent = poll.question;
      $("#poll-phase").textContent = poll.phase;
      drawOptions($("#poll-options"), poll, (i) => emit("class_answer", { kind: "poll", index: i }));
    }
    const predict = state.predict;
    $("#class-predict").hidden = !predict;
    if (predict) {
      $("#predict-question").textContent = predict.question;
      $("#predict-phase").textContent = predict.phase === "open" ? "guess before the levers move" : "levers applied";
      drawOptions($("#predict-options"), predict, (i) => emit("class_answer", { kind: "predict", index: i }));
    }
  }
  function student() {
    const form = $("#join-form");
    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      if (await join($("#join-name").value)) attach();
    });
    socket.on("connect", attach);
    if (socket.connected) attach();
    const t = traces();
    if (t) t.onUpdate(queuePosition);
    $("#class-prompt-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const out = $("#class-prompt-output"), timing = $("#class-prompt-timing");
      out.textContent = "";
      timing.classList.remove("error");
      timing.textContent = "queued…";
      send($("#class-prompt-text").value, Number($("#class-prompt-max").value), (text) => { out.textContent += text; })
        .then((r) => { timing.textContent = "time to first token " + ms(r.ttft) + " · " + r.chunks + " chunks"; })
        .catch((err) => { timing.classList.add("error"); timing.textContent = err.message; });
    });
  }

  // One streamed request with this student's id as `user`; resolves {ttft (s), chunks}. Text
  // typed by the student goes as a chat message (the model is an instruct model, as in the lab's
  // prompt box); the class flood's random token ids as a plain completion.
  async function send(prompt, maxTokens, onText) {
    const me = classroom.student;
    const start = performance.now();
    const chat = typeof prompt === "string";
    const body = { model: (window.servelab.lab || {}).model, max_tokens: maxTokens, stream: true, user: me.id };
    if (chat) body.messages = [{ role: "user", content: prompt }];
    else body.prompt = prompt;
    const res = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
      method: "POST", headers: window.servelab.apiHeaders, body: JSON.stringify(body),
    });
    if (!res.ok) {
      const body = await res.json();
      throw new Error(res.status + ": " + body.error.message);
    }
    let first = null, chunks = 0;
    await window.servelab.readStream(res, (msg) => {  // static/app.js
      const choice = msg.choices && msg.choices.length ? msg.choices[0] : null;
      const text = choice ? (chat ? (choice.delta || {}).content : choice.text) || "" : "";
      if (text) { if (first === null) first = performance.now(); chunks += 1; if (onText) onText(text); }
    });
    return { ttft: first === null ? null : (first - start) / 1000, chunks: chunks };
  }

  // The class flood from this browser: Poisson arrivals at the per-student rate the server set,
  // each a real stream; past FLOOD_IN_FLIGHT_PER_BROWSER open at once, an arrival is skipped.
  let floodTimer = null, floodSettings = null;
  function runFlood(f) {
    floodSettings = f;
    if (!f.running) { clearTimeout(floodTimer); floodTimer = null; showFlood(); return; }
    if (floodTimer === null) schedule();
  }
  function schedule() {
    const f = floodSettings;
    if (!f || !f.running || f.per_student <= 0) { floodTimer = null; return; }
    const wait = -Math.log(1 - Math.random()) / f.per_student;
    floodTimer = setTimeout(() => { arrive(); schedule(); }, wait * 1000);
  }
  function arrive() {
    const f = floodSettings, counts = classroom.flood;
    if (counts.inFlight >= f.in_flight_per_browser) { counts.skipped += 1; showFlood(); return; }
    const ids = Array.from({ length: f.prompt_tokens }, () => 1000 + Math.floor(Math.random() * 30000));
    counts.sent += 1;
    counts.inFlight += 1;
    showFlood();
    send(ids, f.output_tokens, null)
      .then(() => { counts.done += 1; })
      .catch(() => { counts.refused += 1; })
      .finally(() => { counts.inFlight -= 1; showFlood(); });
  }
  function showFlood() {
    const c = classroom.flood, f = floodSettings;
    if (!f) return;
    $("#flood-status").textContent = (f.running ? "sending " + f.per_student.toFixed(2) + " req/s from this browser · " : "stopped · ") +
      c.sent + " sent, " + c.done + " answered, " + c.refused + " refused, " + c.skipped + " skipped (" + c.inFlight + " open)";
  }

  function show(state) {
    if (state.ended) {
      classroom.state = state;
      if (page === "class-join") runFlood({ running: false });
      say("The class has ended.");
      return;
    }
    classroom.state = state;
    if (page === "class-teach") drawTeacher(state);
    else if (classroom.student) drawStudent(state);
  }
  socket.on("class_state", show);
  // A prediction's levers went on: every page takes its own before now, its after settle_s later.
  socket.on("class_applied", (msg) => {
    const card = msg.card, out = $("#predict-result"), q = (classroom.state || {}).predict;
    if (!q) return;
    const guess = page === "class-join" ? q.mine : null;
    window.servelabPredict.observe(card.metric, card.settle_s, (left) => { out.textContent = "watching " + card.label + ": " + left + " s left…"; },
      (values) => window.servelabPredict.showOutcome(out, { options: q.options, answer: msg.correct }, card.label, guess, values));
  });
  if (page === "class-teach") teacher();
  else student();
})();
