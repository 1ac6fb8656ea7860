// The subc dashboard: renders the snapshots of /dashboard/api/events
// (crates/server/src/dashboard.rs) as a graph and tables. Plain DOM: every
// server string goes through textContent or an attribute, never HTML.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const BOX = { w: 112, h: 38 };
const LAYER_GAP = 150;
const ENDPOINT_GAP = 78;

let updates = 0;
let previous = null; // { at: ms, packets: Map("target:port" -> packets) }
let layoutKey = '';
let layout = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of children) e.append(c);
  return e;
}

function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function number(n) {
  return n.toLocaleString('en-US');
}

function time(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : '—';
}

// Layers by breadth-first search over every link from the device whose
// name is smallest (the routing tree's root while it is up): the same
// topology always gets the same drawing, whatever is down.
function layoutOf(net) {
  const n = net.devices.length;
  const adj = Array.from({ length: n }, () => []);
  for (const l of net.links) { adj[l.a].push(l.b); adj[l.b].push(l.a); }
  const order = [...net.devices.keys()].sort((i, j) => (net.devices[i].name < net.devices[j].name ? -1 : 1));
  const depth = new Array(n).fill(-1);
  const layers = [];
  for (const start of order) {
    if (depth[start] >= 0) continue;
    const base = layers.length;
    depth[start] = base;
    const queue = [start];
    while (queue.length) {
      const d = queue.shift();
      (layers[depth[d]] = layers[depth[d]] || []).push(d);
      for (const m of adj[d]) if (depth[m] < 0) { depth[m] = depth[d] + 1; queue.push(m); }
    }
  }
  const endpointsOf = Array.from({ length: n }, () => []);
  net.endpoints.forEach((e, i) => endpointsOf[e.device].push(i));
  const widest = Math.max(1, ...layers.map((l) => l.length), ...net.devices.map((_, d) => endpointsOf[d].length / 2));
  const width = Math.max(480, widest * 170);
  const pos = new Array(n);
  const above = layers.length > 1 && layers[0].some((d) => endpointsOf[d].length > 0);
  const top = above ? ENDPOINT_GAP + 45 : 45;
  layers.forEach((layer, k) => {
    layer.forEach((d, i) => { pos[d] = { x: ((i + 1) * width) / (layer.length + 1), y: top + k * LAYER_GAP }; });
  });
  const ends = net.endpoints.map((e, i) => {
    const mine = endpointsOf[e.device];
    const at = pos[e.device];
    const j = mine.indexOf(i);
    const side = depth[e.device] === 0 && layers.length > 1 ? -1 : 1;
    return { x: at.x + (j - (mine.length - 1) / 2) * 62, y: at.y + side * ENDPOINT_GAP };
  });
  const below = layers.length > 0 && layers[layers.length - 1].some((d) => endpointsOf[d].length > 0);
  const height = top + (layers.length - 1) * LAYER_GAP + (below ? ENDPOINT_GAP + 45 : 45);
  return { pos, ends, width, height };
}

