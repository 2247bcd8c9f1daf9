// Keel inspector: the core. DOM helpers (text only: no innerHTML anywhere), the API client
// (session cookie + CSRF token), sign-in and sign-out, and the router of the `#/…` views.
// The views live in pages.js (sessions, decisions, usage, artifacts), session.js (a session
// live, its timeline) and journal.js (events and time travel).
'use strict';

const K = (window.K = { pages: {}, me: null, cleanup: [] });

// ANSI escape sequences (CSI, OSC, two-byte), other C0/C1 controls but tab and newline, and the
// bidirectional overrides that can make text read differently from what it is.
const ANSI = /\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-_]/g;
const CONTROL = /[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g;

/** Text as it may be shown: escape sequences and control characters removed. */
K.clean = function (s) {
  return String(s == null ? '' : s).replace(ANSI, '').replace(CONTROL, '');
};

const SVG_NS = 'http://www.w3.org/2000/svg';
const SVG_TAGS = new Set(['svg', 'g', 'rect', 'line', 'text', 'title', 'path', 'desc']);

/**
 * An element: `attrs` are attribute names chosen by this code (values are data and go through
 * setAttribute, which never parses markup); `on…` adds a listener; `text` sets textContent.
 * Children: nodes, or strings (as text nodes, cleaned), arrays of either, null skipped.
 */
K.h = function (tag, attrs, ...kids) {
  const el = SVG_TAGS.has(tag) ? document.createElementNS(SVG_NS, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v == null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = K.clean(v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  K.append(el, kids);
  return el;
};

K.append = function (el, kids) {
  for (const kid of kids) {
    if (kid == null || kid === false) continue;
    if (Array.isArray(kid)) K.append(el, kid);
    else if (typeof kid === 'string' || typeof kid === 'number') el.appendChild(document.createTextNode(K.clean(kid)));
    else el.appendChild(kid);
  }
  return el;
};

/** Replaces the children of `el`. */
K.fill = function (el, ...kids) {
  el.replaceChildren();
  return K.append(el, kids);
};

K.$ = (sel, root) => (root || document).querySelector(sel);

/** A path segment, encoded. */
K.seg = (s) => encodeURIComponent(String(s));

/** A status badge. */
K.badge = (status) => K.h('span', { class: 'status st-' + String(status).replace(/[^a-z_]/g, '') }, String(status));

K.short = (id) => {
  const s = String(id || '');
  return s.length > 14 ? s.slice(0, 8) + '…' + s.slice(-4) : s;
};

K.tokens = (u) => (u ? (u.input_tokens || 0) + (u.output_tokens || 0) : 0);
K.usd = (n) => '$' + (Number(n) || 0).toFixed((Number(n) || 0) < 1 ? 4 : 2);
K.num = (n) => (Number(n) || 0).toLocaleString('en-US');

K.ago = function (iso) {
  const t = Date.parse(iso);
  if (!t) return '';
  const s = Math.round((Date.now() - t) / 1000);
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.round(s / 60) + ' min ago';
  if (s < 86400) return Math.round(s / 3600) + ' h ago';
  return new Date(t).toISOString().slice(0, 10);
};

K.ms = function (ms) {
  if (ms < 1000) return Math.round(ms) + ' ms';
  if (ms < 60000) return (ms / 1000).toFixed(1) + ' s';
  return (ms / 60000).toFixed(1) + ' min';
};

K.toast = function (text) {
  const t = K.$('#toast');
  K.fill(t, text);
  clearTimeout(K.toastTimer);
  K.toastTimer = setTimeout(() => t.replaceChildren(), 5000);
};

/** Whether the signed-in key may act (operator or admin); a viewer only reads. */
K.canAct = () => !!K.me && (K.me.role === 'operator' || K.me.role === 'admin');

/**
 * Calls the server with the session cookie. State-changing calls carry the CSRF token. A 401
 * means the session ended: back to sign-in. Errors carry the problem's `detail`.
 */
K.api = async function (method, path, body) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET' && method !== 'HEAD') headers['X-Keel-CSRF'] = K.me ? K.me.csrf_token : '';
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const res = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
    cache: 'no-store',
  });
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch (_) {
    data = null;
  }
  if (!res.ok) {
    if (res.status === 401 && path.startsWith('/v1/')) K.signedOut('Your session has ended: sign in again.');
    const e = new Error((data && (data.detail || data.title)) || res.status + ' ' + res.statusText);
    e.status = res.status;
    throw e;
  }
  return data;
};

