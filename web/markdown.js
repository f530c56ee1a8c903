// A small Markdown renderer for the chat page: headings, paragraphs, bullet and numbered lists, block
// quotes, fenced code blocks (an unclosed fence, as while an answer streams, runs to the end), inline
// code, bold, italic, strikethrough and links. Every piece of text is HTML-escaped before any markup is
// added, and links keep only http(s)/mailto/relative targets, so model output cannot inject HTML.
// Works in the browser (window.renderMarkdown) and in Node (module.exports) for the tests.
(function (root) {
  'use strict';

  function escapeHtml(s) {
    return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;').replace(/'/g, '&#39;');
  }

  // A link target the page may point at: http(s), mailto, or relative/anchor; anything else is dropped.
  function safeUrl(url) {
    const u = url.trim();
    if (/^(https?:|mailto:)/i.test(u)) return u;
    if (/^[a-z][a-z0-9+.-]*:/i.test(u)) return null;  // javascript:, data:, vbscript:, ...
    return u;
  }

  // Inline markup over raw text: code spans are cut out first (their content is literal) and left as
  // placeholders, so that emphasis and links may span them; then links, bold, italic and strikethrough
  // over the escaped rest; then the code spans go back in.
  function renderInline(text) {
    const codes = [];
    let rest = text.replace(/\u0000/g, '');
    let masked = '';
    while (rest.length > 0) {
      const tick = rest.indexOf('`');
      if (tick < 0) { masked += rest; break; }
      let run = 1;
      while (rest[tick + run] === '`') run++;
      const fence = '`'.repeat(run);
      const close = rest.indexOf(fence, tick + run);
      if (close < 0) { masked += rest; break; }
      masked += rest.slice(0, tick) + '\u0000' + codes.length + '\u0000';
      codes.push('<code>' + escapeHtml(rest.slice(tick + run, close).replace(/^ (.*) $/, '$1')) + '</code>');
      rest = rest.slice(close + run);
    }
    return renderSpans(masked).replace(/\u0000(\d+)\u0000/g, (_, i) => codes[Number(i)]);
  }

  function renderSpans(text) {
    // Links are cut out before escaping so that their text and target are handled separately.
    const parts = [];
    const linkRe = /\[([^\]\n]+)\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g;
    let last = 0;
    let m;
    while ((m = linkRe.exec(text)) !== null) {
      parts.push(emphasis(escapeHtml(text.slice(last, m.index))));
      const href = safeUrl(m[2]);
      const label = emphasis(escapeHtml(m[1]));
      parts.push(href === null ? label
        : '<a href="' + escapeHtml(href) + '" target="_blank" rel="noopener noreferrer">' + label + '</a>');
      last = m.index + m[0].length;
    }
    parts.push(emphasis(escapeHtml(text.slice(last))));
    return parts.join('');
  }

  // Emphasis over already-escaped text (the markers * _ ~ are never produced by escaping).
  function emphasis(s) {
    return s
      .replace(/\*\*(?=\S)([\s\S]*?\S)\*\*/g, '<strong>$1</strong>')
      .replace(/__(?=\S)([\s\S]*?\S)__/g, '<strong>$1</strong>')
      .replace(/(^|[^*])\*(?=\S)([^*]*?\S)\*(?!\*)/g, '$1<em>$2</em>')
      .replace(/(^|[^\w_])_(?=\S)([^_]*?\S)_(?![\w_])/g, '$1<em>$2</em>')
      .replace(/~~(?=\S)([\s\S]*?\S)~~/g, '<del>$1</del>');
  }

  const fenceRe = /^ {0,3}(`{3,}|~{3,})\s*([\w+#.-]*)[^`]*$/;
  const headingRe = /^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
  const bulletRe = /^(\s*)[-*+]\s+(.*)$/;
  const numberRe = /^(\s*)(\d{1,9})[.)]\s+(.*)$/;
  const quoteRe = /^ {0,3}>\s?(.*)$/;
  const ruleRe = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;

  function renderMarkdown(src) {
    const lines = String(src).replace(/\r\n?/g, '\n').split('\n');
    const html = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      let m;
      if ((m = fenceRe.exec(line))) {
        const marker = m[1];
        const lang = m[2];
        const body = [];
        i++;
        while (i < lines.length && !(lines[i].trim().startsWith(marker) && lines[i].trim().replace(/[`~]/g, '') === '')) {
          body.push(lines[i]);
          i++;
        }
        i++;  // the closing fence (or past the end)
        const cls = lang ? ' class="language-' + escapeHtml(lang) + '"' : '';
        html.push('<pre><code' + cls + '>' + escapeHtml(body.join('\n')) + '</code></pre>');
        continue;
      }
      if (line.trim() === '') { i++; continue; }
      if ((m = headingRe.exec(line))) {
        const level = m[1].length;
        html.push('<h' + level + '>' + renderInline(m[2]) + '</h' + level + '>');
        i++;
        continue;
      }
      if (ruleRe.test(line)) { html.push('<hr>'); i++; continue; }
      if (quoteRe.test(line)) {
        const body = [];
        while (i < lines.length && (m = quoteRe.exec(lines[i]))) { body.push(m[1]); i++; }
        html.push('<blockquote>' + renderMarkdown(body.join('\n')) + '</blockquote>');
        continue;
      }
      if (bulletRe.test(line) || numberRe.test(line)) {
        i = renderList(lines, i, html);
        continue;
      }
      const para = [];
      while (i < lines.length && lines[i].trim() !== '' && !fenceRe.test(lines[i]) && !headingRe.test(lines[i]) &&
             !bulletRe.test(lines[i]) && !numberRe.test(lines[i]) && !quoteRe.test(lines[i])) {
        para.push(lines[i].trim());
        i++;
      }
      html.push('<p>' + para.map(renderInline).join('<br>') + '</p>');
    }
    return html.join('\n');
  }

  // A list starting at lines[i]: items of its kind at its indent; deeper-indented lines (nested lists,
  // continuation text) belong to the item above. Returns the index after the list.
  function renderList(lines, i, html) {
    const first = bulletRe.exec(lines[i]) || numberRe.exec(lines[i]);
    const ordered = !bulletRe.test(lines[i]);
    const indent = first[1].length;
    const start = ordered ? parseInt(first[2], 10) : 1;
    html.push(ordered ? (start !== 1 ? '<ol start="' + start + '">' : '<ol>') : '<ul>');
    while (i < lines.length) {
      const m = ordered ? numberRe.exec(lines[i]) : bulletRe.exec(lines[i]);
      if (!m || m[1].length !== indent) break;
      const body = [ordered ? m[3] : m[2]];
      i++;
      while (i < lines.length && lines[i].trim() !== '') {
        const lead = /^(\s*)/.exec(lines[i])[1].length;
        if (lead <= indent) break;
        body.push(lines[i].slice(Math.min(lead, indent + 2)));
        i++;
      }
      // A single blank line followed by an item at this indent keeps the list going.
      if (i + 1 < lines.length && lines[i] !== undefined && lines[i].trim() === '') {
        const next = ordered ? numberRe.exec(lines[i + 1]) : bulletRe.exec(lines[i + 1]);
        if (next && next[1].length === indent) i++;
      }
      const inner = body.length === 1 ? renderInline(body[0]) : renderMarkdown(body.join('\n'));
      html.push('<li>' + inner + '</li>');
    }
    html.push(ordered ? '</ol>' : '</ul>');
    return i;
  }

  const api = { renderMarkdown, escapeHtml, safeUrl };
  if (typeof module !== 'undefined' && module.exports) module.exports = api;
  else Object.assign(root, api);
})(typeof window !== 'undefined' ? window : this);
