// The gateway's web console. It talks only to the gateway's public REST API (/api/v1), with
// the API key kept in sessionStorage (never a URL, never a cookie). Preact + htm, no build.
import { h, render } from "./vendor/preact-10.29.8.js";
import { useCallback, useEffect, useLayoutEffect, useRef, useState } from "./vendor/preact-hooks-10.29.8.js";
import htm from "./vendor/htm-3.1.1.js";
import { amount, micros, usd, usdFromMicros } from "./money.js";

const html = htm.bind(h);
const API = "/api/v1";
const KEY_SLOT = "gateway-console-key";
const PAGE = 20;

// ---- talking to the API -------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message, metadata) {
    super(message);
    this.status = status;
    this.metadata = metadata || {};
  }
}

const LIMIT_SOURCES = {
  openrouter_credits: "the account has run out of credits",
  openrouter_key_limit: "this key has reached its spending limit",
  openrouter_in_flight_budget: "requests still running hold the rest of the budget; try again in a moment",
  openrouter_guardrail_budget: "a guardrail's budget is spent",
};

// Every API error in words a person understands (the server's own message follows).
function explain(error) {
  if (!(error instanceof ApiError)) return `Something went wrong in the console: ${error.message}`;
  const m = error.message ? ` (${error.message})` : "";
  const param = error.metadata.param ? ` Check the field “${error.metadata.param}”.` : "";
  switch (error.status) {
    case 0: return "The gateway could not be reached. Check that it is running and your connection, then try again.";
    case 400: return `The gateway did not accept what was sent${m}.${param}`;
    case 401: return `This API key was not accepted: it may be mistyped, disabled, expired or deleted${m}. Sign in again with a valid key.`;
    case 402: return `Not enough credit: ${LIMIT_SOURCES[error.metadata.limit_source] || "the balance or a limit is reached"}${m}.`;
    case 403: return `This key is not allowed to do that${m}.`;
    case 404: return `Nothing was found there${m}.`;
    case 408: return "The request took too long to send. Try again.";
    case 409: return `That is not ready yet${m}.`;
    case 410: return `That is no longer available${m}.`;
    case 413: return "That is too large for the gateway to accept.";
    case 429: return `Too many requests right now${m}. Wait a moment and try again.`;
    case 503: return `The service is unavailable at the moment${m}. Try again later.`;
    default:
      if (error.status >= 500) return `The gateway or a provider failed (HTTP ${error.status})${m}. Try again later.`;
      return `The request failed (HTTP ${error.status})${m}.`;
  }
}

function storedKey() {
  return sessionStorage.getItem(KEY_SLOT);
}

// The service worker (sw.js) gives the player's requests the key; it learns it from here.
function tellWorker() {
  const worker = navigator.serviceWorker?.controller;
  if (worker) worker.postMessage({ type: "key", key: storedKey() });
}

if ("serviceWorker" in navigator) {
  navigator.serviceWorker.register("sw.js", { scope: "./" }).catch(() => {});
  navigator.serviceWorker.addEventListener("controllerchange", tellWorker);
  navigator.serviceWorker.addEventListener("message", (event) => {
    if (event.data?.type === "key?" && event.ports[0]) event.ports[0].postMessage(storedKey());
  });
  tellWorker();
}

// Resolves true once the service worker controls this page (it claims it when it starts).
function workerReady(timeoutMs = 3000) {
  if (!("serviceWorker" in navigator)) return Promise.resolve(false);
  if (navigator.serviceWorker.controller) return Promise.resolve(true);
  return new Promise((resolve) => {
    const done = () => resolve(Boolean(navigator.serviceWorker.controller));
    navigator.serviceWorker.addEventListener("controllerchange", done, { once: true });
    setTimeout(done, timeoutMs);
  });
}

// The operator key (`gateway up` writes it to <data dir>/operator-key) opens the operator's
// pages; any other key is an API key, described by GET /key.
const OPERATOR_PREFIX = "sk-gw-op-";

async function whoAmI() {
  if ((storedKey() || "").startsWith(OPERATOR_PREFIX)) {
    await api("/workspaces?limit=1");  // a 401 unless it is the operator key
    return { operator: true, label: "operator key" };
  }
  return (await api("/key")).data;
}

