// planrun ui: the runs list (newest first, paged), refreshed every few seconds.
"use strict";
(function () {
  const main = document.getElementById("main");
  let data = JSON.parse(document.getElementById("data").textContent);

  function esc(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g,
      (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function when(epoch) { return epoch == null ? "-" : new Date(epoch * 1000).toLocaleString(); }
  function secs(s) {
    if (s == null) return "-";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }
  function counts(c) {
    return Object.keys(c).map((k) => `<span class="badge s-${esc(k)}">${esc(k)} ${c[k]}</span>`)
      .join(" ");
  }
  function render() {
    const rows = data.runs.map((r) => `<tr data-run="${esc(r.id)}">
      <td><a href="/runs/${encodeURIComponent(r.id)}" class="mono">${esc(r.id)}</a></td>
      <td>${esc(r.goal).slice(0, 200)}</td>
      <td><span class="badge s-${esc(r.status)}">${esc(r.status)}</span></td>
      <td>${counts(r.counts)}</td>
      <td class="num">${r.cost_usd == null ? "-" : "$" + r.cost_usd.toFixed(4)}</td>
      <td class="num">${r.tokens == null ? "-" : r.tokens}</td>
      <td>${esc(when(r.created_at))}</td><td class="num">${esc(secs(r.duration_s))}</td></tr>`);
    const pager = data.pages > 1 ? `<div class="pager">
      ${data.page > 1 ? `<a href="/?page=${data.page - 1}">newer</a>` : ""}
      <span>page ${data.page} of ${data.pages}</span>
      ${data.page < data.pages ? `<a href="/?page=${data.page + 1}">older</a>` : ""}</div>` : "";
    main.innerHTML = `<h1>Runs <span class="muted">(${data.total})</span></h1>${pager}
      ${data.total ? `<table id="runs"><thead><tr><th>id</th><th>goal</th><th>status</th>
      <th>tasks</th><th class="num">spent</th><th class="num">tokens</th><th>started</th>
      <th class="num">duration</th></tr></thead><tbody>${rows.join("")}</tbody></table>`
        : `<p class="muted">No runs in this store yet.</p>`}${pager}`;
  }
  async function refresh() {
    try {
      const answer = await fetch(`/api/runs?page=${data.page}`, { credentials: "same-origin" });
      if (answer.ok) { data = await answer.json(); render(); }
    } catch (e) { /* the server stopped: keep the page as it is */ }
  }
  render();
  document.documentElement.dataset.ready = "1";
  setInterval(refresh, 5000);
})();
