"""The status page (`GET /status` on the admin listener): one HTML document with its style and
script inline and nothing else. It carries no data of its own: the script fetches
`status.json` from the same origin every REFRESH_MS and builds the page with `textContent` and
DOM calls only (never HTML from strings), so a backend name or an error text is always shown
as text. The Content-Security-Policy allows exactly this script and this style (by their
hashes) and fetches from the page's own origin; nothing else loads or runs.
"""

from __future__ import annotations

import base64
import hashlib

REFRESH_MS = 2000

STYLE = """
:root { color-scheme: light dark; --ok: #1a7f37; --bad: #cf222e; --warn: #9a6700;
  --line: #8884; --muted: #6e7781; --bar: #0969da; --p99: #bf3989; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5rem; max-width: 80rem; }
h1 { font-size: 1.4rem; margin: 0 0 .25rem; }
h2 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
.muted { color: var(--muted); }
table { border-collapse: collapse; width: 100%; }
table.narrow { width: auto; }
td.time { white-space: nowrap; }
td.last { min-width: 14rem; }
th, td { text-align: left; padding: .3rem .5rem; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { font-weight: 600; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: .6rem; color: #fff;
  font-size: 12px; font-weight: 600; }
.up { background: var(--ok); } .down { background: var(--bad); }
.starting { background: var(--warn); }
.error { color: var(--bad); word-break: break-word; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(24rem, 1fr));
  gap: 1rem; }
.chart { border: 1px solid var(--line); border-radius: .4rem; padding: .5rem; }
.chart svg { width: 100%; height: 120px; display: block; }
.chart .bars { fill: var(--bar); } .chart .errs { fill: var(--bad); }
.chart .p99 { fill: none; stroke: var(--p99); stroke-width: 1.5; }
.chart .axis { stroke: var(--line); } .chart .dot { fill: var(--p99); }
.legend { font-size: 12px; }
.legend .b { color: var(--bar); } .legend .e { color: var(--bad); }
.legend .p { color: var(--p99); }
#stale { color: var(--bad); }
"""

SCRIPT = """
'use strict';
const REFRESH_MS = REFRESH;
const SVG = 'http://www.w3.org/2000/svg';
let refreshes = 0;

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}
function row(cells) {
  const tr = document.createElement('tr');
  for (const cell of cells) tr.append(cell);
  return tr;
}
function num(value, digits) {
  if (value === null || value === undefined) return el('td', '\\u2013', 'num');
  if (digits === undefined) return el('td', value, 'num');
  const n = Number(value);
  return el('td', n.toFixed(n && Math.abs(n) < 1 ? Math.max(digits, 2) : digits), 'num');
}
function duration(seconds) {
  const s = Math.floor(seconds);
  const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600);
  const m = Math.floor(s % 3600 / 60);
  return (d ? d + 'd ' : '') + (d || h ? h + 'h ' : '') + m + 'm ' + (s % 60) + 's';
}
function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

function chart(backend, slotSeconds) {
  const box = el('div', null, 'chart');
  box.dataset.backend = backend.name;
  box.append(el('strong', backend.name));
  const points = backend.series;
  const W = 600, H = 120, n = points.length, bw = W / n;
  const most = Math.max(1, ...points.map((p) => p.requests));
  const slowest = Math.max(1, ...points.map((p) => p.p99_ms || 0));
  const root = svg('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none',
    role: 'img', 'aria-label': `requests and p99 latency of ${backend.name}` });
  root.append(svg('line', { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'axis' }));
  const path = [], dots = [];
  points.forEach((p, i) => {
    if (p.requests) {
      const h = (p.requests / most) * (H - 10);
      root.append(svg('rect', { x: i * bw + 1, y: H - h, width: bw - 2, height: h,
        class: 'bars' }));
      if (p.errors) {
        const eh = (p.errors / most) * (H - 10);
        root.append(svg('rect', { x: i * bw + 1, y: H - eh, width: bw - 2, height: eh,
          class: 'errs' }));
      }
    }
    if (p.p99_ms !== null) {
      const y = H - 2 - (p.p99_ms / slowest) * (H - 12);
      path.push(`${path.length ? 'L' : 'M'}${(i + 0.5) * bw},${y.toFixed(1)}`);
      dots.push(svg('circle', { cx: (i + 0.5) * bw, cy: y.toFixed(1), r: 2.5, class: 'dot' }));
    }
  });
  if (path.length) root.append(svg('path', { d: path.join(' '), class: 'p99' }), ...dots);
  box.append(root);
  const legend = el('div', null, 'legend muted');
  legend.append(el('span', `\\u25A0 requests per ${slotSeconds} s (max ${most})`, 'b'), ' ',
    el('span', '\\u25A0 errors', 'e'), ' ',
    el('span', `\\u2014 p99 (max ${slowest.toFixed(1)} ms)`, 'p'),
    ` \\u00B7 last ${Math.round(n * slotSeconds / 60)} min`);
  box.append(legend);
  return box;
}

function render(data) {
  const g = data.gateway;
  document.getElementById('version').textContent = g.version;
  document.getElementById('uptime').textContent = duration(g.uptime_seconds);
  document.getElementById('started').textContent = g.started;
  document.getElementById('now').textContent = g.now;
  document.getElementById('state').textContent =
    g.draining ? 'draining' : g.serving ? 'serving' : 'starting';
  const listeners = document.getElementById('listeners');
  listeners.replaceChildren(...Object.entries(g.listeners).map(([name, where]) =>
    row([el('th', name), el('td', where === null ? 'off' : where)])));

  const kinds = (m) => `${m.tools} / ${m.prompts} / ${m.resources} / ${m.templates}`;
  document.getElementById('servers').replaceChildren(...(data.servers || []).map((s) => {
    const parts = Object.entries(s.backend_tokens).sort((a, b) => b[1] - a[1])
      .map(([name, tokens]) => `${name} ${tokens}`).join(', ');
    const total = num(s.total_tokens);
    total.classList.add('total');
    const tr = row([el('th', s.name), el('td', kinds(s.items), 'num'),
      el('td', kinds(s.tokens), 'num'), total, el('td', parts || '\u2013')]);
    tr.dataset.server = s.name;
    return tr;
  }));

  const body = document.getElementById('backends');
  body.replaceChildren(...data.backends.map((b) => {
    const health = el('td');
    health.append(el('span', b.health, 'badge ' + b.health));
    if (b.breaker && b.breaker !== 'closed') {
      health.append(' ', el('span', 'breaker ' + b.breaker.replace('_', '-'),
        b.breaker === 'open' ? 'badge down' : 'badge starting'));
    }
    const c = b.catalog;
    const last = el('td', null, 'last');
    if (b.down_reason) last.append(el('div', `down: ${b.down_reason}`, 'error'));
    if (b.last_error) {
      last.append(el('div', `${b.last_error.time} ${b.last_error.method || ''} ` +
        `(${b.last_error.code})`, 'muted'), el('div', b.last_error.message, 'error'));
    }
    const tr = row([el('th', b.name), el('td', b.transport), el('td', b.era), health,
      num(b.in_flight), el('td', c ? `${c.tools} / ${c.prompts} / ${c.resources} / ` +
        `${c.templates}` : '\\u2013', 'num'),
      num(b.rate_per_second, 2), num(b.p50_ms, 1), num(b.p99_ms, 1),
      num(b.requests), num(b.errors), last]);
    tr.dataset.backend = b.name;
    tr.cells[9].classList.add('requests');
    return tr;
  }));
  document.getElementById('charts').replaceChildren(
    ...data.backends.map((b) => chart(b, data.slot_seconds)));

  const errors = document.getElementById('errors');
  errors.replaceChildren(...data.recent_errors.map((e) => row([el('td', e.time, 'time'),
    el('td', e.backend), el('td', e.method), el('td', e.code), el('td', e.message, 'error')])));
  document.getElementById('no-errors').hidden = data.recent_errors.length > 0;
  const held = data.awaiting_approval;
  document.getElementById('pins').hidden = held === undefined;
  document.getElementById('held').replaceChildren(...(held || []).map((h) => row([
    el('td', h.backend), el('td', h.kind), el('td', h.name), el('td', h.status),
    el('td', h.served ? 'served' : 'blocked', h.served ? 'badge starting' : 'badge down')])));
  document.getElementById('no-held').hidden = (held || []).length > 0;
  refreshes += 1;
  document.body.dataset.refreshes = String(refreshes);
  document.getElementById('stale').textContent = '';
}

async function refresh() {
  try {
    const resp = await fetch('status.json', { cache: 'no-store' });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    render(await resp.json());
  } catch (error) {
    document.getElementById('stale').textContent = `not updated: ${error.message}`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
""".replace("REFRESH;", f"{REFRESH_MS};", 1)

