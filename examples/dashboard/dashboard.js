// examples/dashboard/dashboard.js -- draws the rollups dashboard: fetches /api/sites and
// /api/rollups?site=S&from=MS (rows merged across collector instances by esx.collector.totals;
// the page's ?site= and ?range= (seconds, or "all") choose the initial selection) and
// renders, per block, four small SVG line charts (one line per variant) and a totals table.
// No libraries: the page must work with nothing reachable but the example nginx.
"use strict";

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);
const list = (v) => (Array.isArray(v) ? v : []); // an empty Lua table may come as {}

function el(tag, attrs, text, ns) {
  const e = ns ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtPct(x) { return isFinite(x) ? (100 * x).toFixed(2) + " %" : "–"; }
function fmtTime(ms) { return new Date(ms).toISOString().substr(11, 8); }

// rows -> {blocks: Map(block -> Map(variant -> Map(window -> {view, click, uniques})))}
function group(rows, byWindow) {
  const blocks = new Map();
  for (const r of rows) {
    const b = r.block_id || "(none)", v = r.variant || "(none)", w = byWindow ? r.window_start : 0;
    if (!blocks.has(b)) blocks.set(b, new Map());
    const vs = blocks.get(b);
    if (!vs.has(v)) vs.set(v, new Map());
    const ws = vs.get(v);
    if (!ws.has(w)) ws.set(w, { view: 0, click: 0, uniques: 0 });
    const cell = ws.get(w);
    if (r.type === "view") { cell.view += r.count; cell.uniques += r.uniques; }
    else if (r.type === "click") cell.click += r.count;
  }
  return blocks;
}

const METRICS = [
  ["Impressions per window", (c) => c.view, (y) => String(Math.round(y))],
  ["Clicks per window", (c) => c.click, (y) => String(Math.round(y))],
  ["CTR", (c) => (c.view ? c.click / c.view : 0), (y) => (100 * y).toFixed(1) + "%"],
  ["Unique visitors per window", (c) => c.uniques, (y) => String(Math.round(y))],
];

// One line chart: series = [{name, color, points: [[x, y]...]}].
function chart(title, series, xs, fmtY) {
  const W = 320, H = 150, L = 44, R = 8, T = 8, B = 20;
  const wrap = el("div", { class: "chart" });
  wrap.appendChild(el("div", { class: "title" }, title));
  const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }, undefined, true);
  const x0 = xs[0], x1 = xs[xs.length - 1];
  let ymax = 0;
  for (const s of series) for (const p of s.points) ymax = Math.max(ymax, p[1]);
  if (ymax === 0) ymax = 1;
  const sx = (x) => L + (x1 === x0 ? (W - L - R) / 2 : ((x - x0) / (x1 - x0)) * (W - L - R));
  const sy = (y) => H - B - (y / ymax) * (H - T - B);
  svg.appendChild(el("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }, undefined, true));
  svg.appendChild(el("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }, undefined, true));
  svg.appendChild(el("text", { x: L - 4, y: T + 8, "text-anchor": "end" }, fmtY(ymax), true));
  svg.appendChild(el("text", { x: L - 4, y: H - B, "text-anchor": "end" }, "0", true));
  svg.appendChild(el("text", { x: L, y: H - 5 }, fmtTime(x0), true));
  svg.appendChild(el("text", { x: W - R, y: H - 5, "text-anchor": "end" }, fmtTime(x1), true));
  for (const s of series) {
    const d = s.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1)).join("");
    svg.appendChild(el("path", { class: "line", d, stroke: s.color }, undefined, true));
    for (const p of s.points) {
      svg.appendChild(el("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 2.2, fill: s.color }, undefined, true));
    }
  }
  wrap.appendChild(svg);
  return wrap;
}

// The windows to plot: every window from the first to the last (empty ones count 0), unless
// that would be too many points; then only the windows that have rows.
function windows(series, step) {
  const seen = [...new Set(series.map((r) => r.window_start))].sort((a, b) => a - b);
  if (seen.length < 2 || !(step > 0) || (seen[seen.length - 1] - seen[0]) / step > 720) return seen;
  const xs = [];
  for (let w = seen[0]; w <= seen[seen.length - 1]; w += step) xs.push(w);
  return xs;
}

function drawCharts(series, step) {
  const root = $("#charts");
  root.textContent = "";
  const blocks = group(series, true);
  const xs = windows(series, step);
  if (xs.length === 0) { root.appendChild(el("p", {}, "No rollups for this site yet.")); return; }
  for (const [block, variants] of [...blocks].sort()) {
    const card = el("div", { class: "block" });
    card.appendChild(el("h3", {}, "block " + block));
    const names = [...variants.keys()].sort();
    const legend = el("div", { class: "legend" });
    names.forEach((v, i) => {
      const s = el("span");
      s.appendChild(el("i", { style: "background:" + COLORS[i % COLORS.length] }));
      s.appendChild(document.createTextNode("variant " + v));
      legend.appendChild(s);
    });
    card.appendChild(legend);
    const row = el("div", { class: "row" });
    for (const [title, get, fmtY] of METRICS) {
      const lines = names.map((v, i) => ({
        name: v, color: COLORS[i % COLORS.length],
        points: xs.map((w) => [w, get(variants.get(v).get(w) || { view: 0, click: 0, uniques: 0 })]),
      }));
      row.appendChild(chart(title, lines, xs, fmtY));
    }
    card.appendChild(row);
    root.appendChild(card);
  }
}

function drawTable(totals) {
  const body = $("#totals tbody");
  body.textContent = "";
  const blocks = group(totals, false);
  for (const [block, variants] of [...blocks].sort()) {
    for (const [variant, ws] of [...variants].sort()) {
      const c = ws.get(0);
      const tr = el("tr", { "data-block": block, "data-variant": variant });
      tr.appendChild(el("td", {}, block));
      tr.appendChild(el("td", {}, variant));
      tr.appendChild(el("td", { "data-k": "impressions" }, String(c.view)));
      tr.appendChild(el("td", { "data-k": "clicks" }, String(c.click)));
      tr.appendChild(el("td", { "data-k": "ctr" }, fmtPct(c.click / c.view)));
      tr.appendChild(el("td", { "data-k": "uniques" }, String(c.uniques)));
      body.appendChild(tr);
    }
  }
}

async function getJSON(url) {
  const res = await fetch(url, { cache: "no-store" });
  if (!res.ok) throw new Error(url + ": HTTP " + res.status);
  return res.json();
}

async function refresh() {
  const site = $("#site").value, range = $("#range").value;
  if (!site) return;
  let url = "/api/rollups?site=" + encodeURIComponent(site);
  if (range !== "all") url += "&from=" + (Date.now() - 1000 * Number(range));
  try {
    const data = await getJSON(url);
    drawCharts(list(data.series), data.window);
    drawTable(list(data.totals));
    $("#status").textContent = `site ${site} · ${data.window / 1000} s windows · updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = "1";
  } catch (e) {
    $("#status").textContent = "error: " + e.message;
  }
}

async function start() {
  const params = new URLSearchParams(location.search);
  let sites = [];
  try { sites = list((await getJSON("/api/sites")).sites); } catch (e) { $("#status").textContent = "error: " + e.message; }
  const select = $("#site");
  for (const s of sites) select.appendChild(el("option", { value: s }, s));
  if (params.get("site") && sites.includes(params.get("site"))) select.value = params.get("site");
  const range = $("#range");
  if ([...range.options].some((o) => o.value === params.get("range"))) range.value = params.get("range");
  range.addEventListener("change", refresh);
  if (!sites.length) $("#status").textContent = "no rollups yet: send some beacons to /collect";
  select.addEventListener("change", refresh);
  await refresh();
  setInterval(() => { if ($("#live").checked) refresh(); }, 5000);
}

start();