function drawNetwork(g, net, targets) {
  const key = JSON.stringify([net.devices.map((d) => d.name), net.links.map((l) => [l.a, l.b]), net.endpoints.map((e) => [e.name, e.device])]);
  if (key !== layoutKey) { layoutKey = key; layout = layoutOf(net); }
  const { pos, ends, width, height } = layout;
  g.setAttribute('viewBox', `0 0 ${width} ${height}`);
  g.setAttribute('height', String(height));
  const state = new Map(targets.map((t) => [t.name, t]));
  net.links.forEach((l, i) => {
    const a = pos[l.a], b = pos[l.b];
    const cls = ['link', l.down ? 'down' : '', l.tree ? 'tree' : 'spare'].filter(Boolean).join(' ');
    const line = svg('line', { x1: a.x, y1: a.y, x2: b.x, y2: b.y, class: cls, 'data-link': i,
      'data-ends': `${net.devices[l.a].name}:${l.a_port} ${net.devices[l.b].name}:${l.b_port}` });
    line.append(svg('title', {}, `link ${i}: ${net.devices[l.a].name}:${l.a_port} – ${net.devices[l.b].name}:${l.b_port}${l.down ? ' (down)' : ''}`));
    g.append(line);
  });
  net.endpoints.forEach((e, i) => {
    const a = pos[e.device], p = ends[i];
    g.append(svg('line', { x1: a.x, y1: a.y, x2: p.x, y2: p.y, class: 'attach' }));
  });
  net.endpoints.forEach((e, i) => {
    const p = ends[i];
    const node = svg('g', { class: `endpoint${e.publishes ? ' publisher' : ''}`, 'data-endpoint': e.name });
    node.append(svg('circle', { cx: p.x, cy: p.y, r: 15 }));
    node.append(svg('text', { x: p.x, y: p.y + 31, class: 'label' }, e.name));
    node.append(svg('title', {}, `endpoint ${e.name} at ${net.devices[e.device].name}:${e.port}${e.publishes ? ', publishes' : ''}`));
    g.append(node);
  });
  net.devices.forEach((d, i) => {
    const t = state.get(d.name);
    const p = pos[i];
    const cls = ['device', d.down ? 'down' : '', t && t.state === 'failing' ? 'failing' : ''].filter(Boolean).join(' ');
    const node = svg('g', { class: cls, 'data-device': d.name });
    node.append(svg('rect', { x: p.x - BOX.w / 2, y: p.y - BOX.h / 2, width: BOX.w, height: BOX.h, rx: 7 }));
    node.append(svg('text', { x: p.x, y: p.y - 2, class: 'name' }, d.name));
    node.append(svg('text', { x: p.x, y: p.y + 12, class: 'kind' }, d.down ? `${d.kind} · down` : `${d.kind} · ${t ? t.state.replace('_', ' ') : '?'}`));
    node.append(svg('title', {}, `${d.name} (${d.kind})${d.down ? ', down' : ''}${t ? `: ${t.entries} entries, generation ${t.deployed_generation}` : ''}`));
    g.append(node);
  });
}

// A single device (no topology): each target a node.
function drawTargets(g, targets) {
  const width = Math.max(480, targets.length * 170);
  g.setAttribute('viewBox', `0 0 ${width} 90`);
  g.setAttribute('height', '90');
  targets.forEach((t, i) => {
    const x = ((i + 1) * width) / (targets.length + 1), y = 45;
    const node = svg('g', { class: `device${t.state === 'failing' ? ' failing' : ''}`, 'data-device': t.name });
    node.append(svg('rect', { x: x - BOX.w / 2, y: y - BOX.h / 2, width: BOX.w, height: BOX.h, rx: 7 }));
    node.append(svg('text', { x, y: y - 2, class: 'name' }, t.name));
    node.append(svg('text', { x, y: y + 12, class: 'kind' }, `${t.kind} · ${t.state.replace('_', ' ')}`));
    g.append(node);
  });
}

function renderGraph(s) {
  const g = document.getElementById('graph');
  g.replaceChildren();
  document.getElementById('graph-title').textContent = s.network ? 'Topology' : 'Targets (no topology)';
  document.querySelector('.legend').hidden = !s.network;
  if (s.network) drawNetwork(g, s.network, s.targets);
  else drawTargets(g, s.targets);
}

function renderTargets(s) {
  const rows = s.targets.map((t) => el('tr', { 'data-target': t.name, class: t.state },
    el('td', {}, t.name), el('td', {}, t.kind), el('td', { class: 'state' }, t.state.replace('_', ' ')),
    el('td', { class: 'num' }, `${t.deployed_generation} / ${s.generation}`),
    el('td', { class: 'num' }, t.budget == null ? number(t.entries) : `${number(t.entries)} / ${number(t.budget)}`),
    el('td', { class: 'num' }, number(t.groups)), el('td', {}, time(t.last_deploy_ms)),
    el('td', { class: 'error' }, t.last_error)));
  document.querySelector('#targets tbody').replaceChildren(...rows);
}

