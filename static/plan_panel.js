// Steps 7 and 8: "Plan this traffic at scale" opens the Plan page with this page's traffic as its
// query (the request rate, or the flood's when one runs; the prompt and output lengths; the TTFT target).
(function () {
  "use strict";
  const link = document.getElementById("plan-panel-link");
  if (!link) return;
  link.addEventListener("click", (ev) => {
    const lab = window.servelab && window.servelab.lab;
    if (!lab) return; // no snapshot yet: the page's own defaults
    ev.preventDefault();
    const levers = lab.levers, flood = lab.traffic && lab.traffic.running ? lab.traffic.rate : 0;
    const q = new URLSearchParams({
      model: document.getElementById("plan-panel-model").value,
      rate: Math.max(1, flood || levers.request_rate || 1),
      input_tokens: levers.prompt_tokens, output_tokens: Math.max(2, levers.output_tokens),
      ttft_slo_ms: levers.ttft_target_ms,
    });
    location.href = "/plan?" + q.toString();
  });
})();
