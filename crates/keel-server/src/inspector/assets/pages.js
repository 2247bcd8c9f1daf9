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
      const shown = rows.filter((r) => (!status.value || r.s.status === status.value) && (!q || r.s.session_id.toLowerCase().includes(q)));
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

  function row(r) {
    const { s, state, release } = r;
    const last = state && state.turns.length ? state.turns[state.turns.length - 1] : null;
    const model = release && release.model_route ? release.model_route[0] : '';
    return h('tr', { 'data-session-id': s.session_id },
      h('td', {}, h('a', { href: '#/session/' + seg(s.session_id), class: 'mono', title: s.session_id }, K.short(s.session_id))),
      h('td', {}, K.badge(s.status)),
      h('td', {}, release ? release.name : K.short(s.release_id)),
      h('td', { class: 'hide-narrow mono' }, model),
      h('td', { title: s.updated_at }, K.ago(last && last.started_at && Date.parse(last.started_at) > Date.parse(s.updated_at) ? last.started_at : s.updated_at)),
      h('td', { class: 'num' }, state ? String(state.turns.length) : '–'),
      h('td', { class: 'num hide-narrow' }, state ? K.num(K.tokens(state.usage)) : '–'),
      h('td', { class: 'num' }, state ? K.usd(state.cost_usd) : '–'));
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
        K.toast('Not decided: ' + e.message);
        ev.target.disabled = false;
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
      K.canAct() && a.status === 'pending' && [
        h('label', { for: reason.id }, 'Reason (shown to the model on deny)'), reason,
        h('div', { class: 'actions' },
          h('button', { type: 'button', class: 'primary allow', onclick: decide('allow_once') }, 'Allow once'),
          h('button', { type: 'button', class: 'allow-session', onclick: decide('allow_for_session') }, 'Allow for session'),
          h('button', { type: 'button', class: 'danger deny', onclick: decide('deny') }, 'Deny')),
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
        K.toast('Effect ' + decision);
        done && done();
      } catch (err) {
        K.toast('Not decided: ' + err.message);
        ev.target.disabled = false;
      }
    };
    return h('article', { class: 'card effect', 'data-operation-key': e.operation_key },
      h('h3', {}, 'Did ', h('code', {}, e.tool_name), ' happen? ', K.badge(e.status)),
      h('p', { class: 'muted mono' }, e.operation_key, ' · attempts ', String(e.attempts)),
      e.arguments !== undefined && h('details', { open: true }, h('summary', {}, 'Arguments (exact)'), K.exactPre(e.arguments, { class: 'args' })),
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
            const call = st && e.session_id === sid && (st.tool_calls || []).find((c) => c.id === e.tool_call_id);
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

  /** A bar chart (inline SVG): `groups` of `{label, parts: [{series, value, title}]}`, stacked. */
  K.barChart = function (id, groups, series, unit) {
    const W = 860, H = 220, L = 60, B = 40, T = 10;
    const max = Math.max(1, ...groups.map((g) => g.parts.reduce((n, p) => n + p.value, 0)));
    const bw = Math.max(4, Math.min(40, (W - L - 10) / Math.max(1, groups.length) - 6));
    const svg = h('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': id + '-title', id },
      h('title', { id: id + '-title' }, 'chart of ' + unit),
      h('line', { class: 'axis', x1: L, y1: H - B, x2: W, y2: H - B }),
      h('text', { x: L - 6, y: T + 8, 'text-anchor': 'end' }, fmt(max, unit)),
      h('text', { x: L - 6, y: H - B, 'text-anchor': 'end' }, '0'));
    groups.forEach((g, i) => {
      const x = L + 6 + i * (bw + 6);
      let y = H - B;
      for (const p of g.parts) {
        const hgt = (p.value / max) * (H - B - T);
        y -= hgt;
        svg.appendChild(h('rect', { class: 'series-' + (series.indexOf(p.series) % 6), x, y, width: bw, height: Math.max(hgt, 0) },
          h('title', {}, g.label + ' · ' + p.series + ': ' + fmt(p.value, unit))));
      }
      if (groups.length <= 16 || i % Math.ceil(groups.length / 16) === 0) {
        svg.appendChild(h('text', { x: x + bw / 2, y: H - B + 14, 'text-anchor': 'middle' }, g.label));
      }
    });
    const legend = h('div', { class: 'legend' }, series.map((s, i) => h('span', { class: 'series-legend' },
      h('span', { class: 'swatch series-' + (i % 6), 'aria-hidden': 'true' }), ' ', s)));
    return h('figure', { class: 'chart' }, svg, legend);
  };

  function fmt(v, unit) {
    return unit === 'USD' ? K.usd(v) : K.num(Math.round(v));
  }

  K.pages.usage = async function (main) {
    const days = h('div', { id: 'usage-days' });
    const models = h('div', { id: 'usage-models' });
    const turns = h('div', { id: 'usage-turns' });
    K.append(main, [h('h1', {}, 'Usage'), h('h2', {}, 'Per day, last 30 days (tokens)'), days,
      h('h2', {}, 'Per model'), models, h('h2', {}, 'Per turn (latest sessions)'), turns]);
    try {
      const report = await api('GET', '/v1/usage');
      const names = [...new Set(report.rows.map((r) => r.model))].sort();
      const byDay = new Map();
      for (const r of report.rows) {
        if (!byDay.has(r.day)) byDay.set(r.day, []);
        byDay.get(r.day).push({ series: r.model, value: K.tokens(r.usage), title: r.model });
      }
      const dayGroups = [...byDay.keys()].sort().map((d) => ({ label: d.slice(5), parts: byDay.get(d) }));
      K.fill(days, dayGroups.length ? K.barChart('chart-days', dayGroups, names, 'tokens') : h('p', { class: 'muted' }, 'No usage in this range.'),
        h('p', { class: 'muted' }, 'Total: ', K.num(report.total_tokens), ' tokens, ', K.usd(report.total_cost_usd), ' (', report.from, ' to ', report.to, ')'));
      const per = new Map();
      for (const r of report.rows) {
        const m = per.get(r.model) || { tokens: 0, cost: 0, steps: 0 };
        m.tokens += K.tokens(r.usage);
        m.cost += r.cost_usd;
        m.steps += r.steps;
        per.set(r.model, m);
      }
      K.fill(models, h('div', { class: 'table-wrap' }, h('table', { id: 'usage-by-model' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Model'), h('th', { scope: 'col', class: 'num' }, 'Steps'),
          h('th', { scope: 'col', class: 'num' }, 'Tokens'), h('th', { scope: 'col', class: 'num' }, 'Cost'))),
        h('tbody', {}, [...per.entries()].map(([m, v]) => h('tr', {}, h('td', { class: 'mono' }, m),
          h('td', { class: 'num' }, K.num(v.steps)), h('td', { class: 'num' }, K.num(v.tokens)), h('td', { class: 'num' }, K.usd(v.cost))))))));
      const sessions = (await K.all('/v1/sessions')).sort((a, b) => Date.parse(b.updated_at) - Date.parse(a.updated_at)).slice(0, 10);
      const groups = [];
      for (const s of sessions) {
        const st = await api('GET', '/v1/sessions/' + seg(s.session_id) + '/state').catch(() => null);
        for (const t of (st && st.turns) || []) {
          groups.push({ label: K.short(t.turn_id).slice(0, 6), parts: Object.entries(t.usage_by_model || {}).map(([m, v]) => ({ series: m, value: v.cost_usd })), t, s });
        }
      }
      const turnNames = [...new Set(groups.flatMap((g) => g.parts.map((p) => p.series)))].sort();
      K.fill(turns, groups.length ? [K.barChart('chart-turns', groups.slice(-40), turnNames, 'USD'),
        h('div', { class: 'table-wrap' }, h('table', { id: 'usage-by-turn' },
          h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'Session'), h('th', { scope: 'col' }, 'Turn'), h('th', { scope: 'col' }, 'Status'),
            h('th', { scope: 'col', class: 'num' }, 'Tokens'), h('th', { scope: 'col', class: 'num' }, 'Cost'))),
          h('tbody', {}, groups.slice(-40).map((g) => h('tr', {},
            h('td', {}, h('a', { href: '#/session/' + seg(g.s.session_id), class: 'mono' }, K.short(g.s.session_id))),
            h('td', { class: 'mono' }, K.short(g.t.turn_id)), h('td', {}, K.badge(g.t.status)),
            h('td', { class: 'num' }, K.num(K.tokens(g.t.usage))), h('td', { class: 'num' }, K.usd(g.t.cost_usd)))))))]
        : h('p', { class: 'muted' }, 'No turns yet.'));
    } catch (e) {
      K.fill(days, h('p', { class: 'error' }, e.message));
    }
  };

  // ---- artifacts -----------------------------------------------------------------------------

  K.pages.artifact = async function (main, id) {
    const pre = h('pre', { id: 'artifact-text' });
    const more = h('button', { type: 'button', hidden: true }, 'Load more');
    K.append(main, [h('h1', {}, 'Artifact ', h('code', {}, id)), pre, more]);
    let offset = 0;
    const load = async () => {
      try {
        const a = await api('GET', '/v1/artifacts/' + seg(id) + '?offset=' + offset);
        K.append(pre, [a.text]);
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
