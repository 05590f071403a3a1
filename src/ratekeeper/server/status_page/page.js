// The status page: reads /status.json every 2 s and draws it; the form peeks through
// /status/try. Everything is built with DOM calls and textContent (never innerHTML), so a
// rule name or key is shown as text, never run as markup.
"use strict";

const KINDS = ["allowed", "denied", "shadow", "fallback"];
const COLORS = { allowed: "#2f9e44", denied: "#e03131", shadow: "#f59f00", fallback: "#7048e8" };
const SVG = "http://www.w3.org/2000/svg";
const REFRESH_MS = 2000;

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function setStatus(id, text, good) {
  const node = document.getElementById(id);
  node.textContent = text;
  node.className = good === undefined ? "" : good ? "ok" : "bad";
}

// One small chart: a polyline per kind, decisions per interval, on a shared y scale.
function chart(rule, series, times, interval) {
  const box = el("div", { class: "chart", "data-rule": rule });
  box.appendChild(el("h3", {}, rule));
  const w = 300, h = 80, n = Math.max(times.length, 2);
  const top = Math.max(1, ...KINDS.flatMap((k) => series[k]));
  const totals = KINDS.map((k) => `${k} ${series[k].reduce((a, b) => a + b, 0)}`).join(" · ");
  box.appendChild(el("div", { class: "totals" }, `${totals} · top of chart ${top} / ${interval} s`));
  const plot = svg("svg", { viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none", role: "img" });
  plot.appendChild(svg("title", {})).textContent = `${rule}: decisions per interval, peak ${top}`;
  for (const kind of KINDS) {
    const values = series[kind];
    if (!values.some((v) => v > 0)) continue;
    const points = values.map((v, i) => `${(i * w) / (n - 1)},${h - 2 - (v * (h - 6)) / top}`).join(" ");
    plot.appendChild(svg("polyline", { points, fill: "none", stroke: COLORS[kind], "stroke-width": 1.5, class: kind }));
  }
  box.appendChild(plot);
  return box;
}

function drawRules(rules) {
  const body = document.getElementById("rules-body");
  body.replaceChildren(
    ...rules.map((r) => {
      const row = el("tr", { "data-rule": r.name });
      const form = r.form === "envoy" ? `envoy (${r.domain})` : "native";
      for (const text of [r.name, form, r.limits.join(", "), r.algorithm, r.shadow ? "yes" : "no"]) {
        row.appendChild(el("td", {}, text));
      }
      return row;
    }),
  );
  // The form peeks the native rules (what /v1/peek takes); keep the visitor's choice.
  const select = document.getElementById("try-rule");
  const chosen = select.value;
  const names = rules.filter((r) => r.form === "native").map((r) => r.name);
  if (names.join("\n") !== Array.from(select.options, (o) => o.value).join("\n")) {
    select.replaceChildren(...names.map((name) => el("option", { value: name }, name)));
    if (names.includes(chosen)) select.value = chosen;
  }
}

function draw(doc) {
  const store = doc.store;
  setStatus("store", store.reachable ? `reachable (${store.url})` : `unreachable: ${store.problem}`, store.reachable);
  setStatus("breaker", doc.breaker, doc.breaker === "closed");
  const last = doc.reloads.recent[doc.reloads.recent.length - 1];
  const lastText = last ? `; last ${last.result} at ${new Date(last.at * 1000).toLocaleTimeString()}` : "";
  setStatus("reloads", `${doc.reloads.ok} ok, ${doc.reloads.failed} failed${lastText}`, doc.reloads.failed === 0);
  setStatus("sources", doc.sources.join(", "));
  drawRules(doc.rules);
  const d = doc.decisions;
  const names = Object.keys(d.rules);
  const charts = document.getElementById("charts");
  charts.replaceChildren(...names.map((rule) => chart(rule, d.rules[rule], d.times, d.interval)));
  if (!names.length) charts.appendChild(el("p", { class: "note" }, "No decisions yet."));
  document.getElementById("updated").textContent =
    `updated ${new Date(doc.now * 1000).toLocaleTimeString()} · a point every ${d.interval} s`;
}

async function refresh() {
  try {
    const reply = await fetch("/status.json", { cache: "no-store" });
    if (!reply.ok) throw new Error(`HTTP ${reply.status}`);
    draw(await reply.json());
  } catch (err) {
    document.getElementById("updated").textContent = `cannot read /status.json: ${err.message}`;
  }
}

async function tryCheck(event) {
  event.preventDefault();
  const body = {
    rule: document.getElementById("try-rule").value,
    key: document.getElementById("try-key").value,
    cost: Number(document.getElementById("try-cost").value),
  };
  const verdict = document.getElementById("try-verdict");
  const out = document.getElementById("try-result");
  const reply = await fetch("/status/try", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  const doc = await reply.json();
  out.textContent = JSON.stringify(doc, null, 2);
  if (!reply.ok) {
    verdict.textContent = `refused to try (HTTP ${reply.status}): ${doc.detail || doc.title || ""}`;
    verdict.className = "verdict bad";
  } else if (doc.shadow && doc.would_deny) {
    verdict.textContent = `${body.rule} / ${body.key}: allowed (shadow rule; would deny)`;
    verdict.className = "verdict bad";
  } else {
    const what = doc.allowed ? "would be allowed" : `would be denied, retry after ${doc.retry_after} s`;
    verdict.textContent = `${body.rule} / ${body.key}: ${what}; remaining ${doc.remaining}`;
    verdict.className = doc.allowed ? "verdict ok" : "verdict bad";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("try-form").addEventListener("submit", tryCheck);
  refresh();
  setInterval(refresh, REFRESH_MS);
});
