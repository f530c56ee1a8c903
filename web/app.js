// The chat page's logic: the conversation and settings live in localStorage; each answer streams from
// POST /v1/chat/completions (stream: true, usage included) over fetch, is rendered as Markdown while it
// arrives, can be stopped (the request is aborted, which cancels it on the server), and shows its
// token count and speed (the server's timings, else measured here).
(function () {
  'use strict';
  const CHAT_KEY = 'roofline.chat.v1';
  const SETTINGS_KEY = 'roofline.settings.v1';
  const $ = (id) => document.getElementById(id);
  const els = {
    model: $('model'), messages: $('messages'), form: $('composer'), input: $('input'), send: $('send'),
    stop: $('stop'), settings: $('settings'), toggle: $('toggle-settings'), newChat: $('new-chat'),
    system: $('system-prompt'), temperature: $('temperature'), topP: $('top-p'), maxTokens: $('max-tokens'),
    apiKey: $('api-key'),
  };

  function load(key, fallback) {
    try {
      const v = JSON.parse(localStorage.getItem(key));
      return v && typeof v === 'object' ? v : fallback;
    } catch { return fallback; }
  }
  function store(key, value) {
    try { localStorage.setItem(key, JSON.stringify(value)); } catch { /* storage full or disabled */ }
  }

  let chat = load(CHAT_KEY, { messages: [] });
  if (!Array.isArray(chat.messages)) chat = { messages: [] };
  const settings = Object.assign({ system: '', temperature: 0.8, top_p: 0.95, max_tokens: 512, api_key: '' },
                                 load(SETTINGS_KEY, {}));
  let controller = null;  // the answer streaming now

  // ---- settings ----
  els.system.value = settings.system;
  els.temperature.value = settings.temperature;
  els.topP.value = settings.top_p;
  els.maxTokens.value = settings.max_tokens;
  els.apiKey.value = settings.api_key;
  function readSettings() {
    const num = (el, fallback) => { const v = parseFloat(el.value); return Number.isFinite(v) ? v : fallback; };
    settings.system = els.system.value;
    settings.temperature = num(els.temperature, 0.8);
    settings.top_p = num(els.topP, 0.95);
    settings.max_tokens = Math.max(1, Math.round(num(els.maxTokens, 512)));
    settings.api_key = els.apiKey.value.trim();
    store(SETTINGS_KEY, settings);
  }
  for (const el of [els.system, els.temperature, els.topP, els.maxTokens, els.apiKey]) el.addEventListener('change', readSettings);
  els.toggle.addEventListener('click', () => {
    els.settings.hidden = !els.settings.hidden;
    els.toggle.setAttribute('aria-expanded', String(!els.settings.hidden));
  });
  function headers() {
    const h = { 'Content-Type': 'application/json' };
    if (settings.api_key) h.Authorization = 'Bearer ' + settings.api_key;
    return h;
  }

  // ---- rendering ----
  function statsText(m) {
    const parts = [];
    if (m.stats) {
      parts.push(m.stats.tokens + ' tokens');
      if (m.stats.tps > 0) parts.push(m.stats.tps.toFixed(1) + ' tok/s');
      if (m.stats.ttft_ms >= 0) parts.push('first token ' + Math.round(m.stats.ttft_ms) + ' ms');
      if (m.stats.finish) parts.push(m.stats.finish);
    }
    if (m.stopped) parts.push('stopped');
    return parts.join(' · ');
  }
  function messageElement(m, index) {
    const div = document.createElement('div');
    div.className = 'message ' + m.role;
    div.dataset.index = String(index);
    const role = document.createElement('div');
    role.className = 'role';
    role.textContent = m.role;
    div.appendChild(role);
    if (m.role === 'user') {
      const body = document.createElement('div');
      body.className = 'content';
      body.textContent = m.content;
      div.appendChild(body);
      return div;
    }
    if (m.reasoning) {
      const details = document.createElement('details');
      details.className = 'reasoning';
      const summary = document.createElement('summary');
      summary.textContent = 'Reasoning';
      const pre = document.createElement('div');
      pre.style.whiteSpace = 'pre-wrap';
      pre.textContent = m.reasoning;
      details.append(summary, pre);
      div.appendChild(details);
    }
    const body = document.createElement('div');
    body.className = 'content' + (m.pending ? ' cursor' : '');
    body.innerHTML = window.renderMarkdown(m.content);  // escapes everything it does not mark up
    div.appendChild(body);
    if (m.error) {
      const err = document.createElement('div');
      err.className = 'error';
      err.textContent = m.error;
      div.appendChild(err);
    }
    const stats = statsText(m);
    if (stats) {
      const s = document.createElement('div');
      s.className = 'stats';
      s.textContent = stats;
      div.appendChild(s);
    }
    div.dataset.done = m.pending ? '0' : '1';
    return div;
  }
  function renderAll() {
    els.messages.replaceChildren();
    if (chat.messages.length === 0) {
      const empty = document.createElement('div');
      empty.className = 'empty';
      empty.textContent = 'Ask anything. The conversation stays in this browser.';
      els.messages.appendChild(empty);
    }
    chat.messages.forEach((m, i) => els.messages.appendChild(messageElement(m, i)));
    els.messages.scrollTop = els.messages.scrollHeight;
  }
  let frame = 0;
  function renderLast() {  // at most once per animation frame while streaming
    if (frame) return;
    frame = requestAnimationFrame(() => {
      frame = 0;
      const i = chat.messages.length - 1;
      const old = els.messages.querySelector('.message[data-index="' + i + '"]');
      const atBottom = els.messages.scrollHeight - els.messages.scrollTop - els.messages.clientHeight < 40;
      if (old) old.replaceWith(messageElement(chat.messages[i], i));
      else renderAll();
      if (atBottom) els.messages.scrollTop = els.messages.scrollHeight;
    });
  }
  function setBusy(busy) {
    els.send.hidden = busy;
    els.stop.hidden = !busy;
    els.input.disabled = busy;
  }

  // ---- streaming ----
  function requestBody() {
    const msgs = [];
    if (settings.system.trim()) msgs.push({ role: 'system', content: settings.system });
    for (const m of chat.messages) {
      if (m.pending || (m.role === 'assistant' && (m.error || !m.content))) continue;
      msgs.push({ role: m.role, content: m.content });
    }
    return {
      messages: msgs, stream: true, stream_options: { include_usage: true },
      temperature: settings.temperature, top_p: settings.top_p, max_tokens: settings.max_tokens,
    };
  }

  async function ask(text) {
    readSettings();
    chat.messages.push({ role: 'user', content: text });
    const body = requestBody();
    const answer = { role: 'assistant', content: '', reasoning: '', pending: true };
    chat.messages.push(answer);
    store(CHAT_KEY, chat);
    renderAll();
    setBusy(true);
    controller = new AbortController();
    const t0 = performance.now();
    let tFirst = -1;
    let chunks = 0;
    let usage = null;
    let timings = null;
    const onEvent = (data) => {
      if (data === '[DONE]') return;
      const j = JSON.parse(data);
      if (j.error) { answer.error = j.error.message || 'the server reported an error'; return; }
      if (j.usage) usage = j.usage;
      if (j.timings) timings = j.timings;
      const choice = j.choices && j.choices[0];
      if (!choice) return;
      const d = choice.delta || {};
      if (d.content || d.reasoning_content) {
        if (tFirst < 0) tFirst = performance.now();
        chunks++;
        answer.content += d.content || '';
        answer.reasoning += d.reasoning_content || '';
        renderLast();
      }
      if (choice.finish_reason) answer.finish = choice.finish_reason;
    };
    try {
      const res = await fetch('/v1/chat/completions', {
        method: 'POST', headers: headers(), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!res.ok) {
        let msg = 'HTTP ' + res.status;
        try { const e = await res.json(); if (e.error && e.error.message) msg += ': ' + e.error.message; } catch { /* not JSON */ }
        throw new Error(msg);
      }
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true });
        let end;
        while ((end = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, end);
          buf = buf.slice(end + 2);
          for (const line of block.split('\n')) if (line.startsWith('data:')) onEvent(line.slice(5).trim());
        }
      }
    } catch (e) {
      if (e.name === 'AbortError') answer.stopped = true;
      else answer.error = e.message || String(e);
    } finally {
      const tEnd = performance.now();
      const tokens = usage ? usage.completion_tokens : chunks;
      let tps = timings && timings.predicted_per_second > 0 ? timings.predicted_per_second : 0;
      if (!tps && tFirst >= 0 && tEnd > tFirst && tokens > 1) tps = (tokens - 1) / ((tEnd - tFirst) / 1000);
      answer.stats = { tokens, tps, ttft_ms: tFirst >= 0 ? tFirst - t0 : -1, finish: answer.finish || '' };
      delete answer.finish;
      delete answer.pending;
      controller = null;
      store(CHAT_KEY, chat);
      setBusy(false);
      renderAll();
      els.input.focus();
    }
  }

  els.form.addEventListener('submit', (e) => {
    e.preventDefault();
    const text = els.input.value.trim();
    if (!text || controller) return;
    els.input.value = '';
    ask(text);
  });
  els.input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) { e.preventDefault(); els.form.requestSubmit(); }
  });
  els.stop.addEventListener('click', () => { if (controller) controller.abort(); });
  els.newChat.addEventListener('click', () => {
    if (controller) controller.abort();
    chat = { messages: [] };
    store(CHAT_KEY, chat);
    renderAll();
  });

  // An answer that was streaming when the page closed is kept as it was, marked stopped.
  for (const m of chat.messages) if (m.pending) { delete m.pending; m.stopped = true; }
  renderAll();
  fetch('/v1/models', { headers: headers() })
    .then((r) => (r.ok ? r.json() : Promise.reject(new Error('HTTP ' + r.status))))
    .then((j) => {
      const id = (j.data && j.data[0] && j.data[0].id) || 'model';
      els.model.textContent = id.split('/').pop();  // a path's file name
      els.model.title = id;
    })
    .catch((e) => { els.model.textContent = 'model list unavailable (' + e.message + ')'; });
})();
