// The failure gallery (/failures): each row's sparkline reads its metric key from every /live
// snapshot, and its toggle sends set_levers {lever: false | true} on app.js's socket (the server
// refuses a watching browser, as it does everywhere). The collective_timeout row's "Stop a rank" /
// "Resume it" send hang_rank {action: "stop" | "resume"} and show the answer in the row; they are
// live-engine only (disabled while the lab runs simulated or remote).
(function () {
  "use strict";
  const POINTS = 120; // 20 s of snapshots at 6 a second
  const socket = window.servelab.socket;
  const rows = Array.from(document.querySelectorAll(".failure-row")).map((tr) => ({
    tr: tr, lever: tr.dataset.lever, metric: tr.dataset.metric, shape: tr.dataset.shape,
    path: tr.querySelector(".sparkline path"), value: tr.querySelector(".spark-value"),
    button: tr.querySelector(".failure-toggle"), state: tr.querySelector(".failure-state"),
    points: [], last: null,
  }));
  window.servelab.failures = rows; // for the browser test: what each sparkline holds
  const hang = { buttons: Array.from(document.querySelectorAll(".hang-rank")), watching: false, live: true, pending: false };
  function showHang() {
    for (const b of hang.buttons) b.disabled = hang.watching || !hang.live || hang.pending;
  }

  // A snapshot's reading for one row: a level as it is, a running count as its rate per second,
  // a list (one per replica) as its largest; null when the snapshot has no such key.
  function reading(row, snap) {
    const raw = snap[row.metric];
    if (raw === undefined || raw === null) return null;
    if (row.shape === "max") return Array.isArray(raw) ? (raw.length ? Math.max.apply(null, raw) : 0) : Number(raw);
    if (row.shape === "rate") {
      const prev = row.last;
      row.last = { t: snap.time, v: Number(raw) };
      if (!prev || snap.time <= prev.t || row.last.v < prev.v) return null; // a new run starts over
      return (row.last.v - prev.v) / (snap.time - prev.t);
    }
    return Number(raw);
  }
  function draw(row) {
    const ys = row.points.filter((v) => v !== null);
    if (!ys.length) { row.path.setAttribute("d", ""); return; }
    const top = Math.max.apply(null, ys.concat([1e-9])), bottom = Math.min(0, Math.min.apply(null, ys));
    const span = top - bottom || 1, step = 120 / (POINTS - 1), offset = POINTS - row.points.length;
    let d = "", pen = false;
    row.points.forEach((v, i) => {
      if (v === null) { pen = false; return; }
      const x = ((offset + i) * step).toFixed(1), y = (27 - ((v - bottom) / span) * 26).toFixed(1);
      d += (pen ? "L" : "M") + x + " " + y + " ";
      pen = true;
    });
    row.path.setAttribute("d", d.trim());
  }
  const fmt = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2));
  function showLever(row, on) {
    row.button.dataset.on = on ? "true" : "false";
    row.button.textContent = on ? "Break" : "Fix";
    row.button.classList.toggle("danger", on);
    row.state.textContent = on ? "on" : "off";
    row.tr.classList.toggle("broken", !on);
  }
  socket.on("metrics", (snap) => {
    window.servelab.lastSnapshot = snap;
    if (hang.buttons.length && hang.live !== (snap.executor === "live")) { hang.live = snap.executor === "live"; showHang(); }
    for (const row of rows) {
      const v = reading(row, snap);
      row.points.push(v);
      if (row.points.length > POINTS) row.points.shift();
      draw(row);
      if (!(row.metric in snap)) row.value.textContent = "no data";
      else if (v !== null) row.value.textContent = fmt(v);
      else if (snap[row.metric] === null) row.value.textContent = "–"; // reported, nothing in the window yet
      if (snap.lab && row.lever in snap.lab.levers && !row.button.dataset.pending) showLever(row, snap.lab.levers[row.lever]);
    }
  });
  socket.on("hello", (msg) => {
    for (const row of rows) row.button.disabled = msg.role === "viewer"; // both ways: a class ends, a watcher leads again
    hang.watching = msg.role === "viewer";
    if (msg.lab) hang.live = msg.lab.executor === "live";
    showHang();
  });
  for (const b of hang.buttons) {
    b.addEventListener("click", () => {
      const status = b.parentElement.querySelector(".hang-status");
      hang.pending = true;
      showHang();
      socket.emit("hang_rank", { action: b.dataset.action }, (ack) => {
        hang.pending = false;
        showHang();
        status.classList.toggle("error", !ack.ok);
        status.classList.toggle("muted", ack.ok);
        status.textContent = ack.ok ? ack.message : ack.error.message;
      });
    });
  }
  for (const row of rows) {
    showLever(row, row.button.dataset.on === "true");
    row.button.addEventListener("click", () => {
      const on = row.button.dataset.on !== "true"; // Break turns the defence off; Fix turns it on
      row.button.dataset.pending = "1";
      socket.emit("set_levers", { [row.lever]: on }, (ack) => {
        delete row.button.dataset.pending;
        const status = document.getElementById("lever-status");
        status.classList.toggle("error", !ack.ok);
        if (ack.ok) {
          showLever(row, ack.levers[row.lever]);
          status.textContent = row.lever + (on ? " on: fixed" : " off: broken") + (ack.rebuild ? " (rebuilding replicas)" : "");
        } else status.textContent = ack.error.message;
      });
    });
  }
})();
