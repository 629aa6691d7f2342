// rllm-core view: the page over the JSON API of rllm_core.view.app. Plain DOM, no library.
"use strict";

const errors = [];
function noteError(text) {
  errors.push(String(text));
  document.documentElement.dataset.errors = JSON.stringify(errors);
}
window.addEventListener("error", (e) => noteError(e.message));
window.addEventListener("unhandledrejection", (e) => noteError(e.reason));

const COLORS = ["#2f5fd0", "#d0582f", "#1f8a4c", "#8e44ad", "#b77900", "#137a8a", "#c0392b"];
const REFRESH_MS = 5000;
let refreshTimer = null;
let generation = 0;

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, value);
  for (const child of children) el.append(child instanceof Node ? child : String(child));
  return el;
}

async function api(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== null && value !== undefined && value !== "") query.set(key, value);
  }
  const response = await fetch(`/api/${path}?${query}`, { credentials: "same-origin" });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error || `${response.status} ${response.statusText}`);
  return data;
}

function num(value, digits = 3) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  if (seconds < 60) return `${seconds.toFixed(1)}s`;
  const total = Math.round(seconds);
  const hours = Math.floor(total / 3600), minutes = Math.floor((total % 3600) / 60);
  const secs = String(total % 60).padStart(2, "0");
  return hours ? `${hours}h ${String(minutes).padStart(2, "0")}m ${secs}s` : `${minutes}m ${secs}s`;
}

function component(entry, ...details) {
  if (!entry) return "-";
  return [entry.name, ...details.filter((k) => entry[k] != null).map((k) => `${k} ${entry[k]}`)]
    .join(" · ");
}

function statusCell(status) {
  return h("span", { class: `status status-${status}` }, status);
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, search] = hash.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(search || "") };
}

function link(parts, params) {
  const path = parts.map(encodeURIComponent).join("/");
  const query = params ? new URLSearchParams(params).toString() : "";
  return `#/${path}${query ? `?${query}` : ""}`;
}

function crumbs(items) {
  const nav = document.getElementById("crumbs");
  nav.replaceChildren(...items.flatMap((item, i) => [
    ...(i ? [h("span", {}, "/")] : []),
    item.href ? h("a", { href: item.href }, item.text) : h("span", {}, item.text),
  ]));
}

function ready(main) {
  document.documentElement.dataset.page = route().parts[0] || "runs";
  document.documentElement.dataset.ready = String(generation);
  return main;
}

async function render(live = false) {
  const mine = ++generation;
  const { parts, params } = route();
  const main = document.getElementById("main");
  clearTimeout(refreshTimer);
  try {
    let content;
    if (parts[0] === "run") content = await runPage(parts[1], params);
    else if (parts[0] === "episodes") content = await episodesPage(parts[1], params);
    else if (parts[0] === "episode") content = await episodePage(parts[1], parts[2], params);
    else if (parts[0] === "group") content = await groupPage(parts[1], parts[2]);
    else content = await runsPage();
    if (mine !== generation) return;
    const scroll = window.scrollY;
    main.replaceChildren(...[content].flat(Infinity).filter((x) => x));
    if (live) window.scrollTo(0, scroll);
    ready(main);
  } catch (err) {
    if (mine !== generation) return;
    main.replaceChildren(h("p", { class: "error" }, String(err.message || err)));
    ready(main);
  }
  // Lists and curves follow a run that is still writing; an episode is read once.
  if (!["episode", "group"].includes(parts[0])) {
    document.getElementById("live").textContent = "live";
    refreshTimer = setTimeout(() => { if (mine === generation) render(true); }, REFRESH_MS);
  } else {
    document.getElementById("live").textContent = "";
  }
}

// ------------------------------------------------------------------ runs list

