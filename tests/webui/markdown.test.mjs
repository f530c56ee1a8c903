// The chat page's Markdown renderer (web/markdown.js) in Node: block and inline markup, escaping of
// every piece of model text, unsafe link targets dropped, and an unclosed code fence (mid-stream).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const { renderMarkdown, escapeHtml, safeUrl } = require('../../web/markdown.js');

test('headings, paragraphs, emphasis, inline code', () => {
  assert.equal(renderMarkdown('# Title'), '<h1>Title</h1>');
  assert.equal(renderMarkdown('### Three ###'), '<h3>Three</h3>');
  assert.equal(renderMarkdown('a **b** *c* _d_ ~~e~~ `f`'),
               '<p>a <strong>b</strong> <em>c</em> <em>d</em> <del>e</del> <code>f</code></p>');
  assert.equal(renderMarkdown('line one\nline two\n\nnext'), '<p>line one<br>line two</p>\n<p>next</p>');
  assert.equal(renderMarkdown('`` a ` b ``'), '<p><code>a ` b</code></p>');
  assert.equal(renderMarkdown('the **`+` operator** and `a*b*c`'),
               '<p>the <strong><code>+</code> operator</strong> and <code>a*b*c</code></p>');
  assert.equal(renderMarkdown('2 * 3 * 4'), '<p>2 * 3 * 4</p>');
  assert.equal(renderMarkdown('snake_case_name'), '<p>snake_case_name</p>');
});

test('lists, nesting, quotes, rules', () => {
  assert.equal(renderMarkdown('- a\n- b'), '<ul>\n<li>a</li>\n<li>b</li>\n</ul>');
  assert.equal(renderMarkdown('3. x\n4. y'), '<ol start="3">\n<li>x</li>\n<li>y</li>\n</ol>');
  assert.equal(renderMarkdown('- a\n  - b\n- c'), '<ul>\n<li><p>a</p>\n<ul>\n<li>b</li>\n</ul></li>\n<li>c</li>\n</ul>');
  assert.equal(renderMarkdown('> quoted **text**'), '<blockquote><p>quoted <strong>text</strong></p></blockquote>');
  assert.equal(renderMarkdown('---'), '<hr>');
});

test('fenced code is literal and escaped; an unclosed fence runs to the end', () => {
  assert.equal(renderMarkdown('```js\nif (a < b && c) { x = "**y**"; }\n```'),
               '<pre><code class="language-js">if (a &lt; b &amp;&amp; c) { x = &quot;**y**&quot;; }</code></pre>');
  assert.equal(renderMarkdown('text\n```\ncode <b>\nmore'), '<p>text</p>\n<pre><code>code &lt;b&gt;\nmore</code></pre>');
  assert.equal(renderMarkdown('~~~\n# not a heading\n~~~\nafter'), '<pre><code># not a heading</code></pre>\n<p>after</p>');
});

test('HTML in model output is text, never markup', () => {
  const evil = '<script>alert(1)</script> <img src=x onerror="alert(2)"> **<b>x</b>**';
  const html = renderMarkdown(evil);
  assert.ok(!/<(script|img|b)\b/.test(html), html);
  assert.ok(html.includes('&lt;script&gt;alert(1)&lt;/script&gt;'));
  assert.ok(html.includes('<strong>&lt;b&gt;x&lt;/b&gt;</strong>'));
  assert.equal(escapeHtml(`<a href="x" title='y'>&`), '&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;');
  assert.equal(renderMarkdown('# <i>h</i>'), '<h1>&lt;i&gt;h&lt;/i&gt;</h1>');
  assert.equal(renderMarkdown('- <u>item</u>'), '<ul>\n<li>&lt;u&gt;item&lt;/u&gt;</li>\n</ul>');
});

test('links: safe targets kept, quotes escaped, script URLs dropped', () => {
  assert.equal(renderMarkdown('[docs](https://example.com/a?b=1&c=2)'),
               '<p><a href="https://example.com/a?b=1&amp;c=2" target="_blank" rel="noopener noreferrer">docs</a></p>');
  assert.equal(renderMarkdown('[x](javascript:alert)'), '<p>x</p>');
  assert.equal(renderMarkdown('[x](data:text/html,hi)'), '<p>x</p>');
  assert.equal(renderMarkdown('[x](https://e.com/"onmouseover="a)'),
               '<p><a href="https://e.com/&quot;onmouseover=&quot;a" target="_blank" rel="noopener noreferrer">x</a></p>');
  assert.equal(safeUrl('JavaScript:alert(1)'), null);
  assert.equal(safeUrl('/relative/path'), '/relative/path');
  assert.equal(safeUrl('mailto:a@b.c'), 'mailto:a@b.c');
  assert.equal(renderMarkdown('`[x](javascript:a)`'), '<p><code>[x](javascript:a)</code></p>');
});
