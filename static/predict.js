// Predict, observe, explain (web/predictions.py): a card with a prediction asks its question
// before it applies its levers; after settle_s the page shows the guess beside what the metric
// did: before = the mean of the last snapshots before the change, after = the mean of the last
// ones at the end. A choice is one of the options; a number (the predict has a tolerance) is typed
// in the metric's unit and is right within +-tolerance of the measurement. An at-scale experiment
// (no metric) asks its choice before it runs and answers when its result is drawn.
// window.servelabPredict.observe() is shared with the classroom's pages.
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

  function writeLines(el, lines) {
    el.textContent = "";
    for (const [head, text] of lines) {
      const p = document.createElement("p");
      const b = document.createElement("b");
      b.textContent = head;
      p.append(b, document.createTextNode(text));
      el.appendChild(p);
    }
    el.classList.add("done");
  }

  // Writes "your guess, before, after, the answer" into el, as text.
  function showOutcome(el, predict, label, guess, values) {
    const right = answerIndex(predict);
    writeLines(el, [
      ["Your guess: ", guess === null || guess === undefined ? "none" : predict.options[guess]],
      ["What happened: " + label + " went from ", fmt(values.before) + " to " + fmt(values.after)],
      ["The answer: ", predict.options[right] + (guess === right ? " (you were right)" : " (not this time)")],
    ]);
    el.dataset.before = values.before === null ? "" : values.before;
    el.dataset.after = values.after === null ? "" : values.after;
    el.dataset.right = String(guess === right);
  }

  // A number: right when within +-tolerance (relative) of what was measured at the end.
  function showNumber(el, predict, label, guess, values) {
    const measured = values.after;
    const tol = predict.tolerance;
    const within = measured !== null && Math.abs(guess - measured) <= tol * Math.abs(measured);
    const range = measured === null ? "" : " (right within ±" + Math.round(tol * 100) + "%: " +
      fmt(measured * (1 - tol)) + " to " + fmt(measured * (1 + tol)) + ")";
    writeLines(el, [
      ["Your guess: ", fmt(guess) + " (" + label + ")"],
      ["What happened: " + label + " went from ", fmt(values.before) + " to " + fmt(measured) + range],
      ["Scored: ", measured === null ? "no measurement came (is traffic running?)" : within ? "within the tolerance (you were right)" : "outside the tolerance (not this time)"],
    ]);
    el.dataset.before = values.before === null ? "" : values.before;
    el.dataset.after = measured === null ? "" : measured;
    el.dataset.right = String(within);
  }

  window.servelabPredict = { observe: observe, recentMean: recentMean, showOutcome: showOutcome, showNumber: showNumber, answerIndex: answerIndex };

  function askBox(btn, predict) {
    const card = btn.closest(".scenario");
    let box = $(".predict-box", card);
    if (box) box.remove();
    box = document.createElement("div");
    box.className = "predict-box";
    const q = document.createElement("p");
    q.className = "predict-question";
    q.textContent = "Predict first: " + predict.question;
    const result = document.createElement("div");
    result.className = "predict-result small";
    box.append(q);
    card.appendChild(box);
    return { box: box, result: result };
  }

  // Applies the card (a second click, which app.js or whatif.js then takes) and scores the guess.
  function run(btn, predict, result, guess, numeric) {
    btn.dataset.asked = "1";
    if (!predict.metric) { // an at-scale experiment: the answer comes with its result
      result.textContent = "Running the simulation…";
      btn.addEventListener("servelab-result", () => {
        const right = answerIndex(predict);
        writeLines(result, [["Your guess: ", predict.options[guess]],
          ["The answer: ", predict.options[right] + (guess === right ? " (you were right)" : " (not this time)") + ": see the table"]]);
        result.dataset.right = String(guess === right);
        delete btn.dataset.asked;
      }, { once: true });
      btn.click();
      return;
    }
    const settle = predict.settle_s || 20;
    const label = btn.dataset.predictLabel || predict.metric;
    observe(predict.metric, settle, (left) => { result.textContent = "Levers applied; watching " + label + ": " + left + " s left…"; },
      (values) => { (numeric ? showNumber : showOutcome)(result, predict, label, guess, values); delete btn.dataset.asked; });
    btn.click(); // now app.js's listener runs: the scenario's levers go to the engine
  }

  // ---- a step page's cards: ask first, then let app.js (or whatif.js) apply the levers -------------
  document.addEventListener("click", (ev) => {
    const btn = ev.target.closest && ev.target.closest("button[data-predict]");
    if (!btn || btn.dataset.asked) return;
    ev.stopPropagation(); // app.js's own listener on the button applies the levers: not yet
    ev.preventDefault();
    const predict = JSON.parse(btn.dataset.predict);
    const numeric = typeof predict.tolerance === "number";
    const { box, result } = askBox(btn, predict);
    if (numeric) {
      const form = document.createElement("form");
      form.className = "predict-number";
      const input = document.createElement("input");
      input.type = "number"; input.step = "any"; input.min = "0"; input.required = true;
      input.setAttribute("aria-label", btn.dataset.predictLabel || predict.metric);
      const unit = document.createElement("span");
      unit.className = "muted small";
      unit.textContent = " " + (btn.dataset.predictLabel || predict.metric) + " ";
      const go = document.createElement("button");
      go.type = "submit"; go.className = "btn small-btn"; go.textContent = "Lock in my guess";
      form.append(input, unit, go);
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        const guess = Number(input.value);
        if (!isFinite(guess)) return;
        input.disabled = true; go.disabled = true;
        run(btn, predict, result, guess, true);
      });
      box.append(form, result);
    } else {
      const list = document.createElement("ol");
      list.className = "class-options";
      predict.options.forEach((text, i) => {
        const li = document.createElement("li");
        const option = document.createElement("button");
        option.type = "button";
        option.className = "option predict-option";
        option.textContent = text;
        option.addEventListener("click", () => {
          for (const other of list.querySelectorAll("button")) { other.disabled = true; other.classList.toggle("chosen", other === option); }
          run(btn, predict, result, i, false);
        });
        li.appendChild(option);
        list.appendChild(li);
      });
      box.append(list, result);
    }
    const traffic = window.servelab && window.servelab.lab && window.servelab.lab.traffic;
    if (predict.metric && traffic && !traffic.running && socket) socket.emit("flood", { action: "start" }, () => {}); // a baseline needs traffic
  }, true);
})();
