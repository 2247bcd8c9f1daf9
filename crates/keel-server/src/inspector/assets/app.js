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

// Characters that show as nothing or as something else: controls (but newline and tab), format
// characters (bidi overrides and isolates, zero-width, tags), line/paragraph separators, spaces
// other than U+0020, every combining mark (\p{M}: the combining grapheme joiner U+034F, the
// variation selectors U+FE00–FE0F and U+E0100–E01EF, the Khmer and Mongolian invisible ones;
// a mark glued to `#` makes it no comment), every Default_Ignorable_Code_Point, the braille
// blank and the Hangul fillers. Runs of one are matched whole.
const INVISIBLE = /([\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Zs}\p{M}\p{Default_Ignorable_Code_Point}\u2800\u115f\u1160\u3164\uffa0])\1*/gu;

/**
 * Text that will run (arguments, paths, commands) as exactly what it is: nothing is removed;
 * every invisible or format character and every combining mark (even one after a letter: an
 * approval shows code points, not typography) is shown as a marked `⟨U+XXXX⟩` (a run as
 * `⟨U+XXXX ×N⟩`).
 * Returns the nodes and `hidden`, how many such characters there were.
 */
K.exact = function (value) {
  const s = String(value == null ? '' : value);
  const out = [];
  let last = 0;
  let hidden = 0;
  for (const m of s.matchAll(INVISIBLE)) {
    const ch = m[1];
    if (ch === ' ' || ch === '\n' || ch === '\t') continue;
    const n = [...m[0]].length;
    hidden += n;
    if (m.index > last) out.push(document.createTextNode(s.slice(last, m.index)));
    const code = 'U+' + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, '0');
    const mark = document.createElement('span');
    mark.className = 'esc';
    mark.textContent = '⟨' + code + (n > 1 ? ' ×' + n : '') + '⟩';
    mark.title = n + ' invisible or format character' + (n > 1 ? 's' : '') + ' ' + code;
    out.push(mark);
    last = m.index + m[0].length;
  }
  if (last < s.length) out.push(document.createTextNode(s.slice(last)));
  out.hidden = hidden;
  return out;
};

/**
 * Output to read (tool results, artifacts, file names in them): terminal escape sequences
 * (colours) are dropped, and every other invisible, format or bidi character is shown as a
 * marked `⟨U+XXXX⟩` ([`K.exact`]) rather than deleted or passed on, so `evil⟨U+202E⟩txt.sh`
 * and `⟨U+200B⟩hidden.txt` read as what they are. Returns nodes (`.hidden` counts).
 */
K.visible = (value) => K.exact(String(value == null ? '' : value).replace(ANSI, ''));

