// Predict, observe, explain (web/predictions.py): a card with a prediction asks its question
// before it applies its levers; after settle_s the page shows the guess beside what the metric
// did: before = the mean of the last snapshots before the change, after = the mean of the last
// ones at the end. window.servelabPredict.observe() is shared with the classroom's pages.
(function () {
  "use strict";
  const MEAN_OF = 5; // snapshots averaged for each side
  const HISTORY = 600;
  const history = []; // {time, values: {key: number}} of the most recent snapshots
  const $ = (sel, root) => (root || document).querySelector(sel);

  const socket = window.servelab && window.servelab.socket;
  if (socket) {
    socket.on("metrics", (snap) => {
      const values = {};
      for (const [key, value] of Object.entries(snap)) if (typeof value === "number") values[key] = value;
      history.push({ time: snap.time, values: values });
      if (history.length > HISTORY) history.shift();
    });
  }

  function recentMean(metric) {
    const seen = [];
    for (let i = history.length - 1; i >= 0 && seen.length < MEAN_OF; i--) {
      const v = history[i].values[metric];
      if (typeof v === "number" && isFinite(v)) seen.push(v);
    }
    return seen.length ? seen.reduce((a, b) => a + b, 0) / seen.length : null;
  }

  const fmt = (v) => (v === null ? "no data" : Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toFixed(3));

  // Takes "before" now; calls done({before, after}) once settle_s have passed; tick(left) each second.
  function observe(metric, settleS, tick, done) {
    const before = recentMean(metric);
    const until = Date.now() + settleS * 1000;
    const timer = setInterval(() => {
      const left = Math.max(0, Math.round((until - Date.now()) / 1000));
      if (tick) tick(left);
      if (left > 0) return;
      clearInterval(timer);
      done({ before: before, after: recentMean(metric) });
    }, 1000);
    return before;
  }

  function answerIndex(predict) {
    return typeof predict.answer === "number" ? predict.answer : predict.options.indexOf(predict.answer);
  }

  // Writes "your guess, before, after, the answer" into el, as text.
  function showOutcome(el, predict, label, guess, values) {
    const right = answerIndex(predict);
    el.textContent = "";
    const lines = [
      ["Your guess: ", guess === null || guess === undefined ? "none" : predict.options[guess]],
      ["What happened: " + label + " went from ", fmt(values.before) + " to " + fmt(values.after)],
      ["The answer: ", predict.options[right] + (guess === right ? " (you were right)" : " (not this time)")],
    ];
    for (const [head, text] of lines) {
      const p = document.createElement("p");
      const b = document.createElement("b");
      b.textContent = head;
      p.append(b, document.createTextNode(text));
      el.appendChild(p);
    }
    el.dataset.before = values.before === null ? "" : values.before;
    el.dataset.after = values.after === null ? "" : values.after;
    el.dataset.right = String(guess === right);
    el.classList.add("done");
  }

  window.servelabPredict = { observe: observe, recentMean: recentMean, showOutcome: showOutcome, answerIndex: answerIndex };

  // ---- a step page's cards: ask first, then let app.js apply the levers ---------------------------
  document.addEventListener("click", (ev) => {
    const btn = ev.target.closest && ev.target.closest("button[data-predict]");
    if (!btn || btn.dataset.asked) return;
    ev.stopPropagation(); // app.js's own listener on the button applies the levers: not yet
    ev.preventDefault();
    const predict = JSON.parse(btn.dataset.predict);
    const card = btn.closest(".scenario");
    let box = $(".predict-box", card);
    if (box) box.remove();
    box = document.createElement("div");
    box.className = "predict-box";
    const q = document.createElement("p");
    q.className = "predict-question";
    q.textContent = "Predict first: " + predict.question;
    const list = document.createElement("ol");
    list.className = "class-options";
    const result = document.createElement("div");
    result.className = "predict-result small";
    predict.options.forEach((text, i) => {
      const li = document.createElement("li");
      const option = document.createElement("button");
      option.type = "button";
      option.className = "option predict-option";
      option.textContent = text;
      option.addEventListener("click", () => {
        for (const other of list.querySelectorAll("button")) { other.disabled = true; other.classList.toggle("chosen", other === option); }
        const settle = predict.settle_s || 20;
        const label = btn.dataset.predictLabel || predict.metric;
        observe(predict.metric, settle, (left) => { result.textContent = "Levers applied; watching " + label + ": " + left + " s left…"; },
          (values) => { showOutcome(result, predict, label, i, values); delete btn.dataset.asked; });
        btn.dataset.asked = "1";
        btn.click(); // now app.js's listener runs: the scenario's levers go to the engine
      });
      li.appendChild(option);
      list.appendChild(li);
    });
    box.append(q, list, result);
    card.appendChild(box);
    const traffic = window.servelab && window.servelab.lab && window.servelab.lab.traffic;
    if (traffic && !traffic.running && socket) socket.emit("flood", { action: "start" }, () => {}); // a baseline needs traffic
  }, true);
})();
