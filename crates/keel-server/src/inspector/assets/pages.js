// Keel inspector: the sessions list, decisions (approvals, unknown effects, cancelling turns),
// usage charts and artifacts. Every action is a /v1 call made with the session cookie.
'use strict';
(function () {
  const { h, api, seg } = K;

  // ---- sessions ------------------------------------------------------------------------------

  const STATUSES = ['running', 'requires_action', 'idle', 'closed', 'created'];
  const states = new Map(); // session id -> {version, state}

  /** A session's folded state, fetched again only when its version moved. */
  async function stateOf(s) {
    const known = states.get(s.session_id);
    if (known && known.version === s.version) return known.state;
    const state = await api('GET', '/v1/sessions/' + seg(s.session_id) + '/state').catch(() => null);
    states.set(s.session_id, { version: s.version, state });
    return state;
  }

  K.pages.sessions = function (main) {
    const status = h('select', { id: 'status-filter' },
      h('option', { value: '' }, 'all'), STATUSES.map((s) => h('option', { value: s }, s)));
    const search = h('input', { id: 'search', type: 'search', placeholder: 'session id', autocomplete: 'off' });
    const live = K.liveBadge();
    const body = h('tbody', { id: 'sessions-body' });
    const count = h('p', { class: 'muted', id: 'sessions-count', role: 'status' });
    K.append(main, [
      h('h1', {}, 'Sessions'),
      h('div', { class: 'toolbar' },
        h('label', { for: 'status-filter' }, 'Status', status),
        h('label', { for: 'search' }, 'Search by id', search), live),
      h('div', { class: 'table-wrap' }, h('table', { id: 'sessions' },
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, 'Session'), h('th', { scope: 'col' }, 'Status'),
          h('th', { scope: 'col' }, 'Release'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Model'),
          h('th', { scope: 'col' }, 'Last activity'), h('th', { scope: 'col', class: 'num' }, 'Turns'),
          h('th', { scope: 'col', class: 'num hide-narrow' }, 'Tokens'), h('th', { scope: 'col', class: 'num' }, 'Cost'))),
        body)),
      count,
    ]);
    let rows = [];
    let busy = false;
    let again = false;
    const render = () => {
      const q = search.value.trim().toLowerCase();
      const shown = rows.filter((r) => (!status.value || r.s.status === status.value) && (!q || K.idMatches(r.s.session_id, q)));
      K.fill(body, shown.map(row));
      K.fill(count, shown.length + ' of ' + rows.length + ' sessions');
    };
    const load = async () => {
      if (busy) {
        again = true;
        return;
      }
      busy = true;
      try {
        const list = await K.all('/v1/sessions');
        list.sort((a, b) => Date.parse(b.updated_at) - Date.parse(a.updated_at));
        rows = await Promise.all(list.slice(0, 300).map(async (s) => ({
          s, state: await stateOf(s), release: await K.release(s.release_id),
        })));
        render();
      } catch (e) {
        K.fill(count, 'Could not list sessions: ' + e.message);
      } finally {
        busy = false;
        if (again) {
          again = false;
          load();
        }
      }
    };
    status.addEventListener('change', render);
    search.addEventListener('input', render);
    load();
    // Status changes arrive over the tenant's stream; a running session's tokens move without
    // one, so running sessions are looked at again every few seconds too.
    K.stream('/v1/events', { 'session.status': () => load() }, live.set);
    const timer = setInterval(() => {
      if (rows.some((r) => r.s.status === 'running' || r.s.status === 'requires_action')) load();
    }, 3000);
    K.cleanup.push(() => clearInterval(timer));
  };

  /**
   * Whether `id` is what `q` (lower case) names: any part of it (a prefix such as the first 8
   * characters shown in the list included), or its shortened form `abcd1234…wxyz` (or `...`).
   */
  K.idMatches = function (id, q) {
    const x = id.toLowerCase();
    const cut = q.split(/…|\.\.\./);
    if (cut.length === 2) return x.startsWith(cut[0]) && x.endsWith(cut[1]);
    return x.includes(q);
  };

  function row(r) {
    const { s, state, release } = r;
    const last = state && state.turns.length ? state.turns[state.turns.length - 1] : null;
    const model = K.modelLabel(release && release.model_route ? release.model_route[0] : '');
    const tokens = state ? K.num(K.tokens(state.usage)) : '–';
    const outcome = K.lastOutcome(s.status, last);
    return h('tr', { 'data-session-id': s.session_id },
      h('td', {}, h('a', { href: '#/session/' + seg(s.session_id), class: 'mono', title: s.session_id }, K.short(s.session_id))),
      h('td', { class: 'status-cell' }, K.badge(s.status), outcome && h('span', { class: 'last-outcome muted' }, ' · ' + outcome)),
      // On a phone the model and tokens columns are hidden: shown stacked under the release
      // and the cost instead.
      h('td', {}, release ? release.name : K.short(s.release_id), h('span', { class: 'show-narrow mono muted' }, model)),
      h('td', { class: 'hide-narrow mono' }, model),
      h('td', { title: s.updated_at }, K.ago(last && last.started_at && Date.parse(last.started_at) > Date.parse(s.updated_at) ? last.started_at : s.updated_at)),
      h('td', { class: 'num' }, state ? String(state.turns.length) : '–'),
      h('td', { class: 'num hide-narrow' }, tokens),
      h('td', { class: 'num' }, state ? K.usd(state.cost_usd) : '–', h('span', { class: 'show-narrow muted' }, tokens + ' tok')));
  }

  // ---- decisions -----------------------------------------------------------------------------

  /** Lines of `a` and `b` as a diff: common prefix and suffix kept, the middle removed/added. */
  K.diff = function (a, b) {
    const x = String(a == null ? '' : a).split('\n');
    const y = String(b == null ? '' : b).split('\n');
    let p = 0;
    while (p < x.length && p < y.length && x[p] === y[p]) p++;
    let s = 0;
    while (s < x.length - p && s < y.length - p && x[x.length - 1 - s] === y[y.length - 1 - s]) s++;
    const line = (cls, mark, t) => h('span', { class: cls }, mark, K.exact(t));
    return h('pre', { class: 'diff', 'aria-label': 'diff' },
      x.slice(0, p).map((t) => line('same', '  ', t + '\n')),
      x.slice(p, x.length - s).map((t) => line('del', '- ', t + '\n')),
      y.slice(p, y.length - s).map((t) => line('add', '+ ', t + '\n')),
      x.slice(x.length - s).map((t) => line('same', '  ', t + '\n')));
  };

  function editDiff(name, args) {
    if (!args || typeof args !== 'object') return null;
    if (typeof args.old_string === 'string' && typeof args.new_string === 'string') return K.diff(args.old_string, args.new_string);
    if (name === 'write_file' && typeof args.content === 'string') return K.diff('', args.content);
    return null;
  }

  /**
   * The distinct characters of `text` outside printable ASCII that can pass for something else
   * (letters, digits, punctuation and symbols of other scripts: Cyrillic `а` for Latin `a`), as
   * `"а" U+0430` labels; `.count` is how many there are in all. Combining marks (`\p{M}`, the
   * invisible ones included) are counted too; other invisible ones are shown by [`K.exact`]
   * already and not counted here.
   */
  K.lookAlikes = function (text) {
    const seen = new Map();
    let count = 0;
    for (const ch of String(text || '')) {
      if (ch.codePointAt(0) < 0x7f || !/[\p{L}\p{M}\p{N}\p{P}\p{S}]/u.test(ch)) continue;
      count++;
      if (!seen.has(ch)) seen.set(ch, '"' + ch + '" U+' + ch.codePointAt(0).toString(16).toUpperCase().padStart(4, '0'));
    }
    const out = [...seen.values()].slice(0, 8);
    out.count = count;
    return out;
  };

  /** A warning (above the decision buttons) when `args` hold [`K.lookAlikes`], else null. */
  function lookAlikeWarning(args) {
    const alike = K.lookAlikes(typeof args === 'string' ? args : JSON.stringify(args));
    if (!alike.length) return null;
    return h('p', { class: 'warn lookalike', role: 'alert' }, '⚠ Not plain ASCII: ', K.num(alike.count),
      ' character' + (alike.count > 1 ? 's' : '') + ' that may pass for others: ', alike.map((c, i) => [i ? ', ' : '', h('code', {}, c)]),
      '. Read the arguments before deciding.');
  }

  // The tools whose session rule is a path (keel_tools::policy::FILE_TOOLS).
  const PATH_TOOLS = ['read_file', 'write_file', 'edit_file', 'list_dir', 'glob', 'grep'];

  /**
   * What "Allow for session" grants, in words (as `keel decide` says it, from
   * keel_tools::policy::session_rules_for): `shell`, each command of the line exactly as
   * written; a file tool, the same tool on the same paths with any content; any other tool,
   * every call of it.
   */
  K.grantOf = function (tool) {
    if (tool === 'shell') return 'Grants: each command of this line, exactly as written, runs without asking for the rest of this session; other commands still ask.';
    if (PATH_TOOLS.includes(tool)) return 'Grants: ' + tool + ' on the same path(s), with any other arguments, runs without asking for the rest of this session; other paths still ask.';
    return 'Grants: every ' + tool + ' call, with any arguments, runs without asking for the rest of this session.';
  };

  /** A pending approval: exact arguments, a diff for edits, allow/deny with a reason. */
  K.approvalCard = function (a, done) {
    const reason = h('textarea', { id: 'reason-' + a.approval_id, rows: 2 });
    const decide = (decision) => async (ev) => {
      ev.target.disabled = true;
      try {
        const body = { decision, args_hash: a.args_hash };
        if (reason.value.trim()) body.reason = reason.value.trim();
        await api('POST', '/v1/approvals/' + seg(a.approval_id) + '/decision', body);
        K.toast('Decided: ' + decision.replace(/_/g, ' ') + ' ' + a.tool_name);
        done && done();
      } catch (e) {
        K.toast('Not decided (' + a.tool_name + '): ' + e.message);
        ev.target.disabled = false;
        // Refused because the approval is gone (its turn ended): the list drops it.
        if (e.status === 409 && done) done();
      }
    };
    const diff = editDiff(a.tool_name, a.arguments);
    const args = K.exactPre(a.arguments, { class: 'args full' });
    // Nothing of what will run is hidden: the box is not clipped, and its size is said above the
    // buttons, with the invisible characters it holds (shown as ⟨U+…⟩ in it).
    const size = h('p', { class: 'args-size' + (args.hidden_chars ? ' warn' : '') },
      'Arguments: ' + K.num(args.text_length) + ' characters on ' + K.num(args.text_lines) + ' lines' +
      (args.hidden_chars ? '; ' + K.num(args.hidden_chars) + ' invisible or format characters, shown as ⟨U+…⟩' : '') + '.');
    return h('article', { class: 'card approval', 'data-approval-id': a.approval_id, 'aria-label': 'approval of ' + a.tool_name },
      h('h3', {}, 'Approve ', h('code', {}, a.tool_name), '? ', K.badge(a.status)),
      h('p', { class: 'muted' }, 'session ', h('a', { href: '#/session/' + seg(a.session_id), class: 'mono' }, K.short(a.session_id)),
        a.agent ? ' · agent ' + a.agent : '', ' · expires ', new Date(a.expires_at).toLocaleString()),
      h('details', { open: true }, h('summary', {}, 'Arguments (exact)'), args),
      diff && h('details', { open: true }, h('summary', {}, 'Change'), diff),
      size,
      lookAlikeWarning(a.arguments),
      K.canAct() && a.status === 'pending' && [
        h('label', { for: reason.id }, 'Reason (shown to the model on deny)'), reason,
        h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'primary allow', onclick: decide('allow_once') }, 'Allow once'),
          h('button', { type: 'button', class: 'allow-session', onclick: decide('allow_for_session'), 'aria-describedby': 'grant-' + a.approval_id }, 'Allow for session'),
          h('button', { type: 'button', class: 'danger deny', onclick: decide('deny') }, 'Deny')),
        h('p', { class: 'muted grant', id: 'grant-' + a.approval_id }, K.grantOf(a.tool_name)),
      ]);
  };

  /** An `outcome_unknown` effect: retry, mark committed, mark failed. */
  K.effectCard = function (e, done) {
    const reason = h('textarea', { id: 'effect-reason-' + e.operation_key.replace(/[^A-Za-z0-9_-]/g, '_'), rows: 2 });
    const decide = (decision) => async (ev) => {
      ev.target.disabled = true;
      try {
        const body = { decision };
        if (reason.value.trim()) body.reason = reason.value.trim();
        await api('POST', '/v1/sessions/' + seg(e.session_id) + '/effects/' + seg(e.operation_key) + '/decision', body);
        K.toast({
          retry: 'Retry requested: ' + e.tool_name + ' runs again as a new attempt',
          committed: 'Marked committed: ' + e.tool_name + ' happened; its outcome is the call\'s result',
          failed: 'Marked failed: ' + e.tool_name + ' did not happen; the model is told it failed',
        }[decision]);
        done && done();
      } catch (err) {
        K.toast('Not decided (' + e.tool_name + ' effect, ' + decision.replace(/_/g, ' ') + '): ' + err.message);
        ev.target.disabled = false;
      }
    };
    return h('article', { class: 'card effect', 'data-operation-key': e.operation_key },
      h('h3', {}, 'Did ', h('code', {}, e.tool_name), ' happen? ', K.badge(e.status)),
      h('p', { class: 'muted mono' }, e.operation_key, ' · attempts ', String(e.attempts)),
      e.arguments !== undefined && h('details', { open: true }, h('summary', {}, 'Arguments (exact)'), K.exactPre(e.arguments, { class: 'args' })),
      e.arguments !== undefined && lookAlikeWarning(e.arguments),
      K.canAct() && [
        h('label', { for: reason.id }, 'Note for the model (outcome or error)'), reason,
        h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'retry', onclick: decide('retry') }, 'Retry'),
          h('button', { type: 'button', class: 'committed', onclick: decide('committed') }, 'Mark committed'),
          h('button', { type: 'button', class: 'danger failed', onclick: decide('failed') }, 'Mark failed')),
      ]);
  };

  /** Cancels the active turn of `session`. */
  K.cancelButton = function (sessionId, done) {
    if (!K.canAct()) return null;
    return h('button', {
      type: 'button', class: 'danger cancel-turn',
      onclick: async (ev) => {
        if (!window.confirm('Cancel the turn in progress of session ' + K.short(sessionId) + '? Its running tools are stopped.')) return;
        ev.target.disabled = true;
        try {
          await api('POST', '/v1/sessions/' + seg(sessionId) + '/cancel', {});
          K.toast('Cancellation requested');
          done && done();
        } catch (e) {
          K.toast('Not cancelled: ' + e.message);
          ev.target.disabled = false;
        }
      },
    }, 'Cancel turn');
  };

  K.pages.decisions = function (main) {
    const live = K.liveBadge();
    const approvals = h('div', { id: 'approvals' });
    const effects = h('div', { id: 'effects' });
    const active = h('div', { id: 'active-turns' });
    K.append(main, [
      h('h1', {}, 'Decisions ', live),
      !K.canAct() && h('p', { class: 'muted', id: 'read-only' }, 'This key is a viewer: it sees decisions but may not make them.'),
      h('h2', {}, 'Pending approvals'), approvals,
      h('h2', {}, 'Effects with an unknown outcome'), effects,
      h('h2', {}, 'Turns in progress'), active,
    ]);
    const load = async () => {
      try {
        const pending = await K.all('/v1/approvals?status=pending');
        K.patch(approvals, pending.length ? pending.map((a) => K.approvalCard(a, load)) : h('p', { class: 'muted' }, 'None.'));
        const sessions = (await K.all('/v1/sessions')).filter((s) => s.status !== 'closed');
        const unknown = (await Promise.all(sessions.slice(0, 200).map((s) =>
          api('GET', '/v1/sessions/' + seg(s.session_id) + '/effects?status=outcome_unknown').then((p) => p.items).catch(() => [])))).flat();
        // An effect names its tool call; the call's arguments are in the session's state.
        for (const sid of new Set(unknown.map((e) => e.session_id))) {
          const st = await api('GET', '/v1/sessions/' + seg(sid) + '/state').catch(() => null);
          for (const e of unknown) {
            const call = st && e.session_id === sid && (st.tool_calls || []).find((c) => c.tool_call_id === e.tool_call_id);
            if (call) e.arguments = call.arguments;
          }
        }
        K.patch(effects, unknown.length ? unknown.map((e) => K.effectCard(e, load)) : h('p', { class: 'muted' }, 'None.'));
        // The list is a summary (its items carry no active turn): a session that runs or waits
        // on a decision has one.
        const busy = sessions.filter((s) => s.active_turn_id || s.status === 'running' || s.status === 'requires_action');
        K.patch(active, busy.length ? busy.map((s) => h('div', { class: 'card', 'data-session-id': s.session_id },
          h('a', { href: '#/session/' + seg(s.session_id), class: 'mono' }, K.short(s.session_id)), ' ', K.badge(s.status),
          s.active_turn_id && [' turn ', h('span', { class: 'mono' }, K.short(s.active_turn_id))], ' ', K.cancelButton(s.session_id, load)))
          : h('p', { class: 'muted' }, 'None.'));
      } catch (e) {
        K.fill(approvals, h('p', { class: 'error' }, e.message));
      }
    };
    load();
    K.stream('/v1/events', { 'session.status': () => load() }, live.set);
  };

  // ---- usage ---------------------------------------------------------------------------------

  /**
   * A stacked bar chart (inline SVG) drawn at `width` px (1:1, so its text keeps its size on a
   * phone): `groups` of `{label, parts: [{series, value}]}`; `series` names the colours, in the
   * legend below it; `unit` ('tokens' or 'USD') titles the y axis, `xTitle` the x axis.
   * `every`: label every bar (names, not a sequence like days), each cut to its slot keeping the
   * end (`…/demo.jsonl`), where a sequence's labels are thinned to fit instead.
   */
  /** Distinct series colours (`.series-0` … `.series-11` in app.css); more series repeat them. */
  K.SERIES = 12;
  K.barChart = function (id, groups, series, unit, xTitle, width, every) {
    const W = Math.max(300, Math.round(width || 860)), H = 240, L = 64, R = 8, B = 44, T = 12;
    const max = Math.max(unit === 'USD' ? 0.0001 : 1, ...groups.map((g) => g.parts.reduce((n, p) => n + p.value, 0)));
    const slot = (W - L - R) / Math.max(1, groups.length);
    const bw = Math.max(3, Math.min(40, slot - 4));
    const y = (v) => H - B - (v / max) * (H - B - T);
    const svg = h('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-labelledby': id + '-title', id },
      h('title', { id: id + '-title' }, unit + ' per ' + xTitle + ' (' + groups.length + ' bars)'));
    for (const f of [0, 0.5, 1]) {
      svg.appendChild(h('line', { class: f ? 'grid' : 'axis', x1: L, y1: y(f * max), x2: W - R, y2: y(f * max) }));
      svg.appendChild(h('text', { class: 'tick', x: L - 6, y: y(f * max) + 4, 'text-anchor': 'end' }, fmt(f * max, unit)));
    }
    svg.appendChild(h('text', { class: 'axis-title', x: 12, y: (H - B + T) / 2, 'text-anchor': 'middle', transform: `rotate(-90 12 ${(H - B + T) / 2})` }, unit));
    svg.appendChild(h('text', { class: 'axis-title', x: L + (W - L - R) / 2, y: H - 4, 'text-anchor': 'middle' }, xTitle));
    // As many x labels as fit (about 7 px a character), evenly spaced; a longer one is cut
    // (its bar's tooltip has it whole).
    const fit = Math.max(4, Math.floor((every ? slot - 4 : W - L - R) / 7));
    const cut = (t) => (t.length <= fit ? t : every ? '…' + t.slice(-(fit - 1)) : t.slice(0, fit - 1) + '…');
    const chars = Math.max(1, ...groups.map((g) => cut(g.label).length));
    const step = every ? 1 : Math.max(1, Math.ceil((chars * 7 + 8) / slot));
    groups.forEach((g, i) => {
      const x = L + i * slot + (slot - bw) / 2;
      let top = 0;
      for (const p of g.parts) {
        const y0 = y(top);
        top += p.value;
        svg.appendChild(h('rect', { class: 'series-' + (series.indexOf(p.series) % K.SERIES), x, y: y(top), width: bw, height: Math.max(0, y0 - y(top)) },
          h('title', {}, g.label + ' · ' + p.series + ': ' + fmt(p.value, unit))));
      }
      if (i % step === 0) svg.appendChild(h('text', { class: 'tick', x: x + bw / 2, y: H - B + 14, 'text-anchor': 'middle' }, cut(g.label)));
    });
    const legend = h('ul', { class: 'chart-legend', 'aria-label': 'legend' }, series.map((s, i) => h('li', {},
      h('span', { class: 'swatch series-' + (i % K.SERIES), 'aria-hidden': 'true' }), s)));
    return h('figure', { class: 'chart' }, h('div', { class: 'chart-scroll' }, svg), legend);
  };

  function fmt(v, unit) {
    if (unit === 'USD') return v > 0 && v < 0.01 ? '$' + v.toPrecision(2) : K.usd(v);
    return v >= 10000 ? K.num(Math.round(v / 1000)) + 'k' : K.num(Math.round(v));
  }

  /** The tenant's usage: per day and per model from `GET /v1/usage`, per turn from the latest sessions' states. */
  K.pages.usage = async function (main) {
    const metric = h('select', { id: 'usage-metric' }, h('option', { value: 'tokens' }, 'tokens'), h('option', { value: 'USD' }, 'cost (USD)'));
    const days = h('div', { id: 'usage-days' });
    const models = h('div', { id: 'usage-models' });
    const turns = h('div', { id: 'usage-turns' });
    K.append(main, [h('h1', {}, 'Usage'),
      h('div', { class: 'toolbar' }, h('label', { for: 'usage-metric' }, 'Chart', metric)),
      h('h2', {}, 'Per day, last 30 days'), days, h('h2', {}, 'Per model'), models, h('h2', {}, 'Per turn (latest sessions)'), turns]);
    let report;
    const groups = [];
    try {
      report = await api('GET', '/v1/usage');
      const sessions = (await K.all('/v1/sessions')).sort((a, b) => Date.parse(b.updated_at) - Date.parse(a.updated_at)).slice(0, 10);
      for (const s of sessions) {
        const st = await api('GET', '/v1/sessions/' + seg(s.session_id) + '/state').catch(() => null);
        for (const t of (st && st.turns) || []) groups.push({ t, s });
      }
      groups.sort((a, b) => Date.parse(a.t.started_at || 0) - Date.parse(b.t.started_at || 0));
    } catch (e) {
      K.fill(days, h('p', { class: 'error' }, e.message));
      return;
    }
    const value = (usage, cost) => (metric.value === 'USD' ? cost : K.tokens(usage));
    const draw = () => {
      const width = Math.min(900, main.clientWidth - 4);
      const unit = metric.value;
      const names = [...new Set(report.rows.map((r) => K.modelLabel(r.model)))].sort();
      const byDay = new Map();
      for (const r of report.rows) {
        if (!byDay.has(r.day)) byDay.set(r.day, []);
        byDay.get(r.day).push({ series: K.modelLabel(r.model), value: value(r.usage, r.cost_usd) });
      }
      const dayGroups = [...byDay.keys()].sort().map((d) => ({ label: d.slice(5), parts: byDay.get(d) }));
      K.fill(days, dayGroups.length ? K.barChart('chart-days', dayGroups, names, unit, 'day (UTC, MM-DD)', width) : h('p', { class: 'muted' }, 'No usage in this range.'),
        h('p', { class: 'muted' }, 'Total: ', K.num(report.total_tokens), ' tokens, ', K.usd(report.total_cost_usd), ' (', report.from, ' to ', report.to, ')'));
      const per = new Map();
      for (const r of report.rows) {
        const m = per.get(K.modelLabel(r.model)) || { input: 0, output: 0, cost: 0, steps: 0 };
        m.input += (r.usage && r.usage.input_tokens) || 0;
        m.output += (r.usage && r.usage.output_tokens) || 0;
        m.cost += r.cost_usd;
        m.steps += r.steps;
        per.set(K.modelLabel(r.model), m);
      }
      const modelGroups = [...per.entries()].map(([m, v]) => ({
        label: m, parts: unit === 'USD' ? [{ series: 'cost', value: v.cost }] : [{ series: 'input tokens', value: v.input }, { series: 'output tokens', value: v.output }],
      }));
      K.fill(models, modelGroups.length ? K.barChart('chart-models', modelGroups, unit === 'USD' ? ['cost'] : ['input tokens', 'output tokens'], unit, 'model', width, true) : null,
        h('div', { class: 'table-wrap' }, h('table', { id: 'usage-by-model' },
          h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Model'), h('th', { scope: 'col', class: 'num' }, 'Steps'),
            h('th', { scope: 'col', class: 'num' }, 'Tokens'), h('th', { scope: 'col', class: 'num' }, 'Cost'))),
          h('tbody', {}, [...per.entries()].map(([m, v]) => h('tr', {}, h('td', { class: 'mono' }, m),
            h('td', { class: 'num' }, K.num(v.steps)), h('td', { class: 'num' }, K.num(v.input + v.output)), h('td', { class: 'num' }, K.usd(v.cost))))))));
      const shown = groups.slice(-40);
      const turnGroups = shown.map((g, i) => ({
        label: String(i + 1),
        parts: Object.entries(g.t.usage_by_model || {}).map(([m, v]) => ({ series: K.modelLabel(m), value: value(v.usage || v, v.cost_usd || 0) })),
      }));
      const turnNames = [...new Set(turnGroups.flatMap((g) => g.parts.map((p) => p.series)))].sort();
      K.fill(turns, shown.length ? [K.barChart('chart-turns', turnGroups, turnNames, unit, 'turn (# in the table, oldest first)', width),
        h('div', { class: 'table-wrap' }, h('table', { id: 'usage-by-turn' },
          h('thead', {}, h('tr', {}, h('th', { scope: 'col', class: 'num' }, '#'), h('th', { scope: 'col' }, 'Session'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Turn'),
            h('th', { scope: 'col' }, 'Status'), h('th', { scope: 'col', class: 'num' }, 'Tokens'), h('th', { scope: 'col', class: 'num' }, 'Cost'))),
          h('tbody', {}, shown.map((g, i) => h('tr', {}, h('td', { class: 'num' }, String(i + 1)),
            h('td', {}, h('a', { href: '#/session/' + seg(g.s.session_id), class: 'mono' }, K.short(g.s.session_id))),
            h('td', { class: 'mono hide-narrow' }, K.short(g.t.turn_id)), h('td', {}, K.badge(g.t.status)),
            h('td', { class: 'num' }, K.num(K.tokens(g.t.usage))), h('td', { class: 'num' }, K.usd(g.t.cost_usd)))))))]
        : h('p', { class: 'muted' }, 'No turns yet.'));
    };
    draw();
    metric.addEventListener('change', draw);
    window.addEventListener('resize', draw);
    K.cleanup.push(() => window.removeEventListener('resize', draw));
  };

  // ---- artifacts -----------------------------------------------------------------------------

  K.pages.artifact = async function (main, id) {
    const pre = h('pre', { id: 'artifact-text' });
    const more = h('button', { type: 'button', hidden: true }, 'Load more');
    K.append(main, [h('h1', {}, 'Artifact ', h('code', {}, K.visible(id))), pre, more]);
    if (!K.artifactId(id)) {
      K.fill(pre, 'Not an artifact id (ids are letters, digits, ".", "_" and "-", and do not start with ".").');
      return;
    }
    let offset = 0;
    const load = async () => {
      try {
        const a = await api('GET', '/v1/artifacts/' + seg(id) + '?offset=' + offset);
        K.append(pre, [K.visible(a.text)]);
        offset = a.next_offset || 0;
        more.hidden = !a.next_offset;
      } catch (e) {
        K.fill(pre, 'Could not read it: ' + e.message);
      }
    };
    more.addEventListener('click', load);
    load();
  };
})();