/** All items of a paged list (`next_cursor`), up to `max`. */
K.all = async function (path, max) {
  const out = [];
  let cursor = null;
  do {
    const sep = path.includes('?') ? '&' : '?';
    const page = await K.api('GET', path + sep + 'limit=1000' + (cursor ? '&cursor=' + K.seg(cursor) : ''));
    out.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && out.length < (max || 5000));
  return out;
};

const releases = new Map();
/** A release of the tenant (cached: releases never change). */
K.release = function (id) {
  if (!releases.has(id)) releases.set(id, K.api('GET', '/v1/releases/' + K.seg(id)).catch(() => null));
  return releases.get(id);
};

/** An EventSource that the current view closes when it goes; `onState(live)` reports the link. */
K.stream = function (path, handlers, onState) {
  const es = new EventSource(path, { withCredentials: true });
  for (const [type, fn] of Object.entries(handlers)) es.addEventListener(type, fn);
  es.onopen = () => onState && onState(true);
  es.onerror = () => onState && onState(es.readyState === EventSource.CLOSED ? null : false);
  K.cleanup.push(() => es.close());
  return es;
};

K.liveBadge = function () {
  const el = K.h('span', { class: 'live off', id: 'live', role: 'status' }, 'connecting…');
  el.set = (on) => {
    el.className = 'live ' + (on ? 'on' : 'off');
    K.fill(el, on ? '● live' : on === null ? '○ disconnected' : '○ reconnecting…');
  };
  return el;
};

// ---- sign-in -------------------------------------------------------------------------------

K.signedOut = function (message) {
  K.me = null;
  K.leave();
  K.$('#nav').hidden = true;
  K.$('#who').hidden = true;
  const error = K.h('p', { id: 'sign-in-error', class: 'error', role: 'alert' }, message || '');
  const input = K.h('input', {
    id: 'key', name: 'key', type: 'password', autocomplete: 'off', spellcheck: 'false',
    required: true, placeholder: 'keel_…', 'aria-describedby': 'key-help',
  });
  const button = K.h('button', { type: 'submit', class: 'primary', id: 'sign-in-button' }, 'Sign in');
  const form = K.h('form', { id: 'sign-in', novalidate: true },
    K.h('label', { for: 'key' }, 'API key'), input,
    K.h('p', { id: 'key-help', class: 'muted' },
      'The server checks the key and starts a session; the browser keeps only an opaque cookie, never the key. ' +
      'You see what the key’s role and tenant allow.'),
    button, error);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    K.fill(error, '');
    try {
      K.me = await K.api('POST', '/inspector/sign-in', { key: input.value });
      input.value = '';
      K.signedIn();
    } catch (e) {
      K.fill(error, e.status === 401 ? 'That key is not valid (unknown, revoked or expired).' : e.message);
      input.focus();
    } finally {
      button.disabled = false;
    }
  });
  K.fill(K.$('#main'), K.h('section', { class: 'sign-in', 'aria-labelledby': 'sign-in-title' },
    K.h('h1', { id: 'sign-in-title' }, 'Sign in to the Keel inspector'), form));
  input.focus();
};

K.signedIn = function () {
  K.$('#nav').hidden = false;
  K.$('#who').hidden = false;
  K.fill(K.$('#who-role'), K.me.role + ' · tenant ' + K.short(K.me.tenant_id));
  K.$('#who-role').title = 'principal ' + K.me.principal_id + ', tenant ' + K.me.tenant_id;
  K.route();
};

K.signOut = async function () {
  try {
    await K.api('POST', '/inspector/sign-out');
  } catch (_) {
    // Ended already: sign-in again either way.
  }
  K.signedOut('Signed out.');
};

// ---- router --------------------------------------------------------------------------------

/** Closes what the current view opened (streams, timers). */
K.leave = function () {
  for (const f of K.cleanup.splice(0)) {
    try {
      f();
    } catch (_) {
      // Closing is best effort.
    }
  }
};

K.route = function () {
  if (!K.me) return;
  K.leave();
  const parts = location.hash.replace(/^#\/?/, '').split('/').map(decodeURIComponent);
  const page = parts[0] || 'sessions';
  const view = K.pages[page] ? page : 'sessions';
  for (const a of document.querySelectorAll('#nav a')) {
    const here = a.dataset.page === (view === 'session' || view === 'artifact' ? 'sessions' : view);
    if (here) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const main = K.$('#main');
  main.replaceChildren();
  K.pages[view](main, parts.slice(1).join('/'));
};

window.addEventListener('hashchange', K.route);
window.addEventListener('DOMContentLoaded', async () => {
  K.$('#sign-out').addEventListener('click', K.signOut);
  try {
    K.me = await K.api('GET', '/inspector/session');
    K.signedIn();
  } catch (_) {
    K.signedOut('');
  }
});