async function runsPage() {
  crumbs([{ text: "runs" }]);
  const data = await api("runs");
  const chosen = new Set();
  const compare = h("button", {
    onclick: () => {
      const names = [...chosen];
      if (names.length) location.hash = link(["run", names[0]], names.length > 1 ? { compare: names.slice(1).join(",") } : null);
    },
  }, "Compare selected");
  const rows = data.runs.map((r) => {
    const c = r.components;
    let loss = component(c.loss);
    for (const aux of c.aux_losses || []) loss += ` + ${aux.coef} x ${aux.name}`;
    return h("tr", {},
      h("td", {}, h("input", { type: "checkbox", onchange: (e) => e.target.checked ? chosen.add(r.name) : chosen.delete(r.name) })),
      h("td", {}, h("a", { href: link(["run", r.name]) }, r.name)),
      h("td", {}, statusCell(r.status)),
      h("td", { class: "num" }, `${r.steps_done}/${r.steps_planned ?? "?"}`),
      h("td", { class: "num" }, num(r.reward.first)),
      h("td", { class: "num" }, num(r.reward.last)),
      h("td", { class: "num" }, r.reward.best === null ? "-" : `${num(r.reward.best)} (step ${r.reward.best_step})`),
      h("td", { class: "num" }, duration(r.wall_s)),
      h("td", {}, r.started || "-"),
      h("td", {}, [component(c.trainer, "model"), loss, component(c.harness), component(c.renderer)].filter((x) => x !== "-").join(" · ")),
    );
  });
  const out = [h("h1", {}, `Runs in ${data.root}`)];
  if (!rows.length) out.push(h("p", { class: "muted" }, "No run folders here yet; start one with `rllm-core run PLAN`."));
  else {
    out.push(h("div", { class: "pager" }, compare, h("span", { class: "muted" }, "tick runs to overlay their curves")));
    out.push(h("table", { id: "runs" },
      h("thead", {}, h("tr", {}, ["", "Run", "Status", "Steps", "Reward first", "Reward last", "Reward best", "Wall", "Started", "Components"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)));
  }
  for (const bad of data.unreadable) out.push(h("p", { class: "error" }, `${bad.name}: ${bad.error}`));
  return out;
}

// ------------------------------------------------------------------ a run

const CHART_KEYS = [/^reward\/(mean|std)$/, /^accuracy$/, /^train\/(loss|grad_norm|nll|learning_rate)$/, /^eval\//, /^offpolicy\//, /^async\//];

async function runPage(name, params) {
  const compare = (params.get("compare") || "").split(",").filter(Boolean);
  const names = [name, ...compare];
  crumbs([{ text: "runs", href: "#/" }, { text: name }]);
  const [report, all, ...metrics] = await Promise.all([
    api("run", { run: name }), api("runs"), ...names.map((n) => api("metrics", { run: n })),
  ]);
  const c = report.components;
  const summary = h("table", { class: "kv" }, h("tbody", {},
    [
      ["status", statusCell(report.status)],
      ["steps", `${report.steps_done} / ${report.steps_planned ?? "?"}`],
      ["wall time", duration(report.wall_s) + (report.wall_source === "metrics" ? " (sum of step times; no summary.json)" : "")],
      ["started", `${report.started} · last write ${report.last_activity}`],
      ["reward", `first ${num(report.reward.first)} · last ${num(report.reward.last)} · best ${num(report.reward.best)}${report.reward.best_step !== null ? ` (step ${report.reward.best_step})` : ""}`],
      ["episodes", `${report.episodes} scored · ${report.infra_failures} infra failures`],
      ["tokens", `${report.tokens.sampled.toLocaleString()} sampled · ${report.tokens.trained.toLocaleString()} trained`],
      ...(report.sft ? [["nll", `first ${num(report.sft.nll_first)} · last ${num(report.sft.nll_last)} · eval ${num(report.sft.eval_nll)}`]] : []),
      ["trainer", component(c.trainer, "model", "base_model")],
      ["loss", component(c.loss)], ["advantage", component(c.advantage)],
      ["harness", component(c.harness)], ["renderer", component(c.renderer)],
      ["tasks", component(c.tasks, "path")], ["trace store", component(c.trace_store, "path")],
    ].map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", {}, v)))));
  const others = all.runs.map((r) => r.name).filter((n) => n !== name);
  const overlay = others.length === 0 ? null : h("div", { class: "filters" }, h("span", { class: "muted" }, "overlay:"),
    others.map((other) => h("label", { style: "flex-direction:row;gap:4px" },
      h("input", { type: "checkbox", checked: compare.includes(other), onchange: (e) => {
        const next = e.target.checked ? [...compare, other] : compare.filter((n) => n !== other);
        location.hash = link(["run", name], next.length ? { compare: next.join(",") } : null);
      } }), other)));
  const keys = [...new Set(metrics.flatMap((m) => m.keys))];
  const shown = keys.filter((k) => CHART_KEYS.some((re) => re.test(k)));
  const charts = h("div", { class: "charts", id: "charts" }, shown.map((key) => chart(key, metrics)));
  const extra = h("select", { onchange: (e) => { if (e.target.value) charts.append(chart(e.target.value, metrics)); } },
    h("option", { value: "" }, "add a curve…"), keys.filter((k) => !shown.includes(k)).map((k) => h("option", { value: k }, k)));
  const evalRows = Object.entries(report.eval).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, num(v.value, 4)), h("td", { class: "num" }, v.step)));
  return [
    h("h1", {}, name),
    h("p", {}, h("a", { href: link(["episodes", name]) }, `Episodes (${report.episodes})`)),
    summary,
    h("h2", {}, "Curves"), overlay, charts,
    keys.length ? h("div", { class: "pager" }, extra) : h("p", { class: "muted" }, "No step finished yet."),
    h("h2", {}, "Eval results"),
    evalRows.length ? h("table", {}, h("thead", {}, h("tr", {}, h("th", {}, "metric"), h("th", { class: "num" }, "last value"), h("th", { class: "num" }, "step"))), h("tbody", {}, evalRows)) : h("p", { class: "muted" }, "No eval/ metrics in metrics.jsonl."),
    h("h2", {}, "Checkpoints"),
    h("p", {}, report.checkpoints.length ? report.checkpoints.map((s) => h("span", { class: "pill" }, `step ${s}`)) : h("span", { class: "muted" }, "none")),
    h("h2", {}, "Resolved plan"),
    h("details", {}, h("summary", {}, "plan.resolved.json"), h("pre", { class: "plan" }, JSON.stringify(report.plan, null, 2))),
  ];
}

function chart(key, metrics) {
  const W = 420, H = 190, L = 54, R = 8, T = 8, B = 20;
  const lines = metrics.map((m, i) => ({
    run: m.run, color: COLORS[i % COLORS.length],
    points: (m.series[key] || []).map((y, j) => [m.steps[j], y]).filter((p) => p[1] !== null),
  })).filter((l) => l.points.length);
  const xs = lines.flatMap((l) => l.points.map((p) => p[0]));
  const ys = lines.flatMap((l) => l.points.map((p) => p[1]));
  let [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 1; y1 += Math.abs(y1) * 0.1 || 1; }
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": key });
  // Enough decimals to tell the four grid steps apart, however narrow the range.
  const digits = Math.min(6, Math.max(0, 1 - Math.floor(Math.log10((y1 - y0) / 4))));
  const label = (y) => (Math.abs(y) >= 1e5 ? y.toExponential(1) : y.toFixed(digits));
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    plot.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: py(y), y2: py(y) }));
    plot.append(svg("text", { class: "tick", x: L - 4, y: py(y) + 3, "text-anchor": "end" }, label(y)));
  }
  for (const x of [x0, (x0 + x1) / 2, x1]) {
    plot.append(svg("text", { class: "tick", x: px(x), y: H - 5, "text-anchor": "middle" }, Math.round(x)));
  }
  plot.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  plot.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  const paths = lines.map((l) => {
    const d = l.points.map((p, i) => `${i ? "L" : "M"}${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join("");
    const g = svg("g", {}, svg("path", { d, fill: "none", stroke: l.color, "stroke-width": 1.6, "vector-effect": "non-scaling-stroke" }));
    if (l.points.length < 40) for (const p of l.points) g.append(svg("circle", { cx: px(p[0]), cy: py(p[1]), r: 2, fill: l.color }));
    plot.append(g);
    return g;
  });
  const hover = svg("line", { class: "hover", y1: T, y2: H - B, x1: -10, x2: -10 });
  plot.append(hover);
  const tip = document.getElementById("tip");
  plot.addEventListener("mousemove", (e) => {
    const box = plot.getBoundingClientRect();
    const x = x0 + ((e.clientX - box.left) / box.width * W - L) / (W - L - R) * (x1 - x0);
    const text = [key];
    let step = null;
    lines.forEach((l, i) => {
      if (paths[i].style.display === "none") return;
      let best = l.points[0];
      for (const p of l.points) if (Math.abs(p[0] - x) < Math.abs(best[0] - x)) best = p;
      step = best[0];
      text.push(`${l.run}  step ${best[0]}: ${+best[1].toPrecision(5)}`);
    });
    if (step === null) return;
    hover.setAttribute("x1", px(step)); hover.setAttribute("x2", px(step));
    tip.textContent = text.join("\n");
    tip.style.left = `${e.clientX + 14}px`; tip.style.top = `${e.clientY + 10}px`;
    tip.hidden = false;
  });
  plot.addEventListener("mouseleave", () => { tip.hidden = true; hover.setAttribute("x1", -10); hover.setAttribute("x2", -10); });
  const legend = h("div", { class: "legend" }, lines.map((l, i) => h("span", {
    style: `color:${l.color}`,
    onclick: (e) => { const off = paths[i].style.display !== "none"; paths[i].style.display = off ? "none" : ""; e.target.classList.toggle("off", off); },
  }, `■ ${l.run}`)));
  return h("div", { class: "chart", "data-key": key }, h("div", { class: "title" }, key), lines.length ? plot : h("p", { class: "muted" }, "no values"), legend);
}

// ------------------------------------------------------------------ episodes

async function episodesPage(name, params) {
  crumbs([{ text: "runs", href: "#/" }, { text: name, href: link(["run", name]) }, { text: "episodes" }]);
  const query = Object.fromEntries(params);
  const data = await api("episodes", { run: name, limit: 100, ...query });
  const f = data.facets;
  const go = (changes) => {
    const next = { ...query, ...changes };
    for (const k of Object.keys(next)) if (next[k] === "" || next[k] === null) delete next[k];
    location.hash = link(["episodes", name], next);
  };
  const select = (key, values) => h("select", { onchange: (e) => go({ [key]: e.target.value, offset: 0 }) },
    h("option", { value: "" }, "any"), values.map((v) => h("option", { value: v, selected: String(query[key] || "") === String(v) }, v)));
  const input = (key, width) => h("input", { value: query[key] || "", size: width, onchange: (e) => go({ [key]: e.target.value, offset: 0 }) });
  const filters = h("div", { class: "filters" },
    h("label", {}, "step", select("step", f.steps)),
    h("label", {}, "task contains", input("task", 14)),
    h("label", {}, "termination", select("termination", f.terminations)),
    h("label", {}, "group", input("group", 12)),
    h("label", {}, "reward ≥", input("min_reward", 5)),
    h("label", {}, "reward ≤", input("max_reward", 5)),
    h("button", { onclick: () => { location.hash = link(["episodes", name]); } }, "clear"));
  const strip = (id) => String(id).startsWith(data.prefix) ? String(id).slice(data.prefix.length) : id;
  const rows = data.rows.map((r) => h("tr", {},
    h("td", {}, h("a", { href: link(["episode", name, r.episode_id]) }, strip(r.episode_id))),
    h("td", { class: "num" }, r.step), h("td", {}, r.task_id),
    h("td", {}, r.group_id ? h("a", { href: link(["group", name, r.group_id]) }, r.group_id) : "-"),
    h("td", { class: "num" }, num(r.reward)), h("td", { class: "num" }, r.turns),
    h("td", { class: "num" }, r.completion_tokens ?? "-"), h("td", {}, r.termination)));
  const offset = data.offset, end = offset + data.rows.length;
  const pager = h("div", { class: "pager" },
    h("button", { disabled: offset === 0, onclick: () => go({ offset: Math.max(0, offset - data.limit) }) }, "← previous"),
    h("span", {}, `${data.matched ? offset + 1 : 0}–${end} of ${data.matched} matching (${data.total} episodes, ${f.groups} groups)`),
    h("button", { disabled: end >= data.matched, onclick: () => go({ offset: offset + data.limit }) }, "next →"));
  return [h("h1", {}, `Episodes of ${name}`), filters, pager,
    h("table", { id: "episodes" }, h("thead", {}, h("tr", {}, ["Episode", "Step", "Task", "Group", "Reward", "Calls", "Completion tokens", "End"].map((t) => h("th", {}, t)))), h("tbody", {}, rows))];
}

// ------------------------------------------------------------------ an episode

function messageRows(messages) {
  return messages.map((m) => h("div", { class: `msg${m.role === "tool" ? " toolresult" : ""}` },
    h("div", { class: `role role-${m.role}` }, m.role),
    h("div", {},
      m.reasoning ? h("details", { class: "reasoning" }, h("summary", {}, `reasoning (${m.reasoning.length} characters)`), h("div", {}, m.reasoning)) : null,
      m.content ? h("div", { class: "content" }, m.content) : null,
      (m.tool_calls || []).map((call) => h("div", { class: "toolcall", "data-tool": call.name }, `→ ${call.name}(${call.arguments || ""})`, call.id ? h("span", { class: "answers" }, `  ${call.id}`) : null)),
      m.tool_call_id ? h("div", { class: "answers" }, `answers ${m.tool_call_id}`) : null)));
}

function verdict(record) {
  const items = [["reward", num(record.reward)], ["termination", record.termination]];
  if (record.shaped_reward !== undefined) items.push(["shaped reward", num(record.shaped_reward)]);
  for (const [k, v] of Object.entries(record.signals || {})) items.push([k, typeof v === "number" ? +v.toPrecision(4) : String(v)]);
  if (record.truncated) items.push(["truncated", "a call hit its length limit"]);
  if (record.denied) items.push(["denied", String(record.denied)]);
  return h("div", { class: "card verdict", id: "verdict" }, items.map(([k, v]) => h("div", {}, h("b", {}, k), v)));
}

async function episodePage(name, id, params) {
  const data = await api("episode", { run: name, id });
  const e = data.episode;
  crumbs([{ text: "runs", href: "#/" }, { text: name, href: link(["run", name]) },
    { text: "episodes", href: link(["episodes", name], { step: e.step }) }, { text: e.episode_id }]);
  const present = data.turns.filter((t) => !t.missing);
  const head = [
    h("h1", {}, e.episode_id),
    h("p", {}, `task ${e.task_id} · step ${e.step} · ${data.turns.length} calls · ${present.reduce((s, t) => s + t.completion_tokens, 0).toLocaleString()} completion tokens · session ${e.session_id}`,
      e.group_id ? [" · ", h("a", { href: link(["group", name, e.group_id]) }, `group ${e.group_id} side by side`)] : null),
    h("h2", {}, "Verifier"), verdict(e),
  ];
  if (data.warning) head.push(h("p", { class: "error" }, data.warning));
  const opened = params.get("tokens");
  const turns = data.turns.map((t, i) => turnCard(name, e.episode_id, t, i));
  if (opened !== null) {
    // #/episode/RUN/ID?tokens=N opens call N's tokens, e.g. from a shared link.
    const card = turns.flat().find((el) => el.dataset && el.dataset.call === opened);
    if (card) await card.openTokens();
  }
  return [...head, h("h2", {}, "Conversation"), ...turns];
}

function turnCard(name, episodeId, t, index) {
  const out = [];
  if (t.marker) out.push(h("div", { class: "reset", "data-reason": t.reset_reason }, `⟲ ${t.marker.replace(/^── | ──$/g, "")}`));
  if (t.missing) {
    out.push(h("div", { class: "turn missing" }, h("div", { class: "head" }, h("span", { class: "name" }, `${t.lineage_id} · missing trace`)),
      h("p", { class: "error", style: "padding:6px 12px" }, `trace ${t.trace_id} is not in the trace store`)));
    return out;
  }
  const body = h("div", {});
  const tokens = h("div", { class: "tokens", hidden: true });
  const open = async () => {
    tokens.hidden = false;
    tokens.replaceChildren(h("span", { class: "muted" }, "reading tokens…"));
    try { tokens.replaceChildren(...tokenView(await api("tokens", { run: name, id: episodeId, call: index }))); }
    catch (err) { tokens.replaceChildren(h("p", { class: "error" }, String(err.message || err))); }
  };
  const button = h("button", { onclick: () => { if (tokens.hidden) open(); else tokens.hidden = true; } }, "tokens");
  const stats = `prompt ${t.prompt_tokens.toLocaleString()} tokens (+${t.prompt_delta_tokens.toLocaleString()} new) · completion ${t.completion_tokens} · mean logprob ${num(t.mean_logprob)} · finish ${t.finish_reason} · policy v${t.weight_version}${t.chain_complete ? "" : " · prompt incomplete (an ancestor trace is missing)"}`;
  body.append(...messageRows(t.messages));
  if (!t.messages.length && t.text) {
    body.append(...messageRows([{ role: "user", content: t.text.prompt_delta }, { role: "assistant", content: t.text.completion }]));
  } else if (!t.messages.length) body.append(h("p", { class: "muted", style: "padding:6px 12px" }, "(stored without messages)"));
  const card = h("div", { class: "turn", "data-call": index },
    h("div", { class: "head" }, h("span", { class: "name" }, `${t.lineage_id} · turn ${t.turn}`), h("span", { class: "stats" }, stats), button),
    body, tokens);
  card.openTokens = open;
  out.push(card);
  return out;
}

function heat(logprob) {
  // probability 1 green, 0.5 yellow, near 0 red
  const p = Math.exp(Math.max(-20, logprob ?? -20));
  const hue = Math.round(120 * p);
  return `hsl(${hue}, 75%, ${78 - 10 * (1 - p)}%)`;
}

function tokenView(data) {
  const out = [];
  if (data.reset_reason) {
    const b = data.history_break;
    out.push(h("div", { class: "reset" }, b
      ? `⟲ lineage reset here: ${b.reason}; the request kept ${b.kept} recorded messages, dropped ${b.dropped}, inserted ${b.inserted} (first change at message ${b.at})${b.source ? `, continuing lineage ${b.source}` : ""}`
      : `⟲ lineage reset here: ${data.reset_reason}; this call's prompt starts a new root`));
  }
  out.push(h("div", { class: "tokenlegend" },
    h("span", {}, `${data.prefix_tokens.toLocaleString()} prompt tokens inherited from earlier calls (not shown)`),
    h("span", {}, h("span", { class: "tok obs" }, "observation"), " prompt tokens this call added (mask 0)"),
    h("span", {}, h("span", { class: "tok act", style: `background:${heat(0)}` }, "action"), " sampled (mask 1), colored by logprob")));
  const canvas = h("canvas", { width: Math.max(1, data.tokens.length), height: 1, title: "per-token strip: grey observation, green→red action logprob" });
  const ctx = canvas.getContext("2d");
  data.tokens.forEach((t, i) => { ctx.fillStyle = t.action ? heat(t.logprob) : "#c9cdd5"; ctx.fillRect(i, 0, 1, 1); });
  out.push(canvas);
  out.push(h("div", { class: "tokenchips" }, data.tokens.map((t) => h("span", {
    class: `tok ${t.action ? "act" : "obs"}`,
    style: t.action ? `background:${heat(t.logprob)}` : null,
    title: `id ${t.id}${t.action ? ` · logprob ${num(t.logprob, 4)} · action` : " · observation"}`,
  }, t.text.replace(/\n/g, "↵\n") || "∅"))));
  return out;
}

// ------------------------------------------------------------------ a group side by side

async function groupPage(name, group) {
  crumbs([{ text: "runs", href: "#/" }, { text: name, href: link(["run", name]) }, { text: `group ${group}` }]);
  const list = await api("episodes", { run: name, group, limit: 16 });
  const episodes = await Promise.all(list.rows.map((r) => api("episode", { run: name, id: r.episode_id })));
  const cols = episodes.map((d) => h("div", { class: "col" },
    h("div", {}, h("a", { href: link(["episode", name, d.episode.episode_id]) }, d.episode.episode_id.slice(list.prefix.length))),
    verdict(d.episode),
    d.turns.map((t) => [t.marker ? h("div", { class: "reset" }, `⟲ ${t.marker.replace(/^── | ──$/g, "")}`) : null, t.missing ? h("p", { class: "error" }, `missing trace ${t.trace_id}`) : messageRows(t.messages.length ? t.messages : [{ role: "assistant", content: t.text ? t.text.completion : "(stored without messages)" }])])));
  return [h("h1", {}, `Group ${group} of ${name}`), h("p", { class: "muted" }, `${list.matched} episodes`), h("div", { class: "side" }, cols)];
}

window.addEventListener("hashchange", () => render());
render();
