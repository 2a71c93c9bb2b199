// planrun ui: one run's page. The plan as a layered graph (laid out here, no library),
// the task list (virtualised: only the rows in view are in the page), a task's details and
// ledger events, the approvals waiting, and plots; refreshed by polling while the run goes on.
"use strict";
(function () {
  const SVGNS = "http://www.w3.org/2000/svg";
  const COLLAPSE_AT = 3000;   // more tasks than this: the graph shows one node per kind
  const LABELS_UP_TO = 600;   // tasks drawn with their id written in them
  const ROW_H = 24;
  const main = document.getElementById("main");
  let data = JSON.parse(document.getElementById("data").textContent);
  const runId = data.run.id;
  let mode = data.tasks.length > COLLAPSE_AT ? "kinds" : "tasks";
  let selected = -1;
  let kindFilter = -1, statusFilter = -1, search = "";
  let view = [];          // task indices the list shows, in order
  let shape = null;       // the graph as drawn: {mode, nodes, rects, layoutKey}
  let timer = null;

  // ------------------------------------------------------------------ helpers
  function esc(text) {
    return String(text == null ? "" : text).replace(/[&<>"']/g,
      (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  }
  function secs(s) {
    if (s == null) return "-";
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }
  function when(epoch) { return epoch == null ? "-" : new Date(epoch * 1000).toLocaleString(); }
  function statusOf(i) { return data.statuses[data.tasks[i][2]]; }
  function el(id) { return document.getElementById(id); }
  function who() { return localStorage.getItem("planrun-ui-name") || ""; }

  // ------------------------------------------------------------------ skeleton
  main.innerHTML = `
    <div id="summary"></div>
    <div id="waiting"></div>
    <div id="note-bar" role="status"></div>
    <div class="grid">
      <div class="panel">
        <div class="toolbar"><strong>Plan</strong>
          <button id="mode"></button><button id="fit">fit</button>
          <span class="muted" id="graph-note"></span></div>
        <div class="legend">${data.statuses.map((s) =>
          `<span><i class="s-${s}"></i>${s}</span>`).join("")}</div>
        <svg id="graph" aria-label="the plan as a graph"></svg>
        <h2>Tasks <span class="muted" id="shown"></span></h2>
        <div class="toolbar">
          <input id="search" placeholder="task id contains" size="16">
          <select id="status-filter"><option value="-1">every status</option>${data.statuses
            .map((s, i) => `<option value="${i}">${s}</option>`).join("")}</select>
          <select id="kind-filter"></select></div>
        <div id="list-head"><span>id</span><span>kind</span><span>status</span>
          <span>tries</span><span class="num">tokens</span><span class="num">cost</span>
          <span>cause / error</span></div>
        <div id="list"><div id="spacer"></div></div>
      </div>
      <div class="panel"><div id="detail"><p class="muted">Click a task in the graph or
        the list to see its result and its ledger events.</p></div>
        <h2>Over time</h2><div class="plots" id="plots"></div></div>
    </div>`;

  // ------------------------------------------------------------------ summary
  function renderSummary() {
    const st = data.status, run = data.run, sp = st.spend, lim = st.limiter;
    const counts = Object.keys(st.counts).filter((k) => st.counts[k])
      .map((k) => `<span class="badge s-${k}">${k} ${st.counts[k]}</span>`).join(" ");
    let spend = "";
    if (sp) {
      spend = `<span>spent <b>$${sp.cost_usd.toFixed(4)}</b>, ${sp.total_tokens} tokens,
        ${sp.requests} requests</span>`;
      if (sp.max_cost != null) spend += `<span>budget $${sp.cost_left.toFixed(4)} left of
        $${sp.max_cost.toFixed(4)}</span>`;
      if (sp.max_tokens != null) spend += `<span>${sp.tokens_left} of ${sp.max_tokens}
        tokens left</span>`;
    }
    let rate = "";
    if (lim) {
      rate = `<span>rate limit ${lim.rpm != null ? lim.rpm + " rpm" : ""}
        ${lim.tpm != null ? lim.tpm + " tpm" : ""}${lim.recent_rpm != null
          ? `, last minute ${Math.round(lim.recent_rpm)} requests` : ""}</span>`;
    }
    el("summary").innerHTML = `<h1>Run <span class="mono">${esc(run.id)}</span>
      <span class="badge s-${esc(st.run_status)}" id="run-status">${esc(st.run_status)}</span>
      </h1><p>${esc(run.goal)}</p>
      <div class="summary"><span>${data.tasks.length} tasks</span>${counts}
      <span>started ${esc(when(run.created_at))}</span><span>duration
      ${esc(secs(run.duration_s))}</span><span>workers ${esc(run.workers)}</span>
      ${spend}${rate}${st.owner ? `<span class="muted">owner ${esc(st.owner)}</span>` : ""}
      </div>`;
  }

  // ------------------------------------------------------------------ approvals
  function decisionForm(id, stage, waited) {
    return `<div class="waiting-task" data-task="${esc(id)}">
      <b class="mono">${esc(id)}</b> waits for approval before its ${esc(stage)}
      <span class="muted">(${esc(secs(waited))})</span>
      <input class="note" placeholder="note (optional)" maxlength="500">
      <button class="approve">Approve</button> <button class="reject">Reject</button></div>`;
  }
  function renderWaiting() {
    const rows = data.status.waiting || [];
    const box = el("waiting");
    if (!rows.length) { box.innerHTML = ""; return; }
    const focused = document.activeElement && box.contains(document.activeElement);
    if (focused) return;  // do not wipe a note being typed
    box.innerHTML = `<h2>Waiting for approval (${rows.length})
      <label class="muted">as <input id="who" size="12" placeholder="ui"
      value="${esc(who())}"></label></h2>` +
      rows.slice(0, 10).map((w) => decisionForm(w.task, w.for, w.waiting_s)).join("") +
      (rows.length > 10 ? `<p class="muted">and ${rows.length - 10} more: filter the list
        by status waiting</p>` : "");
    el("who").addEventListener("change", (e) =>
      localStorage.setItem("planrun-ui-name", e.target.value.trim()));
  }
  async function decide(taskId, approve, note, buttons) {
    buttons.forEach((b) => { b.disabled = true; });
    const bar = el("note-bar");
    try {
      const answer = await fetch(`/api/${approve ? "approve" : "reject"}`, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ run: runId, task: taskId, by: who() || null,
          note: note || null }) });
      const body = await answer.json();
      if (answer.ok) {
        bar.innerHTML = `<span class="ok">${esc(taskId)} ${esc(body.decision)}
          (${esc(body.note)}); the run's process carries it out.</span>`;
      } else {
        bar.innerHTML = `<span class="error">${esc(body.error)}</span>`;
      }
    } catch (e) {
      bar.innerHTML = `<span class="error">the viewer did not answer: ${esc(e)}</span>`;
    }
    buttons.forEach((b) => { b.disabled = false; });
    poll(true);
  }
  main.addEventListener("click", (e) => {
    const button = e.target.closest("button.approve, button.reject");
    if (!button) return;
    const box = button.closest("[data-task]");
    const note = box.querySelector(".note");
    decide(box.dataset.task, button.classList.contains("approve"), note ? note.value : "",
      Array.from(box.querySelectorAll("button")));
  });

  // ------------------------------------------------------------------ layout
  // Layers by longest path from the tasks that depend on nothing; within a layer, nodes
  // ordered by the mean position of their neighbours (a few sweeps down and up); a layer
  // taller than `wrap` nodes is folded into several columns.
  function layered(n, preds, wrap) {
    const succ = Array.from({ length: n }, () => []);
    const indeg = new Int32Array(n);
    for (let i = 0; i < n; i++) for (const p of preds[i]) { succ[p].push(i); indeg[i]++; }
    const layer = new Int32Array(n), done = new Uint8Array(n), queue = [];
    for (let i = 0; i < n; i++) if (!indeg[i]) queue.push(i);
    for (let head = 0; head < queue.length; head++) {
      const i = queue[head]; done[i] = 1;
      for (const s of succ[i]) {
        if (layer[i] + 1 > layer[s]) layer[s] = layer[i] + 1;
        if (--indeg[s] === 0) queue.push(s);
      }
    }
    for (let i = 0; i < n; i++) if (!done[i]) {  // a cycle (kinds may form one)
      let l = 0; for (const p of preds[i]) if (done[p]) l = Math.max(l, layer[p] + 1);
      layer[i] = l; done[i] = 1;
    }
    let depth = 0; for (let i = 0; i < n; i++) if (layer[i] > depth) depth = layer[i];
    const layers = Array.from({ length: depth + 1 }, () => []);
    for (let i = 0; i < n; i++) layers[layer[i]].push(i);
    const pos = new Float64Array(n);
    const place = (L) => L.forEach((i, k) => { pos[i] = k / Math.max(1, L.length - 1); });
    layers.forEach(place);
    const bary = (i, nbrs) => {
      let s = 0, c = 0; for (const j of nbrs[i]) { s += pos[j]; c++; }
      return c ? s / c : pos[i];
    };
    for (let sweep = 0; sweep < 4; sweep++) {
      const down = sweep % 2 === 0, nbrs = down ? preds : succ;
      const order = down ? layers : layers.slice().reverse();
      for (const L of order) {
        const key = new Map(L.map((i) => [i, bary(i, nbrs)]));
        L.sort((a, b) => key.get(a) - key.get(b) || a - b);
        place(L);
      }
    }
    const col = new Int32Array(n), row = new Int32Array(n);
    let c0 = 0, rows = 1;
    for (const L of layers) {
      const cols = Math.max(1, Math.ceil(L.length / wrap));
      const per = Math.ceil(L.length / cols);
      L.forEach((i, k) => { col[i] = c0 + Math.floor(k / per); row[i] = k % per; });
      rows = Math.max(rows, per); c0 += cols;
    }
    return { col, row, cols: c0, rows };
  }

  // ------------------------------------------------------------------ graph
  const svg = el("graph");
  let box = { x: 0, y: 0, w: 100, h: 100 }, full = box;
  function setBox(b) { box = b; svg.setAttribute("viewBox", `${b.x} ${b.y} ${b.w} ${b.h}`); }

  function taskGraph() {
    const n = data.tasks.length, preds = [], spawnEdges = [];
    for (let i = 0; i < n; i++) {
      const t = data.tasks[i], p = t[4].concat(t[10]);
      if (t[5] >= 0 && !p.includes(t[5])) { p.push(t[5]); spawnEdges.push([t[5], i]); }
      preds.push(p);
    }
    const labels = n <= LABELS_UP_TO;
    const w = labels ? 96 : 14, h = labels ? 20 : 14;
    const wrap = Math.max(20, Math.ceil(Math.sqrt(n) * 1.2));
    return { n, preds, spawnEdges, w, h, gx: labels ? 40 : 16, gy: labels ? 8 : 4, wrap,
      labels, key: "tasks:" + n };
  }
  function kindGraph() {
    const k = data.kinds.length, sets = Array.from({ length: k }, () => new Set());
    for (const t of data.tasks) {
      for (const d of t[4]) { const a = data.tasks[d][1]; if (a !== t[1]) sets[t[1]].add(a); }
      if (t[5] >= 0) { const a = data.tasks[t[5]][1]; if (a !== t[1]) sets[t[1]].add(a); }
    }
    return { n: k, preds: sets.map((s) => Array.from(s)), spawnEdges: [], w: 190, h: 44,
      gx: 60, gy: 14, wrap: 12, labels: true, key: "kinds:" + k };
  }
  function kindCounts() {
    const c = data.kinds.map(() => new Array(data.statuses.length).fill(0));
    for (const t of data.tasks) c[t[1]][t[2]]++;
    return c;
  }

  function drawGraph() {
    const g = mode === "tasks" ? taskGraph() : kindGraph();
    const began = performance.now();
    const lay = layered(g.n, g.preds, g.wrap);
    performance.measure("planrun-layout", { start: began, end: performance.now() });
    const X = (i) => lay.col[i] * (g.w + g.gx), Y = (i) => lay.row[i] * (g.h + g.gy);
    const spawned = new Set(g.spawnEdges.map(([a, b]) => a + ":" + b));
    let d = "", ds = "";
    for (let i = 0; i < g.n; i++) {
      for (const p of g.preds[i]) {
        const x1 = X(p) + g.w, y1 = Y(p) + g.h / 2, x2 = X(i), y2 = Y(i) + g.h / 2;
        const mx = (x1 + x2) / 2;
        const seg = `M${x1} ${y1}C${mx} ${y1} ${mx} ${y2} ${x2} ${y2}`;
        if (spawned.has(p + ":" + i)) ds += seg; else d += seg;
      }
    }
    const parts = [`<path class="e" d="${d}"/>`, `<path class="e spawn" d="${ds}"/>`,
      `<path class="e hi" id="hi" d=""/>`];
    if (mode === "tasks") {
      for (let i = 0; i < g.n; i++) {
        parts.push(`<rect class="n ${statusOf(i)}" data-i="${i}" x="${X(i)}" y="${Y(i)}"
          width="${g.w}" height="${g.h}" rx="3"><title>${esc(data.tasks[i][0])}
          (${esc(data.kinds[data.tasks[i][1]])}) ${statusOf(i)}</title></rect>`);
        if (g.labels) parts.push(`<text x="${X(i) + 4}" y="${Y(i) + 14}">${
          esc(data.tasks[i][0].slice(0, 15))}</text>`);
      }
    } else {
      const counts = kindCounts();
      for (let k = 0; k < g.n; k++) {
        const total = counts[k].reduce((a, b) => a + b, 0);
        parts.push(`<rect class="n pending" data-k="${k}" x="${X(k)}" y="${Y(k)}"
          width="${g.w}" height="${g.h}" rx="4" style="fill:#fff;stroke:#adb5bd"></rect>`);
        parts.push(`<text class="k" x="${X(k) + 6}" y="${Y(k) + 16}">${
          esc(data.kinds[k].slice(0, 22))} (${total})</text>`);
        let x = X(k) + 6;
        counts[k].forEach((c, s) => {
          if (!c) return;
          const w = (g.w - 12) * c / total;
          parts.push(`<rect class="${data.statuses[s]}" data-k="${k}" x="${x}"
            y="${Y(k) + 24}" width="${w}" height="12"><title>${data.statuses[s]} ${c}
            </title></rect>`);
          x += w;
        });
      }
    }
    svg.innerHTML = parts.join("");
    const W = Math.max(1, lay.cols * (g.w + g.gx)), H = Math.max(1, lay.rows * (g.h + g.gy));
    full = { x: -10, y: -10, w: W + 20, h: H + 20 };
    const rects = mode === "tasks" ? new Array(g.n) : null;
    if (rects) svg.querySelectorAll("rect.n").forEach((r) => { rects[+r.dataset.i] = r; });
    shape = { mode, g, lay, X, Y, rects, key: g.key + ":" + data.kinds.length,
      drawn: mode === "tasks" ? data.tasks.map((t) => t[2]) : null };
    fit();
    el("mode").textContent = mode === "tasks" ? "one node per kind" : "every task";
    el("graph-note").textContent = mode === "tasks" ? `${g.n} tasks`
      : `${data.tasks.length} tasks in ${g.n} kinds: click a kind to list its tasks`;
    highlight();
  }
  function fit() {
    const r = svg.getBoundingClientRect(), aspect = r.width / Math.max(1, r.height);
    let { x, y, w, h } = full;
    const least = r.width / 1.5;  // a small plan is not blown up past 1.5 times its size
    if (w < least) { x -= (least - w) / 2; w = least; }
    if (w / h < aspect) { const w2 = h * aspect; x -= (w2 - w) / 2; w = w2; }
    else { const h2 = w / aspect; y -= (h2 - h) / 2; h = h2; }
    setBox({ x, y, w, h });
  }
  function recolor() {
    if (!shape || shape.key !== (mode === "tasks" ? "tasks:" + data.tasks.length
      : "kinds:" + data.kinds.length) + ":" + data.kinds.length) { drawGraph(); return; }
    if (mode === "kinds") { drawGraph(); return; }
    for (let i = 0; i < data.tasks.length; i++) {
      const s = data.tasks[i][2];
      if (shape.drawn[i] !== s) {
        shape.drawn[i] = s;
        const r = shape.rects[i];
        r.setAttribute("class", `n ${data.statuses[s]}${i === selected ? " sel" : ""}`);
        r.firstElementChild.textContent =
          `${data.tasks[i][0]} (${data.kinds[data.tasks[i][1]]}) ${data.statuses[s]}`;
      }
    }
  }
  function highlight() {
    if (!shape || shape.mode !== "tasks") return;
    svg.querySelectorAll("rect.n.sel").forEach((r) => r.classList.remove("sel"));
    const hi = el("hi");
    if (selected < 0 || selected >= shape.g.n) { hi.setAttribute("d", ""); return; }
    shape.rects[selected].classList.add("sel");
    const { g, X, Y } = shape;
    let d = "";
    const edge = (p, i) => {
      const x1 = X(p) + g.w, y1 = Y(p) + g.h / 2, x2 = X(i), y2 = Y(i) + g.h / 2;
      const mx = (x1 + x2) / 2;
      d += `M${x1} ${y1}C${mx} ${y1} ${mx} ${y2} ${x2} ${y2}`;
    };
    for (const p of g.preds[selected]) edge(p, selected);
    for (let i = 0; i < g.n; i++) if (g.preds[i].includes(selected)) edge(selected, i);
    hi.setAttribute("d", d);
  }
  // pan and zoom
  let drag = null;
  svg.addEventListener("pointerdown", (e) => {
    drag = { x: e.clientX, y: e.clientY, box, moved: false };
    svg.setPointerCapture(e.pointerId);
  });
  svg.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect(), k = drag.box.w / r.width;
    const dx = (e.clientX - drag.x) * k, dy = (e.clientY - drag.y) * k;
    if (Math.abs(dx) + Math.abs(dy) > 2 * k) drag.moved = true;
    if (drag.moved) setBox({ ...drag.box, x: drag.box.x - dx, y: drag.box.y - dy });
  });
  svg.addEventListener("pointerup", (e) => {
    const moved = drag && drag.moved; drag = null;
    if (moved) return;
    const hit = document.elementFromPoint(e.clientX, e.clientY);
    if (!hit) return;
    if (hit.dataset.i != null) select(+hit.dataset.i, true);
    else if (hit.dataset.k != null) { kindFilter = +hit.dataset.k; el("kind-filter").value =
      String(kindFilter); filterList(); }
  });
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = svg.getBoundingClientRect(), f = e.deltaY > 0 ? 1.2 : 1 / 1.2;
    const px = box.x + (e.clientX - r.left) / r.width * box.w;
    const py = box.y + (e.clientY - r.top) / r.height * box.h;
    setBox({ x: px - (px - box.x) * f, y: py - (py - box.y) * f, w: box.w * f, h: box.h * f });
  }, { passive: false });
  el("fit").addEventListener("click", fit);
  el("mode").addEventListener("click", () => {
    mode = mode === "tasks" ? "kinds" : "tasks"; drawGraph();
  });

  // ------------------------------------------------------------------ list
  const list = el("list"), spacer = el("spacer");
  function renderKinds() {
    el("kind-filter").innerHTML = `<option value="-1">every kind</option>` + data.kinds
      .map((k, i) => `<option value="${i}">${esc(k)}</option>`).join("");
    el("kind-filter").value = String(kindFilter);
  }
  function filterList() {
    view = [];
    const needle = search.toLowerCase();
    for (let i = 0; i < data.tasks.length; i++) {
      const t = data.tasks[i];
      if (kindFilter >= 0 && t[1] !== kindFilter) continue;
      if (statusFilter >= 0 && t[2] !== statusFilter) continue;
      if (needle && !t[0].toLowerCase().includes(needle)) continue;
      view.push(i);
    }
    spacer.style.height = view.length * ROW_H + "px";
    el("shown").textContent = `(${view.length} of ${data.tasks.length})`;
    renderRows(true);
  }
  let drawnRange = "";
  function renderRows(force) {
    const first = Math.max(0, Math.floor(list.scrollTop / ROW_H) - 10);
    const last = Math.min(view.length, first + Math.ceil(list.clientHeight / ROW_H) + 20);
    const range = first + ":" + last;
    if (!force && range === drawnRange) return;
    drawnRange = range;
    const rows = [];
    for (let k = first; k < last; k++) {
      const i = view[k], t = data.tasks[i], s = data.statuses[t[2]];
      const why = t[7] ? t[7].split("\n")[0] : (t[6] || "");
      rows.push(`<div class="row${i === selected ? " sel" : ""}" data-i="${i}"
        style="top:${k * ROW_H}px"><span class="mono">${esc(t[0])}</span>
        <span>${esc(data.kinds[t[1]])}</span><span><span class="badge s-${s}">${s}</span>
        </span><span>${t[3]}</span><span class="num">${t[11] == null ? "" : t[11]}</span>
        <span class="num">${t[12] == null ? "" : "$" + t[12].toFixed(4)}</span>
        <span class="${t[7] ? "error" : "muted"}">${esc(why)}</span></div>`);
    }
    spacer.innerHTML = rows.join("");
  }
  list.addEventListener("scroll", () => renderRows(false));
  list.addEventListener("click", (e) => {
    const row = e.target.closest(".row"); if (row) select(+row.dataset.i, false);
  });
  el("search").addEventListener("input", (e) => { search = e.target.value; filterList(); });
  el("status-filter").addEventListener("change", (e) => {
    statusFilter = +e.target.value; filterList();
  });
  el("kind-filter").addEventListener("change", (e) => {
    kindFilter = +e.target.value; filterList();
  });

  // ------------------------------------------------------------------ detail
  let detailFor = null;
  async function select(i, scroll) {
    selected = i;
    highlight();
    renderRows(true);
    if (scroll) {
      const k = view.indexOf(i);
      if (k >= 0) list.scrollTop = Math.max(0, k * ROW_H - list.clientHeight / 2);
    }
    await showDetail(data.tasks[i][0]);
  }
  async function showDetail(taskId) {
    detailFor = taskId;
    const answer = await fetch(`/api/task?run=${encodeURIComponent(runId)}&id=` +
      encodeURIComponent(taskId), { credentials: "same-origin" });
    const t = await answer.json();
    if (detailFor !== taskId) return;
    if (!answer.ok) { el("detail").innerHTML = `<p class="error">${esc(t.error)}</p>`; return; }
    const json = (v) => esc(JSON.stringify(v, null, 2));
    const field = (k, v) => v == null || v === "" ? "" : `<dt>${k}</dt><dd>${v}</dd>`;
    const waiting = t.status === "waiting" && !/^(approve|reject):/.test(t.cause || "");
    const events = t.events.map((e) => `<tr><td class="num">${e.seq}</td>
      <td>${esc(new Date(e.at * 1000).toLocaleTimeString())}</td><td>${esc(e.event)}</td>
      <td>${esc(e.worker || "")}</td><td class="mono">${Object.keys(e.detail).length
        ? esc(JSON.stringify(e.detail)) : ""}</td></tr>`).join("");
    el("detail").innerHTML = `<h2>Task <span class="mono">${esc(t.id)}</span>
      <span class="badge s-${esc(t.status)}">${esc(t.status)}</span></h2>
      ${waiting ? decisionForm(t.id, (t.cause || ":start").split(":")[1], 0) : ""}
      <dl>${field("kind", esc(t.kind))}${field("attempts", `${t.attempts} of ${t.max_attempts}`)}
      ${field("cause", esc(t.cause))}
      ${field("error", t.error ? `<span class="error">${esc(t.error)}</span>` : "")}
      ${field("worker", esc(t.assigned_to))}${field("depends on", esc(t.depends_on.join(", ")))}
      ${field("spawned by", esc(t.parent))}${field("started", esc(when(t.started_at)))}
      ${field("finished", esc(when(t.finished_at)))}
      ${field("took", t.started_at && t.finished_at ? secs(t.finished_at - t.started_at) : "")}
      ${field("effect", t.effect ? esc(t.effect.state) : "")}
      ${field("spent", t.spent ? `${t.spent.tokens} tokens, $${t.spent.cost_usd.toFixed(6)}
        in ${t.spent.requests} model request${t.spent.requests === 1 ? "" : "s"}` : "")}</dl>
      <details><summary>result</summary><pre>${json(t.result)}</pre></details>
      <details><summary>payload</summary><pre>${json(t.payload)}</pre></details>
      <h2>Ledger events (${t.events.length})</h2>
      <table><thead><tr><th class="num">seq</th><th>at</th><th>event</th><th>worker</th>
      <th>detail</th></tr></thead><tbody>${events}</tbody></table>`;
  }

  // ------------------------------------------------------------------ plots
  function plot(title, series, yMax, line) {
    // series: [{name, color, points: [[x, y]...]}]; line: a horizontal limit, or null
    const W = 300, H = 110, L = 34, B = 16;
    let xMax = 1e-9, top = yMax || 0;
    for (const s of series) for (const [x, y] of s.points) {
      if (x > xMax) xMax = x; if (y > top) top = y;
    }
    if (line != null && line > top) top = line;
    top = top || 1;
    const px = (x) => L + (W - L - 4) * x / xMax, py = (y) => H - B - (H - B - 6) * y / top;
    const paths = series.map((s) => `<polyline fill="none" stroke="${s.color}"
      stroke-width="1.5" points="${s.points.map(([x, y]) => px(x).toFixed(1) + "," +
        py(y).toFixed(1)).join(" ")}"><title>${esc(s.name)}</title></polyline>`).join("");
    const limit = line != null ? `<line x1="${L}" x2="${W - 4}" y1="${py(line)}"
      y2="${py(line)}" stroke="#e03131" stroke-dasharray="4 3"/>` : "";
    return `<div class="plot"><b>${esc(title)}</b><svg viewBox="0 0 ${W} ${H}"
      preserveAspectRatio="none"><line class="axis" x1="${L}" x2="${L}" y1="4"
      y2="${H - B}"/><line class="axis" x1="${L}" x2="${W - 4}" y1="${H - B}" y2="${H - B}"/>
      <text x="2" y="12">${+top.toPrecision(3)}</text><text x="2" y="${H - B}">0</text>
      <text x="${W - 40}" y="${H - 3}">${esc(secs(xMax))}</text>${limit}${paths}</svg></div>`;
  }
  function renderPlots() {
    const tl = data.timeline, parts = [];
    if (tl.at.length > 1) {
      const colors = getComputedStyle(document.documentElement);
      const series = data.statuses.map((s, k) => ({ name: s,
        color: colors.getPropertyValue("--" + s).trim(),
        points: tl.at.map((x, j) => [x, tl.counts[j][k]]) }))
        .filter((s) => s.points.some(([, y]) => y));
      parts.push(plot("tasks by status (from the ledger)", series, 0, null));
    }
    const sp = data.spend, st = data.status, budget = st.spend || {};
    if (sp.length > 1) {
      const money = budget.max_cost != null || sp[sp.length - 1][2] > 0;
      parts.push(plot(money ? "spent by the tasks, USD (budget dashed)"
        : "tokens spent by the tasks (budget dashed)",
        [{ name: "spent", color: "#1c7ed6",
          points: sp.map((p) => [p[0], money ? p[2] : p[1]]) }],
        0, money ? budget.max_cost : budget.max_tokens));
      parts.push(plot("model requests in the minute before (rate limit dashed)",
        [{ name: "requests per minute", color: "#f59f00",
          points: sp.map((p) => [p[0], p[3]]) }],
        0, st.limiter ? st.limiter.rpm : null));
    }
    if (!parts.length) parts.push(`<p class="muted">Nothing to plot yet.</p>`);
    el("plots").innerHTML = parts.join("");
  }

  // ------------------------------------------------------------------ updates
  function renderAll(relayout) {
    renderSummary();
    renderWaiting();
    if (relayout) { renderKinds(); drawGraph(); } else recolor();
    filterList();
    renderPlots();
  }
  async function poll(now) {
    clearTimeout(timer);
    try {
      const answer = await fetch(`/api/run?id=${encodeURIComponent(runId)}&since=` +
        encodeURIComponent(data.version), { credentials: "same-origin" });
      const fresh = await answer.json();
      if (answer.ok && !fresh.unchanged) {
        const relayout = fresh.tasks.length !== data.tasks.length ||
          fresh.kinds.length !== data.kinds.length;
        data = fresh;
        renderAll(relayout);
        if (detailFor) showDetail(detailFor);
      }
    } catch (e) { /* the viewer stopped or the network blinked: try again later */ }
    schedule();
  }
  function schedule() {
    if (data.run.finished) { document.documentElement.dataset.finished = "1"; return; }
    timer = setTimeout(poll, Math.max(1000, data.tasks.length / 2));
  }
  renderAll(true);
  requestAnimationFrame(() => setTimeout(() => {  // once the first frame is painted
    document.documentElement.dataset.ready = "1";
    performance.mark("planrun-ready");
  }));
  schedule();
})();