function renderPorts(s) {
  const now = Date.now();
  const packets = new Map();
  const rows = [];
  for (const t of s.targets) {
    for (const p of t.ports) {
      const key = `${t.name}:${p.port}`;
      packets.set(key, p.packets);
      let rate = '';
      if (previous && previous.packets.has(key) && now > previous.at) {
        rate = ((p.packets - previous.packets.get(key)) * 1000 / (now - previous.at)).toFixed(1);
      }
      rows.push(el('tr', {}, el('td', {}, t.name), el('td', { class: 'num' }, String(p.port)),
        el('td', { class: 'num', 'data-counter': `${key}:packets` }, number(p.packets)),
        el('td', { class: 'num', 'data-counter': `${key}:bytes` }, number(p.bytes)),
        el('td', { class: 'num rate' }, rate)));
    }
  }
  if (rows.length === 0) rows.push(el('tr', {}, el('td', { colspan: 5, class: 'none' }, 'no packets delivered yet')));
  previous = { at: now, packets, interval: s.interval_ms };
  document.querySelector('#ports tbody').replaceChildren(...rows);
}

// The server sends a state only when something changed, and reads the
// counters every interval: after two intervals without one, nothing moved.
function settleRates() {
  if (previous && Date.now() - previous.at > 2 * previous.interval) {
    for (const cell of document.querySelectorAll('#ports td.rate')) if (cell.textContent !== '') cell.textContent = '0.0';
  }
}

function renderEvents(s) {
  const items = s.events.slice().reverse().map((e) => {
    const what = [e.kind.replace(/_/g, ' '), e.target, e.app && `app ${e.app}`,
      e.subscriptions ? `${e.subscriptions} subscription(s)` : '', e.entries ? `${e.entries} entries` : '', `generation ${e.generation}`]
      .filter(Boolean).join(' · ');
    return el('li', { value: e.seq, class: e.kind }, el('time', {}, time(e.time_ms)), ' ', what, e.error ? el('span', { class: 'error' }, ` ${e.error}`) : '');
  });
  if (items.length === 0) items.push(el('li', { class: 'none' }, 'no events since the server started'));
  document.getElementById('events').replaceChildren(...items);
}

function render(s) {
  renderGraph(s);
  renderTargets(s);
  renderPorts(s);
  renderEvents(s);
  const down = s.network ? s.network.links.filter((l) => l.down).length + s.network.devices.filter((d) => d.down).length : 0;
  document.getElementById('summary').textContent =
    `generation ${s.generation} · ${s.targets.length} target(s)` + (s.network ? ` · ${s.network.devices.length} devices, ${s.network.links.length} links, ${down} down` : '');
  updates += 1;
  document.body.dataset.updates = String(updates);
  document.body.dataset.generation = String(s.generation);
}

function connect() {
  const live = document.getElementById('live');
  const events = new EventSource('/dashboard/api/events');
  events.addEventListener('snapshot', (e) => {
    live.textContent = `live · ${new Date().toLocaleTimeString()}`;
    live.className = 'live ok';
    render(JSON.parse(e.data));
  });
  events.onerror = () => {
    // The browser reconnects by itself, unless the server refused the
    // stream: signed out (the page is then the login form), or a replica
    // that stands by (the page then names the writer). Reloading shows which.
    if (events.readyState === EventSource.CLOSED) {
      live.textContent = 'disconnected';
      live.className = 'live';
      setTimeout(() => window.location.reload(), 2000);
    } else {
      live.textContent = 'reconnecting…';
      live.className = 'live';
    }
  };
}

connect();
setInterval(settleRates, 1000);
