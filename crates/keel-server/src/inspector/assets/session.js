// Keel inspector: one session live. Its journal arrives over SSE (replayed from the start, then
// tailed; the browser resumes a dropped stream with Last-Event-ID), with the model's text as
// ephemeral deltas between. From those events: the conversation (input, model text, tool calls
// with arguments and results) and the timeline (turns, steps, model attempts, tool calls on a
// time axis, coloured by outcome).
'use strict';
(function () {
  const { h, api, seg } = K;

  /** Every durable event type (keel_core::EVENT_TYPES): SSE names each event by its type. */
  K.EVENT_TYPES = ['session.created', 'session.status_changed', 'session.config_changed', 'session.release_pinned',
    'turn.queued', 'turn.cancel_requested', 'turn.started', 'turn.phase_changed', 'turn.finished', 'step.started',
    'step.streaming', 'step.attempt_failed', 'step.completed', 'step.failed', 'tool_call.proposed',
    'tool_call.validating', 'tool_call.awaiting_approval', 'tool_call.started', 'tool_call.finished',
    'effect.prepared', 'effect.dispatched', 'effect.outcome_unknown', 'effect.committed', 'effect.failed',
    'effect.decided', 'approval.requested', 'approval.decided', 'approval.expired', 'context.compacted',
    'hook.ran', 'agent.spawned', 'agent.finished'];

  /** The session as the events so far tell it (what the conversation and timeline draw). */
  function model(id) {
    return { id, status: '', seq: 0, turns: new Map(), steps: new Map(), calls: new Map(), effects: new Map(), lastStep: null, first: null };
  }

  function outcomeOf(status) {
    if (['succeeded', 'completed', 'committed', 'idle'].includes(status)) return 'ok';
    if (['failed', 'rejected'].includes(status)) return 'failed';
    if (['awaiting_approval', 'requires_action', 'queued', 'outcome_unknown'].includes(status)) return 'waiting';
    // A turn cancelled by a person ends `aborted`: drawn as cancelled, not as a failure.
    if (['cancelled', 'interrupted', 'aborted'].includes(status)) return 'cancelled';
    return 'running';
  }

  /** Folds one envelope into `m` (only what the page shows; the server's fold is the truth). */
  function apply(m, ev) {
    const t = Date.parse(ev.ts);
    const p = ev.payload || {};
    m.seq = Math.max(m.seq, ev.seq);
    if (m.first == null) m.first = t;
    const turn = ev.turn_id && m.turns.get(ev.turn_id);
    switch (ev.type) {
      case 'session.status_changed':
        m.status = p.status;
        break;
      case 'turn.queued':
        m.turns.set(ev.turn_id, { id: ev.turn_id, input: p.input, queued: t, start: null, end: null, status: 'queued', steps: [] });
        break;
      case 'turn.started':
        if (turn) Object.assign(turn, { start: t, status: 'running' });
        break;
      case 'turn.finished':
        if (turn) Object.assign(turn, { end: t, status: p.terminal_reason, usage: p.usage, cost: p.cost_usd, error: p.error });
        break;
      case 'step.started': {
        let step = m.steps.get(ev.step_id);
        if (!step) {
          step = { id: ev.step_id, turn: ev.turn_id, start: t, end: null, status: 'running', text: '', live: '', attempts: [], calls: [] };
          m.steps.set(ev.step_id, step);
          if (turn) turn.steps.push(step);
        }
        const prev = step.attempts[step.attempts.length - 1];
        if (prev && prev.end == null) Object.assign(prev, { end: t, status: 'failed' });
        step.attempts.push({ n: ev.attempt || step.attempts.length + 1, model: p.model, start: t, end: null, status: 'running' });
        step.live = '';
        m.lastStep = step;
        break;
      }
      case 'step.attempt_failed':
      case 'step.completed':
      case 'step.failed': {
        const step = m.steps.get(ev.step_id);
        if (!step) break;
        const a = step.attempts[step.attempts.length - 1];
        const ok = ev.type === 'step.completed';
        if (a && a.end == null) Object.assign(a, { end: t, status: ok ? 'completed' : 'failed', error: p.message });
        if (ev.type !== 'step.attempt_failed') {
          Object.assign(step, { end: t, status: ok ? 'completed' : 'failed', text: p.text || '', live: '', usage: p.usage, error: p.message });
        }
        break;
      }
      case 'tool_call.proposed': {
        const call = { id: ev.tool_call_id, name: p.name, args: p.arguments, start: t, end: null, status: 'proposed', output: null };
        m.calls.set(ev.tool_call_id, call);
        const step = m.steps.get(ev.step_id) || m.lastStep;
        if (step) step.calls.push(call);
        break;
      }
      case 'tool_call.validating':
      case 'tool_call.awaiting_approval':
      case 'tool_call.started': {
        const call = m.calls.get(ev.tool_call_id);
        if (!call) break;
        call.status = { 'tool_call.validating': 'validating', 'tool_call.awaiting_approval': 'awaiting_approval', 'tool_call.started': 'running' }[ev.type];
        // The wait on a human is drawn apart from the tool's own run time.
        if (ev.type === 'tool_call.awaiting_approval') call.waitStart = t;
        if (ev.type === 'tool_call.started') {
          if (call.waitStart != null && call.waitEnd == null) call.waitEnd = t;
          call.runStart = t;
        }
        break;
      }
      case 'effect.prepared':
        // Later effect events name only the operation key: remember whose call it is.
        if (ev.operation_key && ev.tool_call_id) m.effects.set(ev.operation_key, ev.tool_call_id);
        break;
      case 'effect.outcome_unknown': {
        const call = m.calls.get(ev.tool_call_id || m.effects.get(ev.operation_key));
        // Its worker is gone: the bar stops where the outcome became unknown, waiting on a human.
        if (call && call.end == null) Object.assign(call, { status: 'outcome_unknown', unknownAt: t });
        break;
      }
      case 'tool_call.finished': {
        const call = m.calls.get(ev.tool_call_id);
        if (call) {
          if (call.waitStart != null && call.waitEnd == null) call.waitEnd = t;
          Object.assign(call, { end: t, status: p.status, output: p.output, isError: p.is_error });
        }
        break;
      }
      default:
        break;
    }
  }

  // ---- conversation --------------------------------------------------------------------------

  const ARTIFACT = /artifact:\/\/([A-Za-z0-9._-]+)/g;
  const SHOWN = 4000;
  /** Characters of one step's model text drawn (more would make a huge answer freeze the page). */
  const MODEL_SHOWN = 20000;

  /** A step's model text, cut at [`MODEL_SHOWN`] with a link to all of it in the journal. */
  function modelText(m, text) {
    const s = String(text || '');
    if (s.length <= MODEL_SHOWN) return [s];
    return [s.slice(0, MODEL_SHOWN), h('span', { class: 'muted cut' }, '\n… ' + K.num(s.length - MODEL_SHOWN) + ' more characters — '),
      h('a', { href: '#/journal/' + seg(m.id), class: 'full-text' }, 'the full text is in the journal (step.completed)')];
  }

  function output(text) {
    const s = String(text || '');
    const links = [...s.matchAll(ARTIFACT)].filter((x) => K.artifactId(x[1])).map((x) => h('a', { href: '#/artifact/' + seg(x[1]), class: 'artifact-link' }, 'full output (' + x[1] + ')'));
    return [h('pre', { class: 'output' }, K.visible(s.length > SHOWN ? s.slice(0, SHOWN) : s),
      s.length > SHOWN ? '\n… (' + (s.length - SHOWN) + ' more characters)' : null), links];
  }

  /**
   * A finished call's times: the tool's own run, and the wait on a human apart (` · ran 120 ms ·
   * waited 4.2 min for approval`); a call that never ran says so.
   */
  function callTimes(c) {
    if (c.waitStart == null) return ' · ' + K.ms(c.end - c.start);
    const waited = ' · waited ' + K.ms((c.waitEnd != null ? c.waitEnd : c.end) - c.waitStart) + ' for approval';
    return (c.runStart != null ? ' · ran ' + K.ms(c.end - c.runStart) : ' · did not run') + waited;
  }

  function conversation(m) {
    const out = [];
    for (const turn of m.turns.values()) {
      out.push(h('div', { class: 'msg user', 'data-turn-id': turn.id }, h('p', { class: 'who' }, 'user · ', K.badge(turn.status)), h('div', { class: 'text' }, turn.input)));
      for (const step of turn.steps) {
        const text = step.text || step.live;
        if (text || step.status === 'running') {
          out.push(h('div', { class: 'msg assistant' + (step.status === 'running' ? ' streaming' : ''), 'data-step-id': step.id },
            h('p', { class: 'who' }, 'model · ', step.attempts.length ? step.attempts[step.attempts.length - 1].model : '', step.status === 'running' ? ' · streaming…' : ''),
            h('div', { class: 'text model-text' }, modelText(m, text))));
        }
        if (step.error && step.status === 'failed') out.push(h('p', { class: 'error' }, step.error));
        for (const c of step.calls) {
          out.push(h('details', { class: 'tool', 'data-tool-call-id': c.id, open: c.status === 'awaiting_approval' || c.isError },
            h('summary', {}, h('code', {}, c.name), ' ', K.badge(c.status), c.end ? h('span', { class: 'took' }, callTimes(c)) : ''),
            h('p', { class: 'muted' }, 'arguments'), K.exactPre(c.args, { class: 'args' }),
            c.output != null && [h('p', { class: 'muted' }, c.isError ? 'error' : 'result'), output(c.output)]));
        }
      }
      if (turn.error) out.push(h('p', { class: 'error' }, turn.error));
    }
    return out.length ? out : [h('p', { class: 'muted' }, 'No turns yet.')];
  }

  // ---- timeline ------------------------------------------------------------------------------

  /**
   * The waterfall: one row per turn, step, model attempt (when a step took more than one) and
   * tool call. A call that waited on an approval is two bars on its row: the wait (its own
   * colour) and then the tool's run. Drawn at the width shown (1:1, text keeps its size); below
   * 600 px each row's label stands on its own line above the bar, across the whole width.
   */
  function timeline(m, width) {
    const rows = [];
    for (const turn of m.turns.values()) {
      rows.push({ kind: 'turn', label: 'turn ' + K.short(turn.id), start: turn.start || turn.queued, end: turn.end, status: turn.status, depth: 0 });
      for (const step of turn.steps) {
        // A retry storm shows in the label: `step · 3 attempts`.
        const tries = step.attempts.length > 1 ? ' · ' + step.attempts.length + ' attempts' : '';
        rows.push({ kind: 'step', label: 'step' + tries, start: step.start, end: step.end, status: step.status, id: step.id, depth: 1, attempts: step.attempts.length });
        if (step.attempts.length > 1) {
          for (const a of step.attempts) rows.push({ kind: 'attempt', label: 'attempt ' + a.n, start: a.start, end: a.end, status: a.status, note: a.model + (a.error ? ': ' + a.error : ''), depth: 2 });
        }
        for (const c of step.calls) {
          rows.push({ kind: 'tool', label: c.name, start: c.start, end: c.end || c.unknownAt || null, status: c.status, id: c.id, depth: 2,
            wait: c.waitStart != null ? { start: c.waitStart, end: c.waitEnd } : null, runStart: c.runStart });
        }
      }
    }
    if (!rows.length) return h('p', { class: 'muted' }, 'Nothing ran yet.');
    const now = Date.now();
    let t0 = Infinity;
    let t1 = -Infinity;
    for (const r of rows) {
      if (r.start < t0) t0 = r.start;
      if ((r.end || now) > t1) t1 = r.end || now;
    }
    t1 = Math.max(t0 + 1, t1);
    const W = Math.max(300, Math.round(width || 800));
    const narrow = W < 600;
    const L = narrow ? 4 : Math.min(170, Math.round(W * 0.3)), R = 8, TOP = 22;
    const RH = narrow ? 34 : 20, BAR = narrow ? 18 : 14;
    const H = TOP + rows.length * RH + 4;
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
    const svg = h('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img', 'aria-labelledby': 'timeline-title', id: 'timeline-svg', class: narrow ? 'narrow' : null },
      h('title', { id: 'timeline-title' }, 'Timeline of turns, steps, model attempts and tool calls'));
    for (let i = 0; i <= 4; i++) {
      const tx = L + (i / 4) * (W - L - R);
      svg.appendChild(h('line', { class: 'axis', x1: tx, y1: 14, x2: tx, y2: H }));
      svg.appendChild(h('text', { class: 'tick', x: tx, y: 11, 'text-anchor': i === 4 ? 'end' : i ? 'middle' : 'start' }, K.ms((i / 4) * (t1 - t0))));
    }
    rows.forEach((r, i) => {
      const y = TOP + i * RH;
      const end = r.end || now;
      const outcome = outcomeOf(r.status);
      const indent = r.depth * (narrow ? 10 : 8);
      const room = Math.floor(((narrow ? W : L) - indent) / 7);
      const label = r.label.length > room ? r.label.slice(0, room - 1) + '…' : r.label;
      if (narrow && i % 2) svg.appendChild(h('rect', { class: 'lane', x: 0, y, width: W, height: RH }));
      svg.appendChild(h('text', { x: 2 + indent, y: y + 13, class: 'label-' + r.kind + (r.attempts > 1 ? ' storm' : '') }, label));
      const by = narrow ? y + RH - BAR - 2 : y + (RH - BAR) / 2;
      const bar = (cls, a, b, title) => h('rect', { class: cls, x: x(a), y: by, height: BAR, rx: 2, width: Math.max(2, x(b) - x(a)), 'data-id': r.id || null }, h('title', {}, title));
      const waited = r.wait && r.wait.start != null;
      const runFrom = waited ? (r.wait.end != null ? r.wait.end : end) : r.start;
      svg.appendChild(bar('bar bar-' + r.kind + ' ' + outcome, waited ? runFrom : r.start, waited && r.wait.end == null ? runFrom : end,
        r.kind + ' ' + r.label + ': ' + r.status + ', ' + K.ms(end - r.start) + (r.end ? '' : ' so far') +
        (waited ? ' (of which ' + K.ms((r.wait.end || end) - r.wait.start) + ' waiting on approval)' : '') + (r.note ? ' — ' + r.note : '')));
      if (waited) {
        const wend = r.wait.end != null ? r.wait.end : end;
        svg.appendChild(bar('bar approval', r.wait.start, wend, 'approval wait for ' + r.label + ': ' + K.ms(wend - r.wait.start) + (r.wait.end != null ? '' : ' so far')));
      }
    });
    return h('figure', { class: 'timeline' }, h('div', { class: 'chart-scroll' }, svg),
      h('figcaption', { class: 'legend' }, ['ok', 'running', 'waiting', 'failed', 'cancelled'].map((o) => h('span', { class: 'lg-' + o }, o)),
        h('span', { class: 'lg-approval' }, 'approval wait')));
  }

  // ---- the page ------------------------------------------------------------------------------

  K.pages.session = function (main, id) {
    const m = model(id);
    const live = K.liveBadge();
    const head = h('div', { class: 'toolbar', id: 'session-head' });
    const decisions = h('div', { id: 'session-decisions' });
    const convo = h('section', { id: 'conversation', 'aria-label': 'Conversation' });
    const tl = h('section', { id: 'timeline', 'aria-label': 'Timeline' });
    K.append(main, [
      h('h1', {}, 'Session ', h('code', { id: 'session-id' }, id), ' ', live),
      head, decisions,
      h('div', { class: 'two' },
        h('div', {}, h('h2', {}, 'Conversation'), convo),
        h('div', {}, h('h2', {}, 'Timeline'), tl)),
    ]);
    let session = null;
    let queued = false;
    let convoDirty = true;
    // The conversation is patched in place (K.patch): open or closed calls, focus, selections
    // survive; the timeline (which has no state of the reader's) is redrawn.
    const draw = () => {
      queued = false;
      if (convoDirty) K.patch(convo, conversation(m));
      convoDirty = false;
      K.fill(tl, timeline(m, tl.clientWidth));
    };
    const redraw = (timeOnly) => {
      if (timeOnly !== true) convoDirty = true;
      if (!queued) {
        queued = true;
        requestAnimationFrame(draw);
      }
    };
    // The header is fetched once per burst of events (a replay of thousands makes one request).
    let headTimer = null;
    const headSoon = () => {
      clearTimeout(headTimer);
      headTimer = setTimeout(drawHead, 300);
    };
    K.cleanup.push(() => clearTimeout(headTimer));
    const drawHead = async () => {
      try {
        session = await api('GET', '/v1/sessions/' + seg(id));
      } catch (e) {
        K.fill(head, h('p', { class: 'error', id: 'session-error' }, e.status === 404 ? 'No such session in this tenant.' : e.message));
        return;
      }
      const rel = await K.release(session.release_id);
      K.patch(head,
        h('span', {}, 'status ', K.badge(session.status)),
        h('span', {}, 'release ', rel ? rel.name : K.short(session.release_id)),
        rel && h('span', { class: 'mono' }, rel.model_route.join(' → ')),
        h('a', { href: '#/journal/' + seg(id) }, 'Journal and time travel'),
        session.active_turn_id && K.cancelButton(id, drawHead));
      const pending = await api('GET', '/v1/sessions/' + seg(id) + '/approvals?status=pending').then((p) => p.items).catch(() => []);
      const unknown = await api('GET', '/v1/sessions/' + seg(id) + '/effects?status=outcome_unknown').then((p) => p.items).catch(() => []);
      K.patch(decisions, (pending.length || unknown.length) ? [h('h2', {}, 'Waiting on a decision'),
        pending.map((a) => K.approvalCard(a, drawHead)), unknown.map((e) => K.effectCard(Object.assign({ arguments: (m.calls.get(e.tool_call_id) || {}).args }, e), drawHead))] : null);
    };
    const onEvent = (msg) => {
      let ev;
      try {
        ev = JSON.parse(msg.data);
      } catch (_) {
        return;
      }
      apply(m, ev);
      redraw();
      if (/^(session\.status_changed|approval\.|effect\.|turn\.(queued|started|finished))/.test(ev.type)) headSoon();
    };
    const onDelta = (msg) => {
      let d;
      try {
        d = JSON.parse(msg.data);
      } catch (_) {
        return;
      }
      if (d.kind !== 'text') return;
      convo.dataset.deltas = String(Number(convo.dataset.deltas || 0) + 1);
      if (m.lastStep && m.lastStep.status === 'running') {
        m.lastStep.live += d.text;
        // Appended where it is shown, not redrawn: a long stream of small deltas costs its length.
        const el = convo.querySelector('[data-step-id="' + CSS.escape(m.lastStep.id) + '"] .model-text');
        if (el && !convoDirty) {
          if (m.lastStep.live.length - d.text.length < MODEL_SHOWN) el.appendChild(document.createTextNode(K.clean(d.text)));
          else if (!el.querySelector('.cut')) redraw();
        } else redraw();
      }
    };
    const handlers = { delta: onDelta, gap: () => K.toast('Some live output was skipped (slow connection); the journal is complete.') };
    for (const t of K.EVENT_TYPES) handlers[t] = onEvent;
    drawHead();
    draw();
    const es = K.stream('/v1/sessions/' + seg(id) + '/events', handlers, (on) => {
      live.set(on);
      if (on === null) K.toast('The event stream closed.');
    });
    // The stream ends after the session closes: do not reconnect then.
    es.addEventListener('session.status_changed', (msg) => {
      if (/"status":"closed"/.test(msg.data)) es.close();
    });
    window.addEventListener('resize', redraw);
    K.cleanup.push(() => window.removeEventListener('resize', redraw));
    const ticker = setInterval(() => {
      if ([...m.turns.values()].some((t) => !t.end)) redraw(true);
    }, 1000);
    K.cleanup.push(() => clearInterval(ticker));
  };
})();
