// Keel inspector: a session's journal — the raw events, filtered by type and entity — and time
// travel: the session state as the server's fold gives it at any seq
// (GET /v1/sessions/{id}/state?at=SEQ).
'use strict';
(function () {
  const { h, api, seg } = K;

  const IDS = ['turn_id', 'step_id', 'attempt', 'tool_call_id', 'operation_key', 'approval_id', 'parent_session_id', 'principal_id'];

  K.pages.journal = async function (main, path) {
    // `#/journal/ID?type=T&entity=E&at=N`: the filters and the seq travelled to are in the URL,
    // so a link shows what its sender saw and a reload keeps it.
    const cut = (path || '').indexOf('?');
    const id = cut < 0 ? path : path.slice(0, cut);
    const wanted = new URLSearchParams(cut < 0 ? '' : path.slice(cut + 1));
    if (!id) {
      const input = h('input', { id: 'journal-session', autocomplete: 'off', size: 40, placeholder: 'session id' });
      const list = h('ul', { id: 'journal-sessions' });
      K.append(main, [h('h1', {}, 'Journal'),
        h('form', { class: 'toolbar', onsubmit: (e) => { e.preventDefault(); location.hash = '#/journal/' + seg(input.value.trim()); } },
          h('label', { for: 'journal-session' }, 'Session', input), h('button', { type: 'submit' }, 'Open')),
        h('h2', {}, 'Latest sessions'), list]);
      const sessions = (await K.all('/v1/sessions').catch(() => [])).sort((a, b) => Date.parse(b.updated_at) - Date.parse(a.updated_at));
      K.fill(list, sessions.slice(0, 20).map((s) => h('li', {}, h('a', { href: '#/journal/' + seg(s.session_id), class: 'mono' }, s.session_id), ' ', K.badge(s.status))));
      return;
    }
    const type = h('select', { id: 'journal-type' }, h('option', { value: '' }, 'all types'));
    const entity = h('input', { id: 'journal-entity', type: 'search', autocomplete: 'off', placeholder: 'turn, step, call, effect or approval id (short form too)' });
    const at = h('input', { id: 'at-seq', type: 'number', min: 0, step: 1, value: 0 });
    const slider = h('input', { id: 'at-seq-range', type: 'range', min: 0, step: 1, value: 0, 'aria-label': 'sequence number' });
    const go = h('button', { type: 'submit', class: 'primary', id: 'travel' }, 'Show state');
    const note = h('p', { id: 'at-note', class: 'warn', role: 'status' });
    const stateBox = h('section', { id: 'state-at', 'aria-live': 'polite', 'aria-label': 'State at the chosen seq' });
    const body = h('tbody', { id: 'journal-body' });
    const count = h('p', { class: 'muted', id: 'journal-count', role: 'status' });
    K.append(main, [
      h('h1', {}, 'Journal of ', h('a', { href: '#/session/' + seg(id), class: 'mono' }, id)),
      h('h2', {}, 'Time travel'),
      // novalidate: a seq past the end is said below (the browser would refuse it silently).
      h('form', { class: 'toolbar', id: 'travel-form', novalidate: true, onsubmit: (e) => { e.preventDefault(); travel(); } },
        h('label', { for: 'at-seq' }, 'Sequence number', at), slider, go),
      note, stateBox,
      h('h2', {}, 'Events'),
      h('div', { class: 'toolbar' }, h('label', { for: 'journal-type' }, 'Type', type), h('label', { for: 'journal-entity' }, 'Entity', entity)),
      count,
      h('div', { class: 'table-wrap' }, h('table', { id: 'journal' },
        h('thead', {}, h('tr', {}, h('th', { scope: 'col', class: 'num' }, 'Seq'), h('th', { scope: 'col', class: 'hide-narrow' }, 'Time'),
          h('th', { scope: 'col' }, 'Type'), h('th', { scope: 'col' }, 'Entities'), h('th', { scope: 'col' }, 'Payload'))), body)),
    ]);
    let events = [];
    try {
      let after = 0;
      for (;;) {
        const page = await api('GET', '/v1/sessions/' + seg(id) + '/events?after=' + after + '&limit=1000');
        events.push(...page.items);
        after = page.next_after;
        if (!page.has_more) break;
      }
    } catch (e) {
      K.fill(count, h('span', { class: 'error' }, e.status === 404 ? 'No such session in this tenant.' : e.message));
      return;
    }
    // Who acted, by name: an admin key may list the tenant's keys (principal → name); any key
    // knows its own principal. Otherwise the id, shortened.
    const names = new Map();
    if (K.me.role === 'admin') {
      for (const k of await K.all('/v1/keys', 2000).catch(() => [])) names.set(k.principal_id, k.name);
    }
    const who = (p) => (names.get(p) || K.short(p)) + (p === K.me.principal_id ? ' (you)' : '');
    const last = events.length ? events[events.length - 1].seq : 0;
    for (const el of [at, slider]) el.setAttribute('max', last);
    at.value = slider.value = last;
    entity.value = wanted.get('entity') || '';
    if (wanted.has('at')) at.value = wanted.get('at');
    /** The page's filters and seq, kept in the URL (replaced: no history entry per keystroke). */
    const remember = () => {
      const q = new URLSearchParams();
      if (type.value) q.set('type', type.value);
      if (entity.value.trim()) q.set('entity', entity.value.trim());
      q.set('at', at.value);
      history.replaceState(null, '', '#/journal/' + seg(id) + '?' + q.toString());
    };
    // Moving the slider travels (once it rests for a moment), as typing a seq and "Show state" do.
    let wait = null;
    slider.addEventListener('input', () => {
      at.value = slider.value;
      clearTimeout(wait);
      wait = setTimeout(travel, 250);
    });
    K.cleanup.push(() => clearTimeout(wait));
    at.addEventListener('input', () => { slider.value = at.value; });
    // Only the types this journal has: a link cannot add one it never had.
    const types = [...new Set(events.map((e) => e.type))].sort();
    K.append(type, types.map((t) => h('option', { value: t }, t)));
    type.value = types.includes(wanted.get('type')) ? wanted.get('type') : '';
    const render = () => {
      // The short form shown on the page (`0192ab34…cdef`) matches as the full id does.
      const q = entity.value.trim().toLowerCase();
      const shown = events.filter((e) => (!type.value || e.type === type.value) && (!q || IDS.some((k) => e[k] != null && K.idMatches(String(e[k]), q))));
      K.fill(count, shown.length + ' of ' + events.length + ' events');
      K.fill(body, shown.map((e) => h('tr', { 'data-seq': e.seq },
        h('td', { class: 'num' }, h('button', { type: 'button', class: 'seq', title: 'time travel to seq ' + e.seq,
          onclick: () => { at.value = slider.value = e.seq; travel(); } }, String(e.seq))),
        h('td', { class: 'hide-narrow nowrap', title: e.ts }, e.ts.slice(0, 10) + ' ' + e.ts.slice(11, 23)),
        h('td', {}, h('code', {}, e.type)),
        h('td', { class: 'mono' }, IDS.filter((k) => e[k] != null).map((k) => h('div', { title: String(e[k]), class: 'entity-' + k },
          k.replace('_id', '') + ' ' + (k === 'principal_id' ? who(String(e[k])) : K.short(e[k]))))),
        h('td', {}, h('details', {}, h('summary', {}, summary(e)), K.exactPre(e.payload))))));
    };
    type.addEventListener('change', () => { render(); remember(); });
    entity.addEventListener('input', () => { render(); remember(); });
    render();

    async function travel() {
      const asked = Math.floor(Number(at.value) || 0);
      const n = Math.max(0, Math.min(last, asked));
      K.fill(note, asked === n ? '' : 'There is no seq ' + at.value + ': this journal runs from 0 to ' + last + '; showing seq ' + n + '.');
      at.value = slider.value = n;
      if (asked === n) remember();
      K.fill(stateBox, h('p', { class: 'muted' }, 'Folding up to seq ' + n + '…'));
      try {
        const s = await api('GET', '/v1/sessions/' + seg(id) + '/state?at=' + n);
        K.fill(stateBox, stateView(s, n));
      } catch (e) {
        K.fill(stateBox, h('p', { class: 'error' }, e.message));
      }
    }
    travel();
  };

  function summary(e) {
    const p = e.payload || {};
    const s = p.status || p.name || p.terminal_reason || p.model || p.input || p.text || p.decision || '';
    const text = typeof s === 'string' ? s : JSON.stringify(s);
    return text.length > 60 ? text.slice(0, 60) + '…' : text || '…';
  }

  function stateView(s, n) {
    const active = s.turns.find((t) => t.turn_id === s.active_turn_id);
    const budget = (s.config && s.config.session_budget) || {};
    return h('div', { class: 'card', 'data-at': n },
      h('dl', { class: 'kv' },
        h('dt', {}, 'at seq'), h('dd', { id: 'state-seq' }, String(n)),
        h('dt', {}, 'version'), h('dd', { id: 'state-version' }, String(s.version)),
        h('dt', {}, 'status'), h('dd', { id: 'state-status' }, K.badge(s.status || 'none')),
        h('dt', {}, 'turn'), h('dd', { id: 'state-turn' }, active ? K.short(active.turn_id) + ' (' + active.status + ', step ' + active.num_steps + ')' : 'none active',
          s.queued_turn_ids.length ? ' · ' + s.queued_turn_ids.length + ' queued' : ''),
        h('dt', {}, 'turns'), h('dd', {}, String(s.turns.length)),
        h('dt', {}, 'budget spent'), h('dd', { id: 'state-spent' }, K.num(K.tokens(s.usage)), ' tokens, ', K.usd(s.cost_usd),
          budget.max_tokens ? ' of ' + K.num(budget.max_tokens) + ' tokens' : '', budget.max_cost_usd ? ' of ' + K.usd(budget.max_cost_usd) : '')),
      h('h3', {}, 'Tool calls'),
      s.tool_calls.length ? h('ul', { id: 'state-calls' }, s.tool_calls.map((c) => h('li', { 'data-tool-call-id': c.tool_call_id },
        h('code', {}, c.name), ' ', K.badge(c.status), c.operation_key ? ' effect ' + (s.effects[c.operation_key] || '') : ''))) : h('p', { class: 'muted', id: 'state-calls' }, 'none'),
      h('h3', {}, 'Effects'),
      Object.keys(s.effects).length ? h('ul', {}, Object.entries(s.effects).map(([k, v]) => h('li', { class: 'mono' }, K.short(k), ' ', K.badge(v)))) : h('p', { class: 'muted' }, 'none'),
      h('h3', {}, 'Approvals'),
      Object.keys(s.approvals).length ? h('ul', {}, Object.entries(s.approvals).map(([k, v]) => h('li', { class: 'mono' }, K.short(k), ' ', K.badge(v)))) : h('p', { class: 'muted' }, 'none'));
  }
})();