PAGE = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mcp-gateway status</title>
<style>{STYLE}</style>
</head>
<body>
<h1>mcp-gateway <span id="version"></span></h1>
<div class="muted">up <span id="uptime">&ndash;</span> &middot; started <span id="started"></span>
&middot; <span id="state"></span> &middot; as of <span id="now"></span>
<span id="stale"></span></div>
<h2>Listeners</h2>
<table class="narrow"><tbody id="listeners"></tbody></table>
<h2>Servers</h2>
<table>
<thead><tr><th>server</th><th>tools / prompts / resources / templates</th>
<th>tokens: tools / prompts / resources / templates</th><th>tokens</th>
<th>tokens by backend</th></tr></thead>
<tbody id="servers"></tbody>
</table>
<div class="muted">What showing each server's lists costs a model: an estimate
(docs/guides/context-budget.md).</div>
<h2>Backends</h2>
<table>
<thead><tr><th>name</th><th>transport</th><th>era</th><th>health</th><th>in flight</th>
<th>tools / prompts / resources / templates</th><th>req/s</th><th>p50 ms</th><th>p99 ms</th>
<th>requests</th><th>errors</th><th>last error</th></tr></thead>
<tbody id="backends"></tbody>
</table>
<div class="muted">Rates, percentiles and counts: the last 5 minutes.</div>
<h2>Requests and latency</h2>
<div class="charts" id="charts"></div>
<h2>Recent errors</h2>
<table>
<thead><tr><th>time</th><th>backend</th><th>method</th><th>code</th><th>message</th></tr></thead>
<tbody id="errors"></tbody>
</table>
<p id="no-errors" class="muted">None.</p>
<div id="pins" hidden>
<h2>Awaiting approval</h2>
<table>
<thead><tr><th>backend</th><th>kind</th><th>name</th><th>definition</th><th>meanwhile</th>
</tr></thead>
<tbody id="held"></tbody>
</table>
<p id="no-held" class="muted">None: every definition is as pinned.</p>
</div>
<script>{SCRIPT}</script>
</body>
</html>
""".encode()


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# Only this page's own script and style run; it may fetch from its own origin, and nothing may
# frame it, load into it, or submit from it.
CSP = "; ".join(
    [
        "default-src 'none'",
        f"script-src {_hash(SCRIPT)}",
        f"style-src {_hash(STYLE)}",
        "connect-src 'self'",
        "img-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