async function api(path, { method = "GET", body, raw = false } = {}) {
  const headers = {};
  const key = storedKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(API + path, {
      method, headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (_) {
    throw new ApiError(0, "");
  }
  if (!response.ok) {
    let detail = {};
    try { detail = (await response.json()).error || {}; } catch (_) { /* not JSON */ }
    throw new ApiError(response.status, detail.message || response.statusText, detail.metadata);
  }
  if (raw) return response;
  if (response.status === 204) return null;
  const text = await response.text();
  return text ? JSON.parse(text) : null;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(name, String(value));
  }
  const s = q.toString();
  return s ? `?${s}` : "";
}

// A list of hosts, models or providers typed as "a, b c".
function words(text) {
  return text.split(/[\s,]+/).map((w) => w.trim()).filter(Boolean);
}

// ---- formatting -----------------------------------------------------------------------------

function when(value) {
  if (!value) return "—";
  const d = new Date(value);
  return isNaN(d) ? String(value) : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function short(hash) {
  return hash ? `${hash.slice(0, 10)}…` : "—";
}

// ---- small components -----------------------------------------------------------------------

function ErrorBox({ error }) {
  if (!error) return null;
  return html`<p class="error" role="alert">${explain(error)}</p>`;
}

function Status({ value }) {
  return html`<span class=${`status ${value}`}>${String(value).replace("_", " ")}</span>`;
}

function Field({ id, label, children }) {
  return html`<div class="field"><label for=${id}>${label}</label>${children}</div>`;
}

function Pager({ offset, total, count, limit = PAGE, onMove, label }) {
  const shown = total === undefined ? count : total;
  return html`<nav class="pager" aria-label=${`${label} pages`}>
    <button class="secondary" type="button" disabled=${offset === 0}
      onClick=${() => onMove(Math.max(0, offset - limit))}>Previous page</button>
    <span>${count ? `${offset + 1}–${offset + count}` : "0"}${total !== undefined ? ` of ${shown}` : ""}</span>
    <button class="secondary" type="button"
      disabled=${total !== undefined ? offset + count >= total : count < limit}
      onClick=${() => onMove(offset + limit)}>Next page</button>
  </nav>`;
}

// A button that asks once more before doing something that cannot be undone.
function ConfirmButton({ label, confirmLabel, onConfirm, disabled, warning }) {
  const [armed, setArmed] = useState(null);  // null: never asked; true: asking; false: cancelled
  const confirm = useRef(null);
  const first = useRef(null);
  // The keyboard stays where the question is: on the confirming button, back on the first
  // one after Cancel or Escape. Moved as the buttons are put in place (a layout effect), not
  // after the paint: by then the user may have begun on another field, and would lose it.
  useLayoutEffect(() => {
    if (armed && confirm.current) confirm.current.focus();
    if (armed === false && first.current) first.current.focus();
  }, [armed]);
  const confirmed = async () => {
    // The row (and this button) may go: the keyboard then stays in its table, not the page.
    const around = confirm.current?.closest("[role=region]") || document.querySelector("main h1");
    setArmed(null);
    await onConfirm();
    if (!document.activeElement || document.activeElement === document.body) around?.focus();
  };
  if (!armed) {
    return html`<button class="secondary" type="button" disabled=${disabled} ref=${first}
      onClick=${() => setArmed(true)}>${label}</button>`;
  }
  return html`<span class="actions" onKeyDown=${(e) => { if (e.key === "Escape") setArmed(false); }}>
    ${warning ? html`<span class="warning" id=${`warn-${confirmLabel}`}>${warning}</span>` : null}
    <button class="danger" type="button" ref=${confirm} onClick=${confirmed}
      aria-describedby=${warning ? `warn-${confirmLabel}` : undefined}>${confirmLabel}</button>
    <button class="secondary" type="button" onClick=${() => setArmed(false)}>Cancel</button>
  </span>`;
}

// Copies a secret shown once, and says so (or says to copy it by hand).
function CopyButton({ text }) {
  const [said, setSaid] = useState("");
  const copy = () => {
    if (!navigator.clipboard) { setSaid("Copy by hand: select the key and copy it."); return; }
    navigator.clipboard.writeText(text).then(
      () => setSaid("Copied"),
      () => setSaid("Copy by hand: select the key and copy it."),
    );
  };
  return html`<button type="button" onClick=${copy}>Copy</button><span role="status" class="copied">${said}</span>`;
}

// An inline form that Escape closes, as its Cancel button does.
function onEscape(cancel) {
  return (event) => { if (event.key === "Escape") { event.preventDefault(); cancel(); } };
}

// A cell of a `stack` table: on a phone its column's name is shown beside it (hidden from
// assistive technology, which has the column header).
function Cell({ label, num = false, mono = false, children }) {
  const cls = [num ? "num" : "", mono ? "mono" : ""].filter(Boolean).join(" ") || undefined;
  return html`<td role="cell" class=${cls}><span class="cell-label" aria-hidden="true">${label}</span>${children}</td>`;
}

function Table({ label, children, stack = false }) {
  // A region the keyboard can scroll when the table is wider than the screen. A `stack` table
  // becomes one card per row on a phone (app.css): its rows and cells carry their roles
  // explicitly, since a table laid out as blocks loses them otherwise.
  return html`<div class=${stack ? "table-wrap stack" : "table-wrap"} role="region" aria-label=${label} tabindex="0">
    <table role=${stack ? "table" : undefined}>${children}</table></div>`;
}

// Loads `load()` when `deps` change; returns [data, error, reload].
function useLoad(load, deps) {
  const [state, setState] = useState({ data: undefined, error: null });
  const reload = useCallback(() => {
    let live = true;
    load().then(
      (data) => live && setState({ data, error: null }),
      (error) => live && setState({ data: null, error }),
    );
    return () => { live = false; };
  }, deps);
  useEffect(reload, [reload]);
  return [state.data, state.error, reload];
}

function Restricted() {
  return html`<p class="notice" role="status">This page needs a management key. You signed in with a standard key:
    it uses the models and its vault, and sees what it made itself (its usage, activity and videos).</p>`;
}

// ---- charts ---------------------------------------------------------------------------------

const COLORS = ["#1f4bd8", "#d9480f", "#2b8a3e", "#862e9c", "#c2255c", "#0b7285", "#5c940d", "#495057"];

function Chart({ title, days, series }) {
  const box = useRef(null);
  useEffect(() => {
    const el = box.current;
    if (!el || !window.uPlot || !series.length) return undefined;
    const x = days.map((d) => Date.parse(`${d}T00:00:00Z`) / 1000);
    const width = Math.max(280, el.clientWidth - 16);
    const plot = new window.uPlot({
      width, height: 220, tzDate: (ts) => window.uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      series: [{}, ...series.map((s, i) => ({
        label: s.label, stroke: COLORS[i % COLORS.length], width: 2,
        value: (_, v) => (v === null ? "—" : usd(v)),
      }))],
      axes: [{}, { values: (_, ticks) => ticks.map((t) => usd(t)), size: 96 }],
      scales: { x: { time: true } },
    }, [x, ...series.map((s) => s.values)], el);
    // Follow the page's width (a phone turned, a window resized).
    const fit = () => plot.setSize({ width: Math.max(280, el.clientWidth - 16), height: 220 });
    window.addEventListener("resize", fit);
    return () => { window.removeEventListener("resize", fit); plot.destroy(); };
  }, [days, series]);
  return html`<figure class="chart" aria-label=${title}>
    <figcaption><strong>${title}</strong></figcaption>
    ${series.length ? html`<div ref=${box}></div>` : html`<p class="muted">No spend in these days.</p>`}
    ${series.length ? html`<details><summary>${title} as a table</summary>
      <${Table} label=${`${title} table`}>
        <thead><tr><th>Day (UTC)</th>${series.map((s) => html`<th class="num">${s.label}</th>`)}</tr></thead>
        <tbody>${days.map((d, i) => html`<tr><td>${d}</td>${series.map((s) => html`<td class="num">${usd(s.values[i])}</td>`)}</tr>`)}</tbody>
      <//></details>` : null}
  </figure>`;
}

function last30Days() {
  const days = [];
  const today = new Date();
  for (let i = 29; i >= 0; i -= 1) {
    const d = new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i));
    days.push(d.toISOString().slice(0, 10));
  }
  return days;
}

// Spend per day by `pick(row)` (a model, a key), from /activity rows.
function seriesBy(rows, days, pick, name) {
  const index = new Map(days.map((d, i) => [d, i]));
  const groups = new Map();
  for (const row of rows) {
    const group = pick(row);
    if (!groups.has(group)) groups.set(group, days.map(() => 0));
    const i = index.get(row.date);
    if (i !== undefined) groups.get(group)[i] += micros(row.usage) + micros(row.byok_usage_inference);
  }
  return [...groups.entries()].map(([group, values]) => ({ label: name(group), values: values.map((m) => m / 1e6) }));
}

// ---- pages ----------------------------------------------------------------------------------

function SignIn({ onSignedIn }) {
  const [error, setError] = useState(null);
  const [busy, setBusy] = useState(false);
  const submit = async (event) => {
    event.preventDefault();
    const key = event.target.elements.key.value.trim();
    if (!key) return;
    setBusy(true);
    sessionStorage.setItem(KEY_SLOT, key);
    try {
      const me = await whoAmI();
      event.target.reset();
      tellWorker();
      onSignedIn(me);
    } catch (e) {
      sessionStorage.removeItem(KEY_SLOT);
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return html`<main id="main" class="signin">
    <div class="panel">
      <h1>Sign in to the gateway console</h1>
      <p class="muted">Use an API key, or the operator key (the file <code>operator-key</code> in the gateway's data directory).
        It stays in this browser tab only and is forgotten when you close it.</p>
      <form onSubmit=${submit}>
        <${Field} id="key" label="API key"><input id="key" name="key" type="password" autocomplete="off" required /><//>
        <p><button type="submit" disabled=${busy}>Sign in</button></p>
      </form>
      <${ErrorBox} error=${error} />
    </div>
  </main>`;
}

function UsagePage({ me }) {
  const management = me.is_management_key;
  const [activity, error] = useLoad(() => api(`/activity${query({ group_by: management ? "api_key" : "" })}`), [management]);
  const [keys] = useLoad(() => (management ? api("/keys?include_disabled=true") : Promise.resolve(null)), [management]);
  const days = last30Days();
  const today = days[days.length - 1];
  const names = new Map((keys?.data || []).map((k) => [k.hash, k.name]));
  const rows = activity?.data || [];
  const free = me.free_model_daily_requests || {};
  // A management key's activity is its workspace's: every key's rows.
  const spentToday = rows.filter((r) => r.date === today).reduce((sum, r) => sum + micros(r.usage), 0);
  const spent30 = rows.reduce((sum, r) => sum + micros(r.usage), 0);
  return html`<section>
    <section aria-labelledby="usage-key"><h2 id="usage-key">This key</h2>
    <div class="cards">
      <div class="card"><div class="label">Spent today</div><div class="value" data-testid="usage-daily">${usd(me.usage_daily)}</div></div>
      <div class="card"><div class="label">Spent this week</div><div class="value">${usd(me.usage_weekly)}</div></div>
      <div class="card"><div class="label">Spent this month</div><div class="value">${usd(me.usage_monthly)}</div></div>
      <div class="card"><div class="label">Limit remaining</div><div class="value">${me.limit === null ? "No limit" : usd(me.limit_remaining)}</div>
        <div class="label">${me.limit === null ? "" : `of ${usd(me.limit)}${me.limit_reset ? `, resets ${me.limit_reset}` : ""}`}</div></div>
    </div></section>
    ${management ? html`<section aria-labelledby="usage-workspace"><h2 id="usage-workspace">Workspace ${me.workspace_name}</h2>
    <div class="cards">
      <div class="card"><div class="label">Spent today, every key</div><div class="value" data-testid="workspace-daily">${activity ? usdFromMicros(spentToday) : "…"}</div></div>
      <div class="card"><div class="label">Spent in the last 30 days</div><div class="value">${activity ? usdFromMicros(spent30) : "…"}</div></div>
    </div></section>` : null}
    <section aria-labelledby="usage-account"><h2 id="usage-account">Account</h2>
    <div class="cards">
      <div class="card"><div class="label">Free-model requests today (the whole account)</div>
        <div class="value">${free.used ?? 0} / ${free.limit ?? "—"}</div>
        <meter class="meter" min="0" max=${free.limit || 1} value=${free.used || 0} aria-label="Free-model requests used today"></meter></div>
    </div></section>
    <h2>Spend per day${management ? ", every key" : ""}</h2>
    <${ErrorBox} error=${error} />
    ${activity === undefined ? html`<p class="muted" role="status">Loading spend…</p>` : null}
    ${activity ? html`<${SpendExplorer} rows=${rows} days=${days} management=${management} names=${names} />` : null}
  </section>`;
}

const GROUPS = {
  model: { title: "By model", pick: (r) => r.model, name: (m) => m },
  key: { title: "By key", pick: (r) => r.api_key_hash, name: null },
  provider: { title: "By provider", pick: (r) => r.provider_name, name: (p) => p },
};

function csvCell(value) {
  let text = String(value ?? "");
  // A name a spreadsheet would run as a formula is written as text.
  if (/^[=+@\t\r]|^-[^0-9]/.test(text)) text = `'${text}`;
  return /[",\n\r]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

// The spend of a date range (within the 30 days /activity keeps), grouped by model, key or
// provider, as a chart, a table and a CSV file.
function SpendExplorer({ rows, days, management, names }) {
  const [range, setRange] = useState({ from: days[0], to: days[days.length - 1], group: management ? "key" : "model" });
  const [exported, setExported] = useState("");
  const apply = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    const from = f.from.value || days[0];
    const to = f.to.value || days[days.length - 1];
    setRange({ from: from <= to ? from : to, to: from <= to ? to : from, group: f.group.value });
    setExported("");
  };
  const keyName = (k) => names.get(k) || short(k);
  const group = GROUPS[range.group];
  const shown = days.filter((d) => d >= range.from && d <= range.to);
  const picked = rows.filter((r) => r.date >= range.from && r.date <= range.to);
  const exportCsv = () => {
    const header = ["date", "model", "provider", ...(management ? ["api_key_hash", "api_key_name"] : []), "requests", "usage_usd", "byok_usage_usd"];
    const lines = [header.join(",")];
    for (const r of [...picked].sort((a, b) => (a.date < b.date ? -1 : a.date > b.date ? 1 : 0))) {
      lines.push([r.date, r.model, r.provider_name, ...(management ? [r.api_key_hash, names.get(r.api_key_hash) || ""] : []),
        r.requests, usd(r.usage).replace(/^\$/, "").replace(/,/g, ""), usd(r.byok_usage_inference).replace(/^\$/, "").replace(/,/g, "")]
        .map(csvCell).join(","));
    }
    const name = `spend-${range.from}-${range.to}-by-${range.group}.csv`;
    const url = URL.createObjectURL(new Blob([`${lines.join("\r\n")}\r\n`], { type: "text/csv" }));
    const link = document.createElement("a");
    link.href = url;
    link.download = name;
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);  // once the browser has the file
    setExported(`Exported ${picked.length} row${picked.length === 1 ? "" : "s"} to ${name}.`);
  };
  return html`<form class="inline panel" onSubmit=${apply} aria-label="Choose the spend shown">
      <${Field} id="spend-from" label="From (UTC)"><input id="spend-from" name="from" type="date" min=${days[0]} max=${days[days.length - 1]} defaultValue=${range.from} /><//>
      <${Field} id="spend-to" label="To (UTC)"><input id="spend-to" name="to" type="date" min=${days[0]} max=${days[days.length - 1]} defaultValue=${range.to} /><//>
      <${Field} id="spend-group" label="Group by"><select id="spend-group" name="group">
        ${[["model", "Model"], ...(management ? [["key", "Key"]] : []), ["provider", "Provider"]].map(([v, label]) => html`<option
          value=${v} selected=${range.group === v}>${label}</option>`)}</select><//>
      <button type="submit">Show spend</button>
      <button type="button" class="secondary" onClick=${exportCsv}>Export CSV</button>
    </form>
    ${exported ? html`<p class="notice" role="status">${exported}</p>` : null}
    <p class="muted">The gateway keeps spend per day for the last 30 days (UTC), today included.</p>
    <${Chart} title=${group.title} days=${shown} series=${seriesBy(picked, shown, group.pick, group.name || keyName)} />`;
}

function KeysPage({ me }) {
  const [offset, setOffset] = useState(0);
  const [created, setCreated] = useState(null);
  const [rotated, setRotated] = useState(null);  // the old key, once rotated
  const [error, setError] = useState(null);
  const [editing, setEditing] = useState(null);
  const [list, loadError, reload] = useLoad(() => api(`/keys${query({ include_disabled: true, offset })}`), [offset]);
  const rotate = (key) => act(async () => {
    const answer = await api(`/keys/${key.hash}/rotate`, { method: "POST", body: {} });
    setCreated(answer.key);
    setRotated(answer.rotated);
  });
  // The keyboard follows the limit form: into it when it opens, back to its button when it
  // closes — as the form is put in place (see ConfirmButton).
  const wasEditing = useRef(null);
  useLayoutEffect(() => {
    const id = editing ? `limit-${editing}` : wasEditing.current ? `set-limit-${wasEditing.current}` : null;
    wasEditing.current = editing;
    if (id) document.getElementById(id)?.focus();
  }, [editing]);
  const act = async (work) => {
    setError(null);
    try { await work(); reload(); } catch (e) { setError(e); }
  };
  const create = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    const body = { name: f.name.value.trim() };
    const limit = amount(f.limit.value);
    if (limit !== null) body.limit = limit;
    if (f.limit_reset.value) body.limit_reset = f.limit_reset.value;
    if (f.expires_at.value) body.expires_at = new Date(`${f.expires_at.value}:00Z`).toISOString().replace(/\.\d+Z$/, "Z");
    act(async () => {
      const answer = await api("/keys", { method: "POST", body });
      setCreated(answer.key);
      setRotated(null);
      event.target.reset();
    });
  };
  const saveLimit = (key) => (event) => {
    event.preventDefault();
    const f = event.target.elements;
    act(async () => {
      await api(`/keys/${key.hash}`, { method: "PATCH", body: {
        limit: amount(f.limit.value),
        limit_reset: f.limit_reset.value || null,
      } });
      setEditing(null);
    });
  };
  const keys = list?.data || [];
  return html`<section>
    <div class="panel">
      <h2>Create a key</h2>
      <form class="inline" onSubmit=${create}>
        <${Field} id="new-key-name" label="Name"><input id="new-key-name" name="name" required maxlength="255" /><//>
        <${Field} id="new-key-limit" label="Limit (USD, optional)"><input id="new-key-limit" name="limit" type="text" inputmode="decimal" /><//>
        <${Field} id="new-key-reset" label="Limit resets"><${ResetSelect} id="new-key-reset" /><//>
        <${Field} id="new-key-expires" label="Expires (UTC, optional)"><input id="new-key-expires" name="expires_at" type="datetime-local" /><//>
        <button type="submit">Create key</button>
      </form>
      ${created ? html`<div class="secret-once">
        <p role="status"><strong>Your new key${rotated ? ` for ${rotated.name}` : ""}.</strong> Copy it now: it is shown only once.
          ${rotated ? ` The key it replaces (${rotated.label}) works until ${when(rotated.expires_at)}, then expires.` : ""}</p>
        <div class="row"><${Field} id="created-key" label="New API key">
          <input id="created-key" class="mono" readonly value=${created} data-testid="created-key" /><//>
          <${CopyButton} text=${created} />
          <button type="button" class="secondary" onClick=${() => { setCreated(null); setRotated(null); }}>Done</button></div>
      </div>` : null}
    </div>
    <${ErrorBox} error=${error || loadError} />
    <${Table} label="Keys" stack>
      <thead role="rowgroup"><tr role="row">${["Name", "Key", "Kind", "Status", "Limit", "Resets", "Today", "This month",
        "Expires (UTC)", "Last used (UTC)", "Actions"].map((c) => html`<th role="columnheader"
        class=${["Limit", "Today", "This month"].includes(c) ? "num" : undefined}>${c}</th>`)}</tr></thead>
      <tbody role="rowgroup">${keys.map((k) => html`<tr role="row" key=${k.hash}>
        <${Cell} label="Name">${k.name}<//><${Cell} label="Key" mono>${k.label}<//>
        <${Cell} label="Kind">${k.is_management_key ? "management" : "standard"}<//>
        <${Cell} label="Status">${k.disabled ? "disabled" : "active"}<//>
        <${Cell} label="Limit" num>${k.limit === null ? "none" : usd(k.limit)}<//><${Cell} label="Resets">${k.limit_reset || "never"}<//>
        <${Cell} label="Today" num>${usd(k.usage_daily)}<//><${Cell} label="This month" num>${usd(k.usage_monthly)}<//>
        <${Cell} label="Expires (UTC)">${k.expires_at ? when(k.expires_at) : "never"}<//>
        <${Cell} label="Last used (UTC)">${k.last_used_at ? when(k.last_used_at) : "—"}<//>
        <td role="cell">${editing === k.hash ? html`<form class="inline" onSubmit=${saveLimit(k)} onKeyDown=${onEscape(() => setEditing(null))}>
            <${Field} id=${`limit-${k.hash}`} label="Limit (USD, empty for none)">
              <input id=${`limit-${k.hash}`} name="limit" type="text" inputmode="decimal" value=${k.limit ?? ""} /><//>
            <${Field} id=${`reset-${k.hash}`} label="Resets"><${ResetSelect} id=${`reset-${k.hash}`} value=${k.limit_reset} /><//>
            <button type="submit">Save limit</button>
            <button type="button" class="secondary" onClick=${() => setEditing(null)}>Cancel</button></form>`
          : html`<div class="actions">
            <button type="button" class="secondary" id=${`set-limit-${k.hash}`} onClick=${() => setEditing(k.hash)}>Set limit</button>
            ${k.label === me.label ? html`<span class="muted">(this key)</span>` : html`<button type="button" class="secondary"
              onClick=${() => act(() => api(`/keys/${k.hash}`, { method: "PATCH", body: { disabled: !k.disabled } }))}>
              ${k.disabled ? "Enable" : "Disable"}</button>
            <${ConfirmButton} label="Delete" confirmLabel=${`Delete ${k.name}`}
              onConfirm=${() => act(() => api(`/keys/${k.hash}`, { method: "DELETE" }))} />`}
            ${k.disabled ? null : html`<${ConfirmButton} label="Rotate" confirmLabel=${`Rotate ${k.name}`} onConfirm=${() => rotate(k)}
              warning="A new key takes its place (same name, limit, kind, expiry and guardrails), shown once. This one keeps working for the grace period the operator set (a day unless changed), then expires." />`}</div>`}</td>
      </tr>`)}</tbody>
    <//>
    <${Pager} label="Keys" offset=${offset} count=${keys.length} limit=${100} onMove=${setOffset} />
  </section>`;
}

function ResetSelect({ id, value }) {
  return html`<select id=${id} name="limit_reset" value=${value || ""}>
    <option value="">Never</option><option value="daily">Daily</option>
    <option value="weekly">Weekly</option><option value="monthly">Monthly</option></select>`;
}

function CreditsPage({ me }) {
  const [offset, setOffset] = useState(0);
  const [credits, error] = useLoad(() => (me.is_management_key ? api("/credits") : Promise.resolve(null)), []);
  const [purchases, purchasesError] = useLoad(
    () => (me.is_management_key ? api(`/credits/purchases${query({ offset, limit: PAGE })}`) : Promise.resolve(null)),
    [offset],
  );
  if (!me.is_management_key) return html`<${Restricted} />`;
  const bought = purchases?.data || [];
  const c = credits?.data;
  // Shown to the micro-dollar: the API's amounts are exact to 6 decimals.
  const balance = c ? (Math.round(c.total_credits * 1e6) - Math.round(c.total_usage * 1e6)) / 1e6 : null;
  return html`<section>
    <${ErrorBox} error=${error} />
    ${c ? html`<div class="cards">
      <div class="card"><div class="label">Balance</div><div class="value" data-testid="balance">${usd(balance)}</div></div>
      <div class="card"><div class="label">Purchased, all time</div><div class="value">${usd(c.total_credits)}</div></div>
      <div class="card"><div class="label">Spent, all time</div><div class="value">${usd(c.total_usage)}</div></div>
    </div>
    <p class="muted">Credits are added by the operator (the console's Workspaces page, signed in with the operator key, or <code>gateway credits add --amount USD</code>).
      Spend per day is on the <a href="#/">Usage</a> page.</p>` : null}
    <h2>Purchases</h2>
    <${ErrorBox} error=${purchasesError} />
    <${Table} label="Purchases">
      <thead><tr><th>When (UTC)</th><th class="num">Amount</th></tr></thead>
      <tbody>${bought.map((p) => html`<tr key=${p.id}><td>${when(p.created_at)}</td><td class="num">${usd(p.amount)}</td></tr>`)}</tbody>
    <//>
    <${Pager} label="Purchases" offset=${offset} count=${bought.length} total=${purchases?.total_count} onMove=${setOffset} />
  </section>`;
}

function ActivityPage({ me }) {
  const [offset, setOffset] = useState(0);
  const [filters, setFilters] = useState({ api_key_hash: "", model: "", status: "", api_type: "" });
  const [list, error] = useLoad(() => api(`/generations${query({ ...filters, offset, limit: PAGE })}`), [offset, filters]);
  const [keys] = useLoad(() => (me.is_management_key ? api("/keys?include_disabled=true") : Promise.resolve(null)), []);
  const apply = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    setOffset(0);
    setFilters({
      api_key_hash: f.api_key_hash ? f.api_key_hash.value : "",
      model: f.model.value.trim(), status: f.status.value, api_type: f.api_type.value,
    });
  };
  const rows = list?.data || [];
  return html`<section>
    <form class="inline panel" onSubmit=${apply} aria-label="Filter generations">
      ${me.is_management_key ? html`<${Field} id="filter-key" label="Key">
        <select id="filter-key" name="api_key_hash"><option value="">All keys</option>
          ${(keys?.data || []).map((k) => html`<option value=${k.hash}>${k.name}</option>`)}</select><//>` : null}
      <${Field} id="filter-model" label="Model"><input id="filter-model" name="model" placeholder="e.g. local/pocketsphinx-en" /><//>
      <${Field} id="filter-status" label="Status"><select id="filter-status" name="status">
        <option value="">Any</option><option value="completed">Completed</option><option value="failed">Failed</option></select><//>
      <${Field} id="filter-type" label="Kind"><select id="filter-type" name="api_type">
        <option value="">Any</option><option value="stt">Transcription</option><option value="video">Video</option></select><//>
      <button type="submit">Apply filters</button>
    </form>
    <${ErrorBox} error=${error} />
    <${Table} label="Generations">
      <thead><tr><th>When (UTC)</th><th>Kind</th><th>Model</th><th>Provider</th><th>Status</th>
        <th class="num">Cost</th><th class="num">Latency</th><th>BYOK</th><th>Session</th></tr></thead>
      <tbody>${rows.map((g) => html`<tr key=${g.id}>
        <td><a href=${`#/activity/${encodeURIComponent(g.id)}`}>${when(g.created_at)}</a></td>
        <td>${g.api_type === "stt" ? "transcription" : g.api_type}</td><td>${g.model}</td><td>${g.provider_name || "—"}</td>
        <td><${Status} value=${g.status} /></td><td class="num">${usd(g.total_cost)}</td>
        <td class="num">${g.latency === null ? "—" : `${g.latency} ms`}</td><td>${g.is_byok ? "yes" : "no"}</td>
        <td class="mono">${g.session_id || "—"}</td></tr>`)}</tbody>
    <//>
    ${list && !rows.length ? html`<p class="muted">No generations match.</p>` : null}
    <${Pager} label="Generations" offset=${offset} count=${rows.length} total=${list?.total_count} onMove=${setOffset} />
  </section>`;
}

function GenerationPage({ id }) {
  const [generation, error] = useLoad(() => api(`/generation${query({ id })}`), [id]);
  const g = generation?.data;
  const shown = g ? [
    ["Id", g.id], ["Kind", g.api_type], ["Model", g.model], ["Provider", g.provider_name], ["Status", g.status],
    ["Cost", usd(g.total_cost)], ["Charged", usd(g.usage)], ["BYOK", g.is_byok ? "yes" : "no"],
    ["Latency", g.latency === null ? "—" : `${g.latency} ms`], ["Session", g.session_id], ["User", g.external_user],
    ["Created", when(g.created_at)], ["Error", g.error],
  ] : [];
  return html`<section>
    <p><a href="#/activity">← All activity</a></p>
    <${ErrorBox} error=${error} />
    ${g ? html`<div class="panel"><dl class="detail">${shown.map(([k, v]) => html`<dt>${k}</dt><dd>${v ?? "—"}</dd>`)}</dl></div>` : null}
  </section>`;
}

// Key names by hash for a management key (its workspace's keys); a standard key sees only its own.
function useKeyNames(me) {
  const [keys] = useLoad(() => (me.is_management_key ? api("/keys?include_disabled=true") : Promise.resolve(null)), []);
  const names = new Map((keys?.data || []).map((k) => [k.hash, k.name]));
  return (hash) => names.get(hash) || (me.is_management_key ? short(hash) : "this key");
}

function VideosPage({ me }) {
  const [offset, setOffset] = useState(0);
  const [list, error, reload] = useLoad(() => api(`/videos${query({ offset, limit: PAGE })}`), [offset]);
  const keyName = useKeyNames(me);
  const rows = list?.data || [];
  return html`<section>
    <p><button type="button" class="secondary" onClick=${reload}>Refresh</button></p>
    <${ErrorBox} error=${error} />
    <${Table} label="Video jobs">
      <thead><tr><th>Created (UTC)</th><th>Prompt</th><th>Model</th><th class="num">Duration</th><th>Resolution</th><th>Key</th>
        <th>Status</th><th class="num">Polls</th><th>Provider</th><th class="num">Cost</th><th>Error</th></tr></thead>
      <tbody>${rows.map((j) => html`<tr key=${j.id}>
        <td><a href=${`#/videos/${encodeURIComponent(j.id)}`}>${when(j.created_at)}</a></td>
        <td class="prompt">${j.prompt || "—"}</td><td>${j.model}</td><td class="num">${j.duration ? `${j.duration} s` : "—"}</td>
        <td>${[j.resolution, j.aspect_ratio].filter(Boolean).join(", ") || "—"}</td><td>${keyName(j.api_key_hash)}</td>
        <td><${Status} value=${j.status} /></td><td class="num">${j.attempts}</td><td>${j.provider_name || "—"}</td>
        <td class="num">${usd(j.cost)}</td><td>${j.error || ""}</td></tr>`)}</tbody>
    <//>
    ${list && !rows.length ? html`<p class="muted">No video jobs yet.</p>` : null}
    <${Pager} label="Video jobs" offset=${offset} count=${rows.length} total=${list?.total_count} onMove=${setOffset} />
  </section>`;
}

const UNFINISHED = new Set(["pending", "in_progress"]);

// A job's progress as far as the API knows it: its stage (no provider reports a percentage).
function Stages({ status }) {
  const at = status === "pending" ? 0 : status === "in_progress" ? 1 : 2;
  const last = status === "completed" || at < 2 ? "Finished" : `Ended (${String(status).replace("_", " ")})`;
  return html`<ol class="stages" aria-label="Progress">${["Submitted", "Generating", last].map((label, i) => html`<li
      class=${i < at ? "done" : i === at ? "current" : ""} aria-current=${i === at ? "step" : undefined}>${label}</li>`)}</ol>
    ${UNFINISHED.has(status) ? html`<progress aria-label="The video is being generated"></progress>` : null}`;
}

function VideoPage({ id, me }) {
  const [summary] = useLoad(() => api(`/videos${query({ id })}`), [id]);
  const keyName = useKeyNames(me);
  const asked = summary?.data?.[0];
  const [job, setJob] = useState(null);
  const [error, setError] = useState(null);
  const [videoUrl, setVideoUrl] = useState(null);
  const [hooks, setHooks] = useState(null);
  useEffect(() => {
    let live = true;
    let timer = null;
    let objectUrl = null;
    const poll = async () => {
      try {
        const current = await api(`/videos/${encodeURIComponent(id)}`);
        if (!live) return;
        setJob(current);
        const deliveries = await api(`/videos/${encodeURIComponent(id)}/webhooks`);
        if (!live) return;
        setHooks(deliveries.data);
        // Follow the job until it ends, and its webhooks until they are delivered or given up.
        if (UNFINISHED.has(current.status)) {
          timer = setTimeout(poll, 1500);
        } else if (deliveries.data.some((d) => d.status === "pending")) {
          timer = setTimeout(poll, 3000);
        }
        if (current.status === "completed" && !objectUrl) {
          const content = `${API}/videos/${encodeURIComponent(id)}/content?index=0`;
          if (await workerReady()) {
            // The service worker adds the key: the player asks byte ranges and plays at once.
            tellWorker();
            objectUrl = content;
          } else {
            // No service worker (a browser without them): fetch the whole MP4 with the key.
            const response = await api(`/videos/${encodeURIComponent(id)}/content?index=0`, { raw: true });
            objectUrl = URL.createObjectURL(await response.blob());
          }
          if (!live) return;
          setVideoUrl(objectUrl);
        }
      } catch (e) {
        if (live) setError(e);
      }
    };
    poll();
    return () => { live = false; clearTimeout(timer); if (objectUrl?.startsWith("blob:")) URL.revokeObjectURL(objectUrl); };
  }, [id]);
  return html`<section>
    <p><a href="#/videos">← All video jobs</a></p>
    <${ErrorBox} error=${error} />
    ${job ? html`<div class="panel"><dl class="detail">
      <dt>Job</dt><dd class="mono">${job.id}</dd>
      ${asked ? html`<dt>Prompt</dt><dd>${asked.prompt || "—"}</dd>
        <dt>Model</dt><dd>${asked.model}</dd>
        <dt>Duration</dt><dd>${asked.duration ? `${asked.duration} s` : "—"}</dd>
        <dt>Resolution</dt><dd>${[asked.resolution, asked.aspect_ratio].filter(Boolean).join(", ") || "—"}</dd>
        <dt>Key</dt><dd>${keyName(asked.api_key_hash)}</dd>
        <dt>Created</dt><dd>${when(asked.created_at)}</dd>` : null}
      <dt>Progress</dt><dd><${Stages} status=${job.status} /></dd>
      <dt>Status</dt><dd><${Status} value=${job.status} />${UNFINISHED.has(job.status) ? html` <span class="muted">(checking every few seconds)</span>` : null}</dd>
      <dt>Generation</dt><dd>${job.generation_id ? html`<a href=${`#/activity/${encodeURIComponent(job.generation_id)}`}>${job.generation_id}</a>` : "—"}</dd>
      <dt>Cost</dt><dd>${job.usage ? usd(job.usage.cost) : "—"}${job.usage?.is_byok ? " (BYOK)" : ""}</dd>
      ${job.error ? html`<dt>Error</dt><dd>${job.error}</dd>` : null}
    </dl></div>` : null}
    ${videoUrl ? html`<video controls playsinline src=${videoUrl} aria-label="The generated video" data-testid="video"></video>` : null}
    <h2>Webhook deliveries</h2>
    ${hooks && !hooks.length && job && asked ? html`<p class="muted">${
      asked.callback_url
        ? UNFINISHED.has(job.status)
          ? html`A webhook will be sent to <span class="mono">${asked.callback_url}</span> when the job ends.`
          : html`A webhook to <span class="mono">${asked.callback_url}</span> is being prepared.`
        : "No webhook is sent for this job: it has no callback URL (nor had the workspace a default one when it was submitted)."}</p>` : null}
    ${hooks && hooks.length ? html`<${Table} label="Webhook deliveries">
      <thead><tr><th>Event</th><th>URL</th><th>Status</th><th class="num">Attempts</th><th>Last answer</th><th>Next attempt</th></tr></thead>
      <tbody>${hooks.map((d) => html`<tr key=${d.id}><td>${d.event}</td><td class="mono">${d.url}</td>
        <td><${Status} value=${d.status} /></td><td class="num">${d.attempts}</td>
        <td>${d.last_status ? `HTTP ${d.last_status}` : ""}${d.last_error ? ` ${d.last_error}` : ""}</td>
        <td>${when(d.next_attempt_at)}</td></tr>`)}</tbody><//>` : null}
  </section>`;
}

function VaultPage({ me }) {
  const [intern, setIntern] = useState("");
  const [offset, setOffset] = useState(0);
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState(null);
  const base = intern ? `/vault/interns/${encodeURIComponent(intern)}/secrets` : "/vault/secrets";
  // Outside the intern programme every vault route is a 404 (the API reference): nothing to ask.
  const open = me.intern_programme;
  const [list, loadError, reload] = useLoad(
    () => (open ? api(`${base}${query({ offset, limit: PAGE })}`) : Promise.resolve(null)), [base, offset, open]);
  const [interns] = useLoad(() => (open && me.is_management_key ? api("/interns") : Promise.resolve(null)), [open]);
  const nameRef = useRef(null);
  if (!open || loadError?.status === 404 && !intern) {
    return html`<p class="notice" role="status">The vault is open only to workspaces in the intern programme, and
      ${me.workspace_name ? ` ${me.workspace_name}` : " this workspace"} is not in it. The operator turns the programme on:
      on the console's Workspaces page, signed in with the operator key, or with
      <code>gateway workspaces update ${me.workspace_name || "NAME"} --intern-programme on</code>.</p>`;
  }
  const act = async (work, done) => {
    setError(null); setNotice(null);
    try { await work(); setNotice(done); reload(); } catch (e) { setError(e); }
  };
  const save = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    const name = f.name.value.trim();
    act(async () => {
      await api(`${base}/${encodeURIComponent(name)}`, { method: "PUT", body: { value: f.value.value, hosts: words(f.hosts.value) } });
      event.target.reset();
    }, `Secret ${name} saved.`);
  };
  const choose = (event) => {
    event.preventDefault();
    setOffset(0);
    setIntern(event.target.elements.intern.value.trim());
  };
  const secrets = list?.data || [];
  return html`<section>
    ${me.is_management_key ? html`<form class="inline panel" onSubmit=${choose} aria-label="Choose the vault">
      <${Field} id="vault-intern" label="Vault">
        <select id="vault-intern" name="intern" value=${intern}>
          <option value="">The workspace's vault</option>
          ${(interns?.data || []).map((i) => html`<option value=${i.id}>Intern ${i.name}</option>`)}
        </select><//>
      <button type="submit">Show this vault</button>
    </form>` : null}
    <p class="muted" role="status">Showing ${intern ? `intern ${(interns?.data || []).find((i) => i.id === intern)?.name || intern}'s` : "the workspace's"} secrets. Values are never shown.
      ${me.is_management_key ? "" : " This key stores, replaces and deletes them as a management key does: the vault belongs to the key's scope."}</p>
    <div class="panel">
      <h2>Store or replace a secret</h2>
      <form class="inline" onSubmit=${save}>
        <${Field} id="secret-name" label="Name"><input id="secret-name" name="name" ref=${nameRef} required pattern="[a-z][a-z0-9_]*" /><//>
        <${Field} id="secret-value" label="Value"><input id="secret-value" name="value" type="password" autocomplete="off" required /><//>
        <${Field} id="secret-hosts" label="Hosts (comma separated)"><input id="secret-hosts" name="hosts" required placeholder="api.example.com" /><//>
        <button type="submit">Save secret</button>
      </form>
    </div>
    ${notice ? html`<p class="notice" role="status">${notice}</p>` : null}
    <${ErrorBox} error=${error || loadError} />
    <${Table} label="Secrets">
      <thead><tr><th>Name</th><th>Hosts</th><th>Fingerprint</th><th>Created</th><th>Updated</th><th>Actions</th></tr></thead>
      <tbody>${secrets.map((s) => html`<tr key=${s.name}><td class="mono">${s.name}</td><td>${s.hosts.join(", ")}</td>
        <td class="mono">${s.fingerprint.slice(0, 16)}…</td><td>${when(s.created_at)}</td><td>${when(s.updated_at)}</td>
        <td><div class="actions"><button type="button" class="secondary"
            onClick=${() => { nameRef.current.value = s.name; nameRef.current.focus(); }}>Replace</button>
          <${ConfirmButton} label="Delete" confirmLabel=${`Delete ${s.name}`}
            onConfirm=${() => act(() => api(`${base}/${encodeURIComponent(s.name)}`, { method: "DELETE" }), `Secret ${s.name} deleted.`)} /></div></td>
      </tr>`)}</tbody>
    <//>
    ${list && !secrets.length ? html`<p class="muted">No secrets here yet.</p>` : null}
    <${Pager} label="Secrets" offset=${offset} count=${secrets.length} total=${list?.total_count} onMove=${setOffset} />
  </section>`;
}

// A whole number typed in a field, as the API takes it (anything else as typed: the API refuses it).
function whole(text) {
  const typed = String(text).trim();
  if (typed === "") return null;
  return /^-?[0-9]+$/.test(typed) ? Number(typed) : typed;
}

function listOrNull(text) {
  const list = words(text);
  return list.length ? list : null;
}

// The form is keyed by what it edits and takes its values as defaults: the lists loading
// around it re-render the page without wiping what is being typed.
function GuardrailsPage() {
  const [offset, setOffset] = useState(0);
  const [error, setError] = useState(null);
  const [notice, setNotice] = useState(null);
  const [editing, setEditing] = useState(null);  // the guardrail being edited, or null
  const [list, loadError, reload] = useLoad(() => api(`/guardrails${query({ offset, limit: PAGE })}`), [offset]);
  const [assignments, , reloadAssignments] = useLoad(() => api("/guardrails/assignments/keys?limit=100"), []);
  const [keys] = useLoad(() => api("/keys"), []);
  const form = useRef(null);
  const rows = list?.data || [];
  const assigned = new Map();
  for (const a of assignments?.data || []) {
    if (!assigned.has(a.guardrail_id)) assigned.set(a.guardrail_id, []);
    assigned.get(a.guardrail_id).push(a);
  }
  // Into the form as it opens, before the paint (see ConfirmButton): a field clicked or
  // typed in right after Edit keeps what it was given.
  useLayoutEffect(() => { if (editing && form.current) form.current.elements.name.focus(); }, [editing]);
  const cancel = () => { setEditing(null); form.current?.reset(); };
  const save = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    const budget = amount(f.limit_usd.value);
    const body = {
      name: f.name.value.trim(),
      allowed_models: listOrNull(f.allowed_models.value),
      ignored_models: listOrNull(f.ignored_models.value),
      allowed_providers: listOrNull(f.allowed_providers.value),
      ignored_providers: listOrNull(f.ignored_providers.value),
      max_cost_per_request_usd: amount(f.max_cost.value),
      max_video_duration_seconds: whole(f.max_video.value),
      limit_usd: budget,
      reset_interval: f.reset_interval.value || null,
    };
    const chosen = [...event.target.querySelectorAll("input[name=key]:checked")].map((c) => c.value);
    const was = editing;
    setError(null); setNotice(null);
    (async () => {
      try {
        const saved = was
          ? await api(`/guardrails/${encodeURIComponent(was.id)}`, { method: "PATCH", body })
          : await api("/guardrails", { method: "POST", body });
        const id = saved.data.id;
        const before = (assigned.get(id) || []).map((a) => a.key_hash);
        const added = chosen.filter((h) => !before.includes(h));
        const removed = before.filter((h) => !chosen.includes(h));
        if (added.length) await api(`/guardrails/${encodeURIComponent(id)}/assignments/keys`, { method: "POST", body: { key_hashes: added } });
        if (removed.length) await api(`/guardrails/${encodeURIComponent(id)}/assignments/keys/remove`, { method: "POST", body: { key_hashes: removed } });
        setNotice(`Guardrail ${body.name} ${was ? "saved" : "created"}: it applies ${chosen.length ? `to ${chosen.length} key${chosen.length > 1 ? "s" : ""} only` : "to every key of the workspace, from now on"}.`);
        setEditing(null);
        event.target.reset();
        reload(); reloadAssignments();
      } catch (e) { setError(e); }
    })();
  };
  const listed = (v) => (v ? v.join(", ") : "any");
  const text = (v) => (v ? v.join(", ") : "");
  const g = editing;
  const mine = g ? (assigned.get(g.id) || []).map((a) => a.key_hash) : [];
  return html`<section>
    <p class="notice">A guardrail assigned to no key applies to every key of the workspace, at once, from the moment it is
      saved. Assigned to keys, it applies to those keys only. Every guardrail in force for a key applies.</p>
    <div class="panel"><h2>${g ? `Edit guardrail ${g.name}` : "Create a guardrail"}</h2>
      <form class="inline" onSubmit=${save} ref=${form} key=${g ? g.id : "new"} onKeyDown=${g ? onEscape(cancel) : undefined}>
        <${Field} id="gr-name" label="Name"><input id="gr-name" name="name" required defaultValue=${g?.name || ""} /><//>
        <${Field} id="gr-models" label="Allowed models (optional)"><input id="gr-models" name="allowed_models" defaultValue=${text(g?.allowed_models)} /><//>
        <${Field} id="gr-ignored" label="Ignored models (optional)"><input id="gr-ignored" name="ignored_models" defaultValue=${text(g?.ignored_models)} /><//>
        <${Field} id="gr-providers" label="Allowed providers (optional)"><input id="gr-providers" name="allowed_providers" defaultValue=${text(g?.allowed_providers)} /><//>
        <${Field} id="gr-ignored-providers" label="Ignored providers (optional)"><input id="gr-ignored-providers" name="ignored_providers" defaultValue=${text(g?.ignored_providers)} /><//>
        <${Field} id="gr-cost" label="Max cost per request (USD)"><input id="gr-cost" name="max_cost" type="text" inputmode="decimal" defaultValue=${g?.max_cost_per_request_usd ?? ""} /><//>
        <${Field} id="gr-video" label="Max video duration (s)"><input id="gr-video" name="max_video" type="text" inputmode="numeric" defaultValue=${g?.max_video_duration_seconds ?? ""} /><//>
        <${Field} id="gr-budget" label="Budget per key (USD)"><input id="gr-budget" name="limit_usd" type="text" inputmode="decimal" defaultValue=${g?.limit_usd ?? ""} /><//>
        <${Field} id="gr-reset" label="Budget resets"><select id="gr-reset" name="reset_interval">
          ${[["", "No budget"], ["daily", "Daily"], ["weekly", "Weekly"], ["monthly", "Monthly"]].map(([v, label]) => html`<option
            value=${v} selected=${(g?.reset_interval || "") === v}>${label}</option>`)}</select><//>
        <fieldset class="keys-choice"><legend>Applies to (none ticked: every key)</legend>
          ${(keys?.data || []).map((k) => html`<label class="check"><input type="checkbox" name="key" value=${k.hash}
            defaultChecked=${mine.includes(k.hash)} />${k.name}</label>`)}</fieldset>
        <button type="submit">${g ? "Save guardrail" : "Create guardrail"}</button>
        ${g ? html`<button type="button" class="secondary" onClick=${cancel}>Cancel</button>` : null}
      </form></div>
    ${notice ? html`<p class="notice" role="status">${notice}</p>` : null}
    <${ErrorBox} error=${error || loadError} />
    <${Table} label="Guardrails">
      <thead><tr><th>Name</th><th>Applies to</th><th>Allowed models</th><th>Ignored models</th><th>Allowed providers</th>
        <th>Ignored providers</th><th class="num">Max cost</th><th class="num">Max video s</th><th>Budget per key</th><th>Actions</th></tr></thead>
      <tbody>${rows.map((r) => html`<tr key=${r.id}><td>${r.name}</td>
        <td>${assigned.has(r.id) ? assigned.get(r.id).map((a) => a.key_name).join(", ") : "every key"}</td>
        <td>${listed(r.allowed_models)}</td><td>${r.ignored_models ? r.ignored_models.join(", ") : "none"}</td>
        <td>${listed(r.allowed_providers)}</td><td>${r.ignored_providers ? r.ignored_providers.join(", ") : "none"}</td>
        <td class="num">${r.max_cost_per_request_usd === null ? "—" : usd(r.max_cost_per_request_usd)}</td>
        <td class="num">${r.max_video_duration_seconds ?? "—"}</td>
        <td>${r.limit_usd === null ? "none" : `${usd(r.limit_usd)} ${r.reset_interval || ""}`}</td>
        <td><div class="actions"><button type="button" class="secondary" onClick=${() => setEditing(r)}>Edit</button>
          <${ConfirmButton} label="Delete" confirmLabel=${`Delete ${r.name}`}
          onConfirm=${async () => { setError(null); try { await api(`/guardrails/${encodeURIComponent(r.id)}`, { method: "DELETE" }); reload(); reloadAssignments(); } catch (e) { setError(e); } }} /></div></td></tr>`)}</tbody>
    <//>
    ${list && !rows.length ? html`<p class="muted">No guardrails: every model and provider may be used.</p>` : null}
    <${Pager} label="Guardrails" offset=${offset} count=${rows.length} total=${list?.total_count} onMove=${setOffset} />
  </section>`;
}

function ByokPage() {
  const [offset, setOffset] = useState(0);
  const [error, setError] = useState(null);
  const [list, loadError, reload] = useLoad(() => api(`/byok${query({ offset, limit: PAGE })}`), [offset]);
  // The providers a workspace key may be registered for: the catalog's, as GET /models names them.
  const [models] = useLoad(() => api("/models?output_modalities=all"), []);
  const providers = [...new Set((models?.data || []).flatMap((m) => (m.endpoints || [])
    .filter((e) => e.accepts_byok).map((e) => e.provider)))].sort();
  const act = async (work) => { setError(null); try { await work(); reload(); } catch (e) { setError(e); } };
  const create = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    const body = { provider: f.provider.value, key: f.key.value };
    if (f.name.value.trim()) body.name = f.name.value.trim();
    act(async () => { await api("/byok", { method: "POST", body }); event.target.reset(); });
  };
  const rows = list?.data || [];
  return html`<section>
    <div class="panel"><h2>Add a provider key</h2>
      <form class="inline" onSubmit=${create}>
        <${Field} id="byok-provider" label="Provider"><select id="byok-provider" name="provider" required>
          ${providers.map((p) => html`<option value=${p}>${p}</option>`)}</select><//>
        <${Field} id="byok-key" label="Provider API key"><input id="byok-key" name="key" type="password" autocomplete="off" required /><//>
        <${Field} id="byok-name" label="Name (optional)"><input id="byok-name" name="name" /><//>
        <button type="submit">Add key</button>
      </form></div>
    <${ErrorBox} error=${error || loadError} />
    <${Table} label="Provider keys">
      <thead><tr><th>Provider</th><th>Name</th><th>Key</th><th>Use</th><th>State</th><th>Created</th><th>Actions</th></tr></thead>
      <tbody>${rows.map((k) => html`<tr key=${k.id}><td>${k.provider}</td><td>${k.name || "—"}</td><td class="mono">${k.label}</td>
        <td>${k.is_byok_only ? "always (every model)" : k.is_required ? "always (its models)" : k.is_fallback ? "after the gateway's" : "first"}</td>
        <td>${k.disabled ? "disabled" : "active"}</td><td>${when(k.created_at)}</td>
        <td><${ConfirmButton} label="Delete" confirmLabel=${`Delete ${k.label}`}
          onConfirm=${() => act(() => api(`/byok/${encodeURIComponent(k.id)}`, { method: "DELETE" }))} /></td></tr>`)}</tbody>
    <//>
    ${list && !rows.length ? html`<p class="muted">No provider keys: requests use the gateway's own.</p>` : null}
    <${Pager} label="Provider keys" offset=${offset} count=${rows.length} total=${list?.total_count} onMove=${setOffset} />
  </section>`;
}

function ModelsPage() {
  const [models, error] = useLoad(() => api("/models?output_modalities=all"), []);
  const rows = models?.data || [];
  const price = (m) => {
    const perSecond = Number(m.pricing?.per_second || 0);
    const perRequest = Number(m.pricing?.request || 0);
    if (perSecond) return `${usd(perSecond)} per second`;
    if (perRequest) return `${usd(perRequest)} per request`;
    return "free";
  };
  return html`<section>
    <p class="muted">The gateway's catalog (<code>GET /api/v1/models</code>): what each model takes and gives, its price, the
      providers that serve it in the order they are tried, and whether it can be used now. Your workspace's guardrails hide the
      models they forbid.</p>
    <${ErrorBox} error=${error} />
    ${models === undefined ? html`<p class="muted" role="status">Loading the catalog…</p>` : null}
    <${Table} label="Models" stack>
      <thead role="rowgroup"><tr role="row"><th role="columnheader">Model</th><th role="columnheader">Modality</th>
        <th role="columnheader">Price</th><th role="columnheader">Providers</th><th role="columnheader">Availability</th>
        <th role="columnheader">Parameters</th></tr></thead>
      <tbody role="rowgroup">${rows.map((m) => html`<tr role="row" key=${m.id}>
        <${Cell} label="Model"><strong>${m.name}</strong><br /><span class="mono">${m.id}</span><//>
        <${Cell} label="Modality">${m.architecture?.modality || `${(m.architecture?.input_modalities || []).join("+")}->${(m.architecture?.output_modalities || []).join("+")}`}<//>
        <${Cell} label="Price">${price(m)}<//>
        <${Cell} label="Providers">${(m.endpoints || []).map((e) => e.provider).join(", ") || "—"}<//>
        <${Cell} label="Availability">${m.available ? html`<span class="status completed">available</span>`
          : html`<span class="status failed">unavailable</span> ${m.unavailable_reason || ""}`}<//>
        <${Cell} label="Parameters">${(m.supported_parameters || []).join(", ") || "—"}<//>
      </tr>`)}</tbody>
    <//>
    ${models && !rows.length ? html`<p class="muted">No model is in the catalog (or your guardrails allow none).</p>` : null}
  </section>`;
}

// ---- the operator's pages (the operator key only) ------------------------------------------

function WorkspacesPage() {
  const [offset, setOffset] = useState(0);
  const [error, setError] = useState(null);
  const [done, setDone] = useState(null);
  const [open, setOpen] = useState(null);  // { id, form: "credits" | "key" }
  const [created, setCreated] = useState(null);  // { workspace, key }
  const [list, loadError, reload] = useLoad(() => api(`/workspaces${query({ offset, limit: PAGE })}`), [offset]);
  const act = async (work) => {
    setError(null);
    setDone(null);
    try { await work(); reload(); } catch (e) { setError(e); }
  };
  const create = (event) => {
    event.preventDefault();
    const f = event.target.elements;
    const body = { name: f.name.value.trim(), intern_programme: f.intern_programme.checked };
    act(async () => {
      const answer = await api("/workspaces", { method: "POST", body });
      setDone(`Workspace ${answer.data.name} created. Add credits and create its first management key below.`);
      event.target.reset();
    });
  };
  const addCredits = (w) => (event) => {
    event.preventDefault();
    // Sent as the decimal the operator typed: the gateway takes it exactly or refuses it.
    const amount = event.target.elements.amount.value.trim();
    act(async () => {
      const answer = await api(`/workspaces/${encodeURIComponent(w.id)}/credits`, { method: "POST", body: { amount } });
      setOpen(null);
      setDone(`Added ${usd(answer.purchase.amount)} to ${w.name}.`);
    });
  };
  const createKey = (w) => (event) => {
    event.preventDefault();
    const name = event.target.elements.name.value.trim();
    act(async () => {
      const answer = await api(`/workspaces/${encodeURIComponent(w.id)}/keys`, { method: "POST", body: { name } });
      setOpen(null);
      setCreated({ workspace: w.name, key: answer.key });
    });
  };
  const setDisabled = (w, disabled) => act(async () => {
    await api(`/workspaces/${encodeURIComponent(w.id)}`, { method: "PATCH", body: { disabled } });
    setDone(disabled ? `Workspace ${w.name} disabled: its keys are refused.` : `Workspace ${w.name} enabled again.`);
  });
  const toggleInterns = (w) => act(async () => {
    await api(`/workspaces/${encodeURIComponent(w.id)}`, { method: "PATCH", body: { intern_programme: !w.intern_programme } });
    setDone(`Intern programme ${w.intern_programme ? "off" : "on"} for ${w.name}.`);
  });
  const rows = list?.data || [];
  return html`<section>
    <p class="muted">You are signed in with the operator key: you create workspaces, add credits to their accounts and
      issue each workspace's management key. Sign in with that management key to manage the workspace's keys, vault and usage.</p>
    <div class="panel">
      <h2>Create a workspace</h2>
      <form class="inline" onSubmit=${create}>
        <${Field} id="new-workspace-name" label="Name"><input id="new-workspace-name" name="name" required maxlength="64"
          aria-describedby="workspace-name-help" /><//>
        <div class="check"><input id="new-workspace-interns" name="intern_programme" type="checkbox" />
          <label for="new-workspace-interns">Intern programme</label></div>
        <button type="submit">Create workspace</button>
      </form>
      <p id="workspace-name-help" class="muted">A name is 1–64 letters, digits, “.”, “_” or “-”, starting with a letter or digit.</p>
    </div>
    ${done ? html`<p class="notice" role="status">${done}</p>` : null}
    ${created ? html`<div class="secret-once">
      <p role="status"><strong>The management key of ${created.workspace}.</strong> Copy it now: it is shown only once.
        Sign out and sign in with it to manage the workspace.</p>
      <div class="row"><${Field} id="created-key" label="New management key">
        <input id="created-key" class="mono" readonly value=${created.key} data-testid="created-key" /><//>
        <${CopyButton} text=${created.key} />
        <button type="button" class="secondary" onClick=${() => setCreated(null)}>Done</button></div>
    </div>` : null}
    <${ErrorBox} error=${error || loadError} />
    <${Table} label="Workspaces" stack>
      <thead role="rowgroup"><tr role="row"><th role="columnheader">Name</th><th role="columnheader">Intern programme</th>
        <th role="columnheader" class="num">Balance</th><th role="columnheader" class="num">Purchased</th>
        <th role="columnheader" class="num">Spent</th><th role="columnheader" class="num">Requests</th>
        <th role="columnheader" class="num">Keys</th><th role="columnheader">State</th>
        <th role="columnheader">Created (UTC)</th><th role="columnheader">ID</th>
        <th role="columnheader">Actions</th></tr></thead>
      <tbody role="rowgroup">${rows.map((w) => html`<tr role="row" key=${w.id}>
        <${Cell} label="Name">${w.name}<//><${Cell} label="Intern programme">${w.intern_programme ? "on" : "off"}<//>
        <${Cell} label="Balance" num>${usdFromMicros(micros(w.total_credits) - micros(w.total_usage))}<//>
        <${Cell} label="Purchased" num>${usd(w.total_credits)}<//><${Cell} label="Spent" num>${usd(w.total_usage)}<//>
        <${Cell} label="Requests" num>${w.requests}<//><${Cell} label="Keys" num>${w.keys}<//>
        <${Cell} label="State">${w.disabled ? "disabled" : "active"}<//>
        <${Cell} label="Created (UTC)">${when(w.created_at)}<//><${Cell} label="ID" mono>${w.id}<//>
        <td role="cell" class="actions-cell">${open?.id === w.id && open.form === "credits" ? html`<form class="inline" onSubmit=${addCredits(w)}
            onKeyDown=${onEscape(() => setOpen(null))}>
            <${Field} id=${`amount-${w.id}`} label="Amount (USD)">
              <input id=${`amount-${w.id}`} name="amount" type="text" inputmode="decimal" required /><//>
            <button type="submit">Add to balance</button>
            <button type="button" class="secondary" onClick=${() => setOpen(null)}>Cancel</button></form>`
          : open?.id === w.id && open.form === "key" ? html`<form class="inline" onSubmit=${createKey(w)}
            onKeyDown=${onEscape(() => setOpen(null))}>
            <${Field} id=${`key-name-${w.id}`} label="Key name">
              <input id=${`key-name-${w.id}`} name="name" required maxlength="255" /><//>
            <button type="submit">Issue management key</button>
            <button type="button" class="secondary" onClick=${() => setOpen(null)}>Cancel</button></form>`
          : html`<div class="actions">
            <button type="button" class="secondary" onClick=${() => setOpen({ id: w.id, form: "credits" })}>Add credits</button>
            <button type="button" class="secondary" onClick=${() => setOpen({ id: w.id, form: "key" })}>Create management key</button>
            <button type="button" class="secondary" onClick=${() => toggleInterns(w)}>
              ${w.intern_programme ? "Turn intern programme off" : "Turn intern programme on"}</button>
            ${w.disabled ? html`<button type="button" class="secondary" onClick=${() => setDisabled(w, false)}>Enable</button>`
              : html`<${ConfirmButton} label="Disable" confirmLabel=${`Disable ${w.name}`} onConfirm=${() => setDisabled(w, true)}
                warning=${`Its ${w.keys} key${w.keys === 1 ? "" : "s"} will be refused (401) at once, management keys included. Its ${w.unfinished_video_jobs} unfinished video job${w.unfinished_video_jobs === 1 ? "" : "s"} still finish, are charged and send their webhooks. Nothing is deleted; Enable restores it.`} />`}</div>`}</td>
      </tr>`)}</tbody>
    <//>
    ${list && !rows.length ? html`<p class="muted">No workspaces yet.</p>` : null}
    <${Pager} label="Workspaces" offset=${offset} count=${rows.length} total=${list?.total_count} onMove=${setOffset} />
  </section>`;
}

// ---- the shell ------------------------------------------------------------------------------

const PAGES = [
  { path: "", title: "Usage", page: UsagePage },
  { path: "keys", title: "Keys", page: KeysPage, management: true },
  { path: "credits", title: "Credits", page: CreditsPage, management: true },
  { path: "activity", title: "Activity", page: ActivityPage },
  { path: "videos", title: "Videos", page: VideosPage },
  { path: "models", title: "Models", page: ModelsPage },
  { path: "vault", title: "Vault", page: VaultPage },
  { path: "guardrails", title: "Guardrails", page: GuardrailsPage, management: true },
  { path: "byok", title: "Provider keys", page: ByokPage, management: true },
];

const OPERATOR_PAGES = [
  { path: "", title: "Workspaces", page: WorkspacesPage },
];

function currentRoute() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  return { section: parts[0] || "", id: parts[1] || "" };
}

function App() {
  const [me, setMe] = useState(null);
  const [checking, setChecking] = useState(Boolean(storedKey()));
  const [route, setRoute] = useState(currentRoute());
  const heading = useRef(null);
  useEffect(() => {
    const moved = () => setRoute(currentRoute());
    window.addEventListener("hashchange", moved);
    return () => window.removeEventListener("hashchange", moved);
  }, []);
  useEffect(() => {
    if (!storedKey()) return;
    whoAmI().then(setMe, () => sessionStorage.removeItem(KEY_SLOT)).finally(() => setChecking(false));
  }, []);
  // The keyboard starts on the page's heading: after signing in, moving, and a reload (when
  // the heading appears only once the key is checked).
  useEffect(() => { if (heading.current) heading.current.focus(); }, [route.section, route.id, me, checking]);
  if (checking) return html`<p class="loading">Loading the console…</p>`;
  if (!me) return html`<${SignIn} onSignedIn=${setMe} />`;
  const signOut = () => { sessionStorage.removeItem(KEY_SLOT); tellWorker(); setMe(null); location.hash = "#/"; };
  const pages = me.operator ? OPERATOR_PAGES : PAGES;
  const visible = pages.filter((p) => !p.management || me.is_management_key);
  const entry = pages.find((p) => p.path === route.section);
  let body;
  let title;
  if (!entry) {
    title = "Not found";
    body = html`<p class="notice">There is no such page. <a href="#/">Back to ${pages[0].title.toLowerCase()}</a>.</p>`;
  } else if (me.operator) {
    title = entry.title;
    body = html`<${entry.page} me=${me} />`;
  } else if (entry.management && !me.is_management_key) {
    // Said before anything is asked: the API would only answer 403.
    title = entry.title;
    body = html`<${Restricted} />`;
  } else if (route.section === "activity" && route.id) {
    title = "Generation";
    body = html`<${GenerationPage} id=${route.id} />`;
  } else if (route.section === "videos" && route.id) {
    title = "Video job";
    body = html`<${VideoPage} id=${route.id} me=${me} />`;
  } else {
    title = entry.title;
    body = html`<${entry.page} me=${me} />`;
  }
  return html`<a class="skip" href="#main" onClick=${(e) => { e.preventDefault(); heading.current?.focus(); }}>Skip to content</a>
    <header class="top">
      <span class="brand">Gateway console</span>
      <span class="who">${me.operator ? "operator key" : html`<span data-testid="workspace-name">${me.workspace_name}</span>${` · ${me.label} · ${me.is_management_key ? "management key" : "standard key"}`}`}</span>
      <button type="button" class="secondary" onClick=${signOut}>Sign out</button>
      <nav class="main" aria-label="Console pages"><ul>${visible.map((p) => html`<li>
        <a href=${`#/${p.path}`} aria-current=${p.path === route.section ? "page" : undefined}>${p.title}</a></li>`)}</ul></nav>
    </header>
    <main id="main"><h1 tabindex="-1" ref=${heading}>${title}</h1>${body}</main>`;
}

const root = document.getElementById("app");
root.textContent = "";  // the "Loading" placeholder
render(html`<${App} />`, root);
