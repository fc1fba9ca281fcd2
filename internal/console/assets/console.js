// lockd console (C5 #ct5-console). Plain script, no framework, no build step.
//
// Everything shown comes from lockd's HTTP/JSON API (docs/contracts/C2.md
// #ct2-http) with the caller's credentials: the bearer token typed into the
// page (kept in this tab's sessionStorage, sent as an Authorization header,
// never in a URL) or the browser's client certificate. Every string from the
// server goes into the page as text (textContent), never as markup.
'use strict';

(() => {
  const TOKEN_KEY = 'lockd.console.token';
  const PREFIX_KEY = 'lockd.console.prefix';
  const EST_KEYS = 20; // keys with waiters whose estimates one poll reads (one Inspect each)
  const POLL_MS = 2000; // held keys and sessions are re-read this often (waiters have no event)
  const PAGE = 500; // List page size
  const MAX_PAGES = 10; // at most PAGE × MAX_PAGES rows per table
  const MAX_EVENTS = 200; // events kept in the list
  const HOT_LIMIT = 10; // keys per hot-key ranking
  const HOT_MS = 2000; // hot keys are re-read with the lists, at most this often
  // The API is served next to the console: /console/ → /v1/…, also behind a
  // proxy that adds a path prefix.
  const base = location.pathname.replace(/\/console\/.*$/, '');

  const $ = (id) => document.getElementById(id);
  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    prefix: sessionStorage.getItem(PREFIX_KEY) || '',
    gen: 0, // bumped by Apply and Forget: a watch of an older generation stops, its answers are not drawn
    watchAbort: null,
    locks: [], locksTruncated: false, locksSig: '',
    sessions: null, sessionsAt: 0, sessionsNote: '',
    refused: new Map(), // key → why a revoke was refused (until the next Apply)
    refreshing: false, again: false, refreshTimer: 0,
    hotAt: -Infinity, // when the hot keys were last asked for (performance.now())
  };

  class APIError extends Error {
    constructor(httpStatus, body) {
      const st = (body && body.error) || body || {};
      super(st.message || ('HTTP ' + httpStatus));
      this.httpStatus = httpStatus;
      this.reason = st.reason || reasonOf(st.details) || '';
      this.code = st.code;
    }
  }

  // reasonOf finds the lockd reason in a google.rpc.Status's details.
  function reasonOf(details) {
    for (const d of details || []) {
      if (d && typeof d['@type'] === 'string' && d['@type'].endsWith('google.rpc.ErrorInfo')) return d.reason || '';
    }
    return '';
  }

  function describe(e) {
    if (e instanceof APIError) {
      let s = String(e.httpStatus);
      if (e.reason) s += ' ' + e.reason;
      s += ': ' + e.message;
      if (e.httpStatus === 401) s += ' (is the token right?)';
      return s;
    }
    return String(e && e.message ? e.message : e);
  }

  function headers(extra) {
    const h = Object.assign({ Accept: 'application/json' }, extra);
    if (state.token) h.Authorization = 'Bearer ' + state.token;
    return h;
  }

  async function api(method, path, body) {
    const init = { method, headers: headers(), credentials: 'same-origin', cache: 'no-store' };
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const resp = await fetch(base + path, init);
    const text = await resp.text();
    let data = {};
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = { message: text.slice(0, 200) }; }
    }
    if (!resp.ok) throw new APIError(resp.status, data);
    return data;
  }

  // encodeKey makes a key a URL path: each /-separated segment
  // percent-encoded (C2 #ct2-http "Keys in paths").
  function encodeKey(key) {
    return key.split('/').map((seg) => encodeURIComponent(seg)
      .replace(/[!'()*]/g, (c) => '%' + c.charCodeAt(0).toString(16).toUpperCase())).join('/');
  }

  async function pages(path, field, params) {
    const out = [];
    let token = '';
    for (let i = 0; i < MAX_PAGES; i++) {
      const q = new URLSearchParams(params);
      q.set('limit', String(PAGE));
      if (token) q.set('page_token', token);
      const r = await api('GET', path + '?' + q.toString());
      out.push(...(r[field] || []));
      token = r.next_page_token || '';
      if (!token) return { items: out, truncated: false };
    }
    return { items: out, truncated: true };
  }

  // --- rendering (text only) ---

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function fmtDuration(ms) {
    if (!Number.isFinite(ms)) return '—';
    let s = Math.max(0, Math.floor(ms / 1000));
    const d = Math.floor(s / 86400); s -= d * 86400;
    const h = Math.floor(s / 3600); s -= h * 3600;
    const m = Math.floor(s / 60); s -= m * 60;
    const two = (n) => String(n).padStart(2, '0');
    if (d) return d + 'd ' + two(h) + 'h';
    if (h) return h + 'h ' + two(m) + 'm';
    if (m) return m + 'm ' + two(s) + 's';
    return s + 's';
  }

  function since(at) {
    // acquired_at is the backend's clock: for reading only.
    const t = Date.parse(at || '');
    return Number.isNaN(t) ? '—' : fmtDuration(Date.now() - t);
  }

  // holdersOf: every holder of a semaphore or read/write key, else the one
  // holder of a plain lock.
  function holdersOf(lock) {
    if (lock.holders && lock.holders.length) return lock.holders;
    return [{ session_id: lock.session_id, token: lock.token, acquired_at: lock.acquired_at, owner: lock.owner, value: lock.value }];
  }

  // kindOf describes a key that is not a plain lock.
  function kindOf(lock) {
    const hs = lock.holders || [];
    if (!hs.length) return '';
    if (hs.some((h) => h.mode && h.mode !== 'LOCK_MODE_UNSPECIFIED')) return 'read/write';
    return 'semaphore ' + hs.length + '/' + (lock.limit || '?');
  }

  function modeOf(h) {
    return h.mode === 'LOCK_MODE_SHARED' ? 'shared ' : h.mode === 'LOCK_MODE_EXCLUSIVE' ? 'exclusive ' : '';
  }

  // valueText shows a grant's value (base64 in JSON) as text when it is
  // UTF-8, else its size.
  function valueText(b64) {
    if (!b64) return '';
    let bytes;
    try {
      bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    } catch (_) {
      return '(undecodable)';
    }
    try {
      const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
      return text.length > 200 ? text.slice(0, 200) + '…' : text;
    } catch (_) {
      return '(' + bytes.length + ' bytes)';
    }
  }

  const lines = (lock, f) => holdersOf(lock).map(f).join('\n');
  const heldFor = (lock) => lines(lock, (h) => since(h.acquired_at));

  function setStatus(text, bad) {
    const s = $('status');
    s.textContent = text;
    s.classList.toggle('bad', !!bad);
  }

  function showError(id, e) {
    const p = $(id);
    p.hidden = !e;
    p.textContent = e ? describe(e) : '';
  }

  function renderLocks() {
    // Rebuild only on a change, so a row (and its button) stays put
    // between polls; tick() moves the times.
    const sig = JSON.stringify([state.locks, state.locksTruncated, [...state.refused]]);
    if (sig === state.locksSig) return;
    state.locksSig = sig;
    const body = $('locks-body');
    const rows = [];
    for (const lock of state.locks) {
      const tr = el('tr', 'lock');
      tr.dataset.key = lock.key; // a data attribute is text too
      const key = el('td', 'key', lock.key);
      const kind = kindOf(lock);
      if (kind) key.append(el('span', 'kind', kind));
      tr.append(key, el('td', 'owner', lines(lock, (h) => h.owner || '')), el('td', 'session', lines(lock, (h) => modeOf(h) + h.session_id)),
        el('td', 'token', lines(lock, (h) => h.token)), el('td', 'held', heldFor(lock)),
        el('td', 'value', lines(lock, (h) => valueText(h.value))),
        el('td', 'waiters', (lock.waiters || []).map((w, i) => (i + 1) + '. ' + w).join('\n')),
        el('td', 'estimates', estimatesText(lock)));
      const act = el('td', 'actions');
      const refused = state.refused.get(lock.key);
      if (refused) {
        act.classList.add('refused');
        act.textContent = 'Revoke refused: ' + refused;
      } else {
        const b = el('button', 'revoke', 'Revoke');
        b.type = 'button';
        b.title = 'Revoke this grant (admin): asks for confirmation';
        b.addEventListener('click', () => revoke(lock, b));
        act.append(b);
      }
      tr.append(act);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    $('locks-empty').hidden = rows.length > 0;
    $('locks-count').textContent = '(' + rows.length + (state.locksTruncated ? '+, the first ' + rows.length + ' shown' : '') + ')';
  }

  // estimatesText shows each waiter's wait estimate (C2
  // #ct2-wait-estimate, from Inspect), in queue order; '' when the server
  // has none, '—' for a waiter it has none for.
  function estimatesText(lock) {
    const es = lock.wait_estimates || [];
    if (es.length === 0) return '';
    const by = new Map(es.map((e) => [e.session_id, Number(e.estimate_ms)]));
    return (lock.waiters || []).map((w, i) => (i + 1) + '. ' + (by.has(w) ? '≈ ' + fmtMillis(by.get(w)) : '—')).join('\n');
  }

  function renderSessions() {
    const body = $('sessions-body');
    const rows = [];
    const elapsed = performance.now() - state.sessionsAt;
    for (const s of state.sessions || []) {
      const tr = el('tr', 'session');
      tr.dataset.session = s.session_id;
      tr.append(el('td', 'session', s.session_id), el('td', 'owner', s.owner || ''),
        el('td', 'principal', s.principal || 'anonymous'), el('td', 'ttl', fmtDuration(Number(s.ttl_ms))),
        el('td', 'left', fmtDuration(Number(s.remaining_ms) - elapsed)), el('td', 'locks', s.locks));
      rows.push(tr);
    }
    body.replaceChildren(...rows);
    $('sessions-empty').hidden = rows.length > 0;
    $('sessions-count').textContent = state.sessions ? '(' + rows.length + ')' + (state.sessionsNote ? ' — ' + state.sessionsNote : '') : '';
  }

  // renderHot shows one ranking of GET /v1/hotkeys: key, summed
  // milliseconds and, when the sketch may over-count, by how much.
  function renderHot(id, entries) {
    const rows = (entries || []).map((e) => {
      const tr = el('tr', 'hot');
      tr.dataset.key = e.key;
      const score = el('td', 'score', fmtMillis(Number(e.score)));
      if (Number(e.overcount) > 0) score.append(el('span', 'over', ' (at most ' + fmtMillis(Number(e.overcount)) + ' over)'));
      tr.append(el('td', 'hotkey', e.key), score);
      return tr;
    });
    $(id).replaceChildren(...rows);
  }

  function fmtMillis(ms) {
    if (!Number.isFinite(ms)) return '—';
    return ms < 10000 ? ms + ' ms' : fmtDuration(ms);
  }

  function tick() { // times move without a fetch
    const held = document.querySelectorAll('#locks-body td.held');
    state.locks.forEach((lock, i) => { if (held[i]) held[i].textContent = heldFor(lock); });
    const left = document.querySelectorAll('#sessions-body td.left');
    const elapsed = performance.now() - state.sessionsAt;
    (state.sessions || []).forEach((s, i) => {
      if (left[i]) left[i].textContent = fmtDuration(Number(s.remaining_ms) - elapsed);
    });
  }

  // --- reading ---

  async function refreshLocks() {
    const gen = state.gen;
    try {
      const r = await pages('/v1/locks', 'locks', { prefix: state.prefix });
      if (gen !== state.gen) return; // asked with a token or prefix since replaced
      await addEstimates(r.items, gen);
      if (gen !== state.gen) return;
      state.locks = r.items;
      state.locksTruncated = r.truncated;
      showError('locks-error', null);
    } catch (e) {
      if (gen !== state.gen) return;
      state.locks = [];
      showError('locks-error', e);
    }
    renderLocks();
  }

  // addEstimates reads, for the first EST_KEYS keys with waiters, the
  // waiters' wait estimates: List carries none, Inspect (GET
  // /v1/locks/{key}) does. A key Inspect fails for keeps none.
  async function addEstimates(locks, gen) {
    const waited = locks.filter((l) => (l.waiters || []).length > 0).slice(0, EST_KEYS);
    await Promise.all(waited.map(async (lock) => {
      try {
        const r = await api('GET', '/v1/locks/' + encodeKey(lock.key));
        if (gen === state.gen && r.lock) lock.wait_estimates = r.lock.wait_estimates || [];
      } catch (_) { /* no estimate */ }
    }));
  }

  async function refreshSessions() {
    const gen = state.gen;
    try {
      const r = await pages('/v1/sessions', 'sessions', {});
      if (gen !== state.gen) return;
      state.sessions = r.items;
      state.sessionsNote = r.truncated ? 'the first ' + r.items.length + ' shown' : '';
      showError('sessions-error', null);
    } catch (e) {
      if (gen !== state.gen) return;
      state.sessions = [];
      state.sessionsNote = '';
      showError('sessions-error', e);
    }
    state.sessionsAt = performance.now();
    renderSessions();
  }

  // refreshHot reads the hot keys under the prefix (C2 #ct2-hotkeys): the
  // route keeps only the keys this caller may read. Not again within
  // HOT_MS, however many events ask for a refresh.
  async function refreshHot() {
    const now = performance.now();
    if (now - state.hotAt < HOT_MS) return;
    state.hotAt = now;
    const gen = state.gen;
    let r = {};
    try {
      r = await api('GET', '/v1/hotkeys?' + new URLSearchParams({ prefix: state.prefix, limit: String(HOT_LIMIT) }).toString());
      if (gen !== state.gen) return;
      showError('hot-error', null);
    } catch (e) {
      if (gen !== state.gen) return;
      showError('hot-error', e);
    }
    const off = r.enabled === false;
    $('hot-off').hidden = !off;
    $('hot-window').textContent = r.enabled ? '(this server, the last ' + fmtDuration(Number(r.window_ms)) + ' at most)' : '';
    renderHot('hot-wait-body', r.by_wait);
    renderHot('hot-hold-body', r.by_hold);
  }

  async function refresh() {
    if (state.refreshing) { state.again = true; return; }
    state.refreshing = true;
    try {
      await refreshLocks();
      await refreshSessions();
      await refreshHot();
    } finally {
      state.refreshing = false;
    }
    if (state.again) { state.again = false; scheduleRefresh(0); }
  }

  function scheduleRefresh(ms) {
    clearTimeout(state.refreshTimer);
    state.refreshTimer = setTimeout(() => { refresh().finally(() => scheduleRefresh(POLL_MS)); }, ms);
  }

  // --- the event stream: GET /v1/watch, newline-delimited JSON ---

  function setWatchState(text, cls) {
    const s = $('watch-state');
    s.textContent = text;
    s.className = 'state ' + (cls || '');
  }

  function onEvent(ev) {
    const kind = String(ev.kind || '').replace(/^EVENT_KIND_/, '').toLowerCase();
    const li = el('li', 'event');
    li.dataset.kind = kind;
    li.append(el('span', 'time', new Date().toLocaleTimeString()),
      el('span', 'kind kind-' + kind.replace(/[^a-z_]/g, ''), kind),
      el('span', 'key', ev.key), el('span', 'session', ev.session_id), el('span', 'token', 'token ' + ev.token));
    if (ev.owner) li.append(el('span', 'owner', ev.owner));
    if (ev.value) li.append(el('span', 'value', valueText(ev.value)));
    const list = $('events');
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
    scheduleRefresh(100);
  }

  // onResync: the server could not tell what happened since the cursor the
  // watch resumed from (PostgreSQL, compacted etcd history): events may be
  // missing from the list. Say so, and re-read the tables.
  function onResync() {
    const li = el('li', 'event');
    li.dataset.kind = 'resync';
    li.append(el('span', 'time', new Date().toLocaleTimeString()), el('span', 'kind kind-resync', 'resync'),
      el('span', 'note', 'events may have been missed while the watch was away; the tables were re-read'));
    const list = $('events');
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastChild.remove();
    scheduleRefresh(0);
  }

  const delay = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // The watch asks for progress lines (C2 #ct2-watch-progress): the first
  // carries the stream's start cursor, and a stream silent for three of
  // their interval (at least 1 s) has lost its server. A broken stream is
  // re-opened right after the last line handled (resume_after), as the Go
  // SDK does (#ct2-watch-resume): on etcd nothing is lost or repeated;
  // otherwise the server says resync first.
  async function watch(gen) {
    let backoff = 500;
    let cursor = ''; // the position after the last line handled; per Apply (prefix)
    let silentMs = 0; // the silence bound, once a progress line told the interval
    let lostCursor = false; // the server refused the cursor: say resync once live again
    while (gen === state.gen) {
      const ctl = new AbortController();
      state.watchAbort = ctl;
      let silentTimer = 0;
      const heard = () => {
        clearTimeout(silentTimer);
        if (silentMs > 0) silentTimer = setTimeout(() => ctl.abort(new Error('the watch stream went silent')), silentMs);
      };
      try {
        // holder: owners in acquired events, and value events.
        const q = new URLSearchParams({ prefix: state.prefix, holder: 'true', progress: 'true' });
        if (cursor) q.set('resume_after', cursor);
        heard(); // the wait for the headers is bounded too, once the interval is known
        const resp = await fetch(base + '/v1/watch?' + q.toString(), {
          headers: headers({ Accept: 'application/x-ndjson' }), credentials: 'same-origin', cache: 'no-store', signal: ctl.signal,
        });
        if (!resp.ok) {
          const text = await resp.text();
          let data = {};
          try { data = JSON.parse(text.split('\n')[0]); } catch (_) { data = { message: text.slice(0, 200) }; }
          throw new APIError(resp.status, data);
        }
        // Established: every later change is delivered. Re-read what
        // may have changed while no watch was open.
        setWatchState('live', 'live');
        showError('watch-error', null);
        backoff = 500;
        scheduleRefresh(0);
        if (lostCursor) { lostCursor = false; onResync(); }
        heard();
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          heard();
          buf += value;
          let nl;
          while ((nl = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (!line) continue;
            if (gen !== state.gen) return; // replaced by Apply or Forget
            const msg = JSON.parse(line);
            if (msg.error) throw new APIError(200, msg);
            const r = msg.result;
            if (!r) continue;
            if (r.kind === 'EVENT_KIND_PROGRESS') {
              // Not an event: the stream is alive, and every event up
              // to its cursor was handled.
              const ms = Number(r.progress_interval_ms);
              if (ms > 0) silentMs = Math.max(3 * ms, 1000);
              heard();
            } else if (r.kind === 'EVENT_KIND_RESYNC') {
              onResync();
            } else {
              onEvent(r);
            }
            if (r.cursor) cursor = r.cursor;
          }
        }
        throw new Error('the watch ended');
      } catch (e) {
        if (gen !== state.gen) return; // replaced by Apply
        if (e instanceof APIError && e.httpStatus === 400 && cursor) {
          // A cursor the server will not take (invalid input) would be
          // refused forever: start from now, and say so.
          cursor = '';
          lostCursor = true;
        }
        setWatchState('reconnecting', 'down');
        showError('watch-error', ctl.signal.aborted && ctl.signal.reason instanceof Error ? ctl.signal.reason : e);
        await delay(backoff);
        backoff = Math.min(backoff * 2, 15000);
      } finally {
        clearTimeout(silentTimer);
      }
    }
  }

  // --- the one write: an admin's revoke ---

  async function revoke(lock, button) {
    const who = holdersOf(lock).map((h) => (h.owner ? h.owner + ', ' : '') + 'session ' + h.session_id + ', token ' + h.token);
    const question = 'Revoke ' + lock.key + '?\n\nHeld by ' + who.join('; ') + '.\n\n' +
      (who.length > 1 ? 'Every holder loses it' : 'The holder loses the lock') +
      ' at once; until it notices, only the fencing token protects the resource.';
    if (!window.confirm(question)) return;
    button.disabled = true;
    try {
      const r = await api('POST', '/v1/locks/' + encodeKey(lock.key) + ':revoke', {});
      setStatus(r.revoked ? 'Revoked ' + lock.key + ' (token ' + r.token + ', session ' + r.session_id + ').'
        : lock.key + ' was no longer held.');
    } catch (e) {
      state.refused.set(lock.key, describe(e));
      setStatus('Revoke of ' + lock.key + ' refused: ' + describe(e), true);
      renderLocks();
    }
    scheduleRefresh(0);
  }

  // --- settings ---

  function start() {
    state.gen++;
    if (state.watchAbort) state.watchAbort.abort();
    state.refused.clear();
    $('events').replaceChildren();
    // Nothing read with the old token or prefix stays on the page.
    state.locks = [];
    state.locksTruncated = false;
    state.sessions = null;
    renderLocks();
    renderSessions();
    renderHot('hot-wait-body', []);
    renderHot('hot-hold-body', []);
    state.hotAt = -Infinity; // a new prefix or token: ask at once
    setWatchState('connecting', '');
    setStatus(state.token ? 'Calling the API with the bearer token of this tab.'
      : 'Calling the API without a token (anonymous, or your client certificate).');
    watch(state.gen);
    scheduleRefresh(0);
  }

  function init() {
    $('prefix').value = state.prefix;
    $('token').value = state.token;
    $('settings').addEventListener('submit', (ev) => {
      ev.preventDefault();
      state.prefix = $('prefix').value.trim();
      state.token = $('token').value.trim();
      sessionStorage.setItem(PREFIX_KEY, state.prefix);
      if (state.token) sessionStorage.setItem(TOKEN_KEY, state.token); else sessionStorage.removeItem(TOKEN_KEY);
      start();
    });
    $('forget').addEventListener('click', () => {
      state.token = '';
      $('token').value = '';
      sessionStorage.removeItem(TOKEN_KEY);
      start();
    });
    setInterval(tick, 1000);
    start();
  }

  init();
})();