/** A `<pre>` of `value` (JSON unless a string) shown exactly ([`K.exact`]); `.hidden` counts. */
K.exactPre = function (value, attrs) {
  const text = typeof value === 'string' ? value : JSON.stringify(value, null, 2);
  const nodes = K.exact(text);
  const pre = document.createElement('pre');
  for (const [k, v] of Object.entries(attrs || {})) pre.setAttribute(k, v);
  pre.append(...nodes);
  pre.hidden_chars = nodes.hidden;
  pre.text_length = [...(text || '')].length;
  pre.text_lines = (text || '').split('\n').length;
  return pre;
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

function keyOf(n) {
  if (n.nodeType !== 1) return null;
  const d = n.dataset;
  return d.key || d.approvalId || d.operationKey || d.toolCallId || d.stepId || d.turnId || d.sessionId || null;
}

/**
 * Replaces the children of `el` with `kids` in place: a keyed child (data-key, -approval-id,
 * -operation-key, -tool-call-id, -step-id, -turn-id, -session-id) that draws the same as before
 * is kept as it is, so what the reader did there survives a redraw: open or closed `<details>`,
 * focus, a text selection, typed text in a textarea. A changed one takes over the open state
 * of the old one's `<details>` and the text typed in its textareas.
 */
K.patch = function (el, ...kids) {
  const fresh = K.append(document.createElement('div'), kids);
  const old = new Map();
  for (const c of el.children) {
    const k = keyOf(c);
    if (k) old.set(k, c);
  }
  const next = [];
  for (const c of [...fresh.childNodes]) {
    const k = keyOf(c);
    const o = k && old.get(k);
    if (!o) {
      next.push(c);
      continue;
    }
    if (o.tagName === 'DETAILS' && c.tagName === 'DETAILS') c.open = o.open;
    for (const d of c.querySelectorAll('details[data-key], details[data-tool-call-id]')) {
      const od = o.querySelector('details[data-key="' + CSS.escape(keyOf(d)) + '"], details[data-tool-call-id="' + CSS.escape(keyOf(d)) + '"]');
      if (od) d.open = od.open;
    }
    o.normalize();
    c.normalize();
    if (o.isEqualNode(c)) {
      next.push(o);
      continue;
    }
    for (const t of c.querySelectorAll('textarea[id]')) {
      const ot = o.querySelector('#' + CSS.escape(t.id));
      if (ot) t.value = ot.value;
    }
    const focused = o.contains(document.activeElement) && document.activeElement.id;
    next.push(c);
    if (focused) c.refocus = focused;
  }
  // Drop what goes first, so a kept node is never moved (a move would blur it).
  const keep = new Set(next);
  for (const c of [...el.childNodes]) if (!keep.has(c)) el.removeChild(c);
  next.forEach((n, i) => {
    if (el.childNodes[i] !== n) el.insertBefore(n, el.childNodes[i] || null);
  });
  for (const n of next) {
    if (n.refocus) {
      const f = n.querySelector('#' + CSS.escape(n.refocus));
      delete n.refocus;
      if (f) f.focus();
    }
  }
  return el;
};

K.$ = (sel, root) => (root || document).querySelector(sel);

/** A path segment, encoded. */
/**
 * `s` as one path segment: percent-encoded. A URL resolves a segment `.` or `..` — and their
 * `%2E` spellings — to another path (`#/journal/..` asked `/v1/events`), so those are sent as
 * `%252E…`: the server reads the literal text `%2E…`, no id, and answers 404.
 */
K.seg = (s) => encodeURIComponent(String(s)).replace(/^\.{1,2}$/, (d) => d.replace(/\./g, '%252E'));

/**
 * Whether `id` is an artifact id as the tools make them (`[A-Za-z0-9._-]+`, not starting with a
 * dot: so never `.` or `..`, which a URL would resolve to another path).
 */
K.artifactId = (id) => /^[A-Za-z0-9_-][A-Za-z0-9._-]*$/.test(String(id));

/** A status badge. */
K.badge = (status) => K.h('span', { class: 'status st-' + String(status).replace(/[^a-z_]/g, '') }, String(status));

K.short = (id) => {
  const s = String(id || '');
  return s.length > 14 ? s.slice(0, 8) + '…' + s.slice(-4) : s;
};

/**
 * A model label as people name it (as the CLI prints it): the scripted model's journaled
 * `scripted:PATH` is written `script:PATH`, the way `--model` and a release's route take it.
 */
K.modelLabel = (label) => String(label || '').replace(/^scripted:/, 'script:');

/**
 * How the last turn ended, in words, when the session is idle after a turn that did not
 * complete (`aborted` → `cancelled`, `failed`, `budget_exhausted` → `out of budget`, other
 * reasons with spaces); `null` otherwise.
 */
K.lastOutcome = (status, last) => {
  if (status !== 'idle' || !last) return null;
  if (last.status !== 'aborted' && last.status !== 'failed') return null;
  const words = { aborted: 'cancelled', budget_exhausted: 'out of budget' };
  const end = last.terminal_reason || last.status;
  return 'last turn ' + (words[end] || end.replace(/_/g, ' '));
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

// The session's token: only the sign-in answer holds it, and only this tab keeps it (the cookie
// reaches every server of this host; sessionStorage does not). Every call carries it.
const TOKEN = 'inspectorToken';
K.token = () => {
  try {
    return sessionStorage.getItem(TOKEN) || '';
  } catch (_) {
    return '';
  }
};
K.setToken = (t) => {
  try {
    if (t) sessionStorage.setItem(TOKEN, t);
    else sessionStorage.removeItem(TOKEN);
  } catch (_) {
    // No storage: the session lasts as long as this page.
  }
  K.memToken = t || '';
};

/**
 * Calls the server with the session cookie and the session's token. A 401 means the session
 * ended: back to sign-in. Errors carry the problem's `detail`.
 */
K.api = async function (method, path, body) {
  const headers = { Accept: 'application/json', 'X-Keel-CSRF': K.token() || K.memToken || '' };
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
    if (res.status === 401 && path !== '/inspector/sign-in' && K.me) K.signedOut('Your session has ended: sign in again.');
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

/**
 * A server-sent event stream read with fetch (EventSource cannot send the session's token),
 * closed when the current view goes. `handlers` map event names to functions of `{data,
 * lastEventId}`; `onState(live)` reports the link (true, false while reconnecting, null when
 * closed). It reconnects after a drop with `Last-Event-ID`, and goes back to sign-in on 401.
 * Returns `{addEventListener, close}`.
 */
K.stream = function (path, handlers, onState) {
  const listeners = {};
  const on = (type, fn) => (listeners[type] = listeners[type] || []).push(fn);
  for (const [type, fn] of Object.entries(handlers)) on(type, fn);
  const ctl = { closed: false, abort: null };
  let lastId = null;
  const dispatch = (type, data, id) => {
    if (id) lastId = id;
    for (const fn of (Object.hasOwn(listeners, type) && listeners[type]) || []) {
      try {
        fn({ data, lastEventId: id || lastId || '' });
      } catch (e) {
        console.error(e);
      }
    }
  };
  const state = (v) => onState && onState(v);
  const run = async () => {
    let delay = 500;
    while (!ctl.closed) {
      const abort = new AbortController();
      ctl.abort = abort;
      try {
        const headers = { Accept: 'text/event-stream', 'X-Keel-CSRF': K.token() || K.memToken || '' };
        if (lastId) headers['Last-Event-ID'] = lastId;
        const res = await fetch(path, { headers, credentials: 'same-origin', cache: 'no-store', signal: abort.signal });
        if (res.status === 401) {
          ctl.closed = true;
          state(null);
          if (K.me) K.signedOut('Your session has ended: sign in again.');
          return;
        }
        if (!res.ok || !res.body) {
          if (res.status >= 400 && res.status < 500) {
            ctl.closed = true;
            state(null);
            return;
          }
          throw new Error(String(res.status));
        }
        state(true);
        delay = 500;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        let ev = { type: 'message', data: [], id: null };
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let nl;
          while ((nl = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, buf[nl - 1] === '\r' ? nl - 1 : nl);
            buf = buf.slice(nl + 1);
            if (line === '') {
              if (ev.data.length) dispatch(ev.type, ev.data.join('\n'), ev.id);
              ev = { type: 'message', data: [], id: null };
              continue;
            }
            if (line.startsWith(':')) continue;
            const colon = line.indexOf(':');
            const field = colon < 0 ? line : line.slice(0, colon);
            let val = colon < 0 ? '' : line.slice(colon + 1);
            if (val.startsWith(' ')) val = val.slice(1);
            if (field === 'event') ev.type = val;
            else if (field === 'data') ev.data.push(val);
            else if (field === 'id') ev.id = val;
          }
        }
      } catch (_) {
        // Dropped: reconnect below unless closed.
      }
      if (ctl.closed) break;
      state(false);
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 10000);
    }
  };
  const es = {
    addEventListener: on,
    close() {
      ctl.closed = true;
      if (ctl.abort) ctl.abort.abort();
    },
  };
  K.cleanup.push(() => es.close());
  run();
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
  K.setToken('');
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
    K.h('p', { id: 'key-how', class: 'muted' },
      'No key yet? On the server’s machine: ',
      K.h('code', {}, 'keel tenants create acme'), ' (once), then ',
      K.h('code', {}, 'keel keys create --tenant acme --name you --role operator'),
      ' prints a key once (', K.h('code', {}, '--role viewer'), ' reads only).'),
    button, error);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    K.fill(error, '');
    try {
      const me = await K.api('POST', '/inspector/sign-in', { key: input.value });
      K.setToken(me.csrf_token);
      delete me.csrf_token;
      K.me = me;
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

/**
 * Ends the session on the server. A refusal other than "already ended" (401) is shown, and the
 * page stays signed in: saying "Signed out." while the server's session lives would be a lie.
 */
K.signOut = async function () {
  try {
    await K.api('POST', '/inspector/sign-out');
  } catch (e) {
    if (e.status !== 401) {
      K.toast('Not signed out: ' + e.message);
      return;
    }
    // Ended already (K.api went back to sign-in): nothing more to end.
  }
  // The next person to sign in here starts at the list, not at this user's last page.
  history.replaceState(null, '', location.pathname);
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
  const parts = location.hash.replace(/^#\/?/, '').split('/').map((p) => {
    try {
      return decodeURIComponent(p);
    } catch (_) {
      return p;
    }
  });
  const page = parts[0] || 'sessions';
  const view = Object.hasOwn(K.pages, page) && typeof K.pages[page] === 'function' ? page : 'sessions';
  for (const a of document.querySelectorAll('#nav a')) {
    const here = a.dataset.page === (view === 'session' || view === 'artifact' ? 'sessions' : view);
    if (here) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const main = K.$('#main');
  main.replaceChildren();
  K.pages[view](main, parts.slice(1).join('/'));
  // Keyboard and screen-reader users land on the new page's heading, not on the old link.
  const heading = main.querySelector('h1');
  if (heading) {
    heading.tabIndex = -1;
    heading.focus({ preventScroll: true });
  }
};

window.addEventListener('hashchange', K.route);
window.addEventListener('DOMContentLoaded', async () => {
  K.$('#sign-out').addEventListener('click', K.signOut);
  // A tab without the token signs in again: the cookie alone is not a session.
  if (!K.token()) return K.signedOut('');
  try {
    K.me = await K.api('GET', '/inspector/session');
  } catch (e) {
    return K.signedOut(e.status === 401 || e.status === 403 ? '' : e.message);
  }
  K.signedIn();
});
