// Runs the chat page's script (src/serve/webui.html) in node against a live `nerve serve`, on a
// small stand-in for the DOM: the models list, a streamed answer with its usage line, the
// conversation kept for the next turn, and a refused request (a wrong API key) shown as an error
// that leaves the conversation as it was; and its Markdown rendering of an answer, element by
// element, text never taken for markup. The page is the one the server answers GET / with.
// Usage: node webui_check.js URL KEY; prints "ok".
'use strict';
const vm = require('vm');

const [base, key] = process.argv.slice(2);

class El {
  constructor(tag) {
    this.tag = tag;
    this.children = [];
    this.text = '';
    this.value = '';
    this.className = '';
    this.listeners = {};
    this.scrollTop = 0;
    this.scrollHeight = 0;
    this.parent = null;
    const classes = new Set();
    this.classList = { toggle: (c) => (classes.has(c) ? classes.delete(c) : classes.add(c)) };
  }
  get textContent() { return this.children.length ? this.children.map((c) => c.textContent).join('') : this.text; }
  set textContent(t) { this.children = []; this.text = String(t); }
  appendChild(c) { c.parent = this; this.children.push(c); return c; }
  append(...cs) { for (const c of cs) this.appendChild(c); }
  remove() { if (this.parent) this.parent.children = this.parent.children.filter((x) => x !== this); }
  get lastChild() { return this.children[this.children.length - 1] || null; }
  addEventListener(ev, f) { this.listeners[ev] = f; }
  requestSubmit() { this.listeners.submit({ preventDefault() {} }); }
}

const byId = {};
const document = {
  getElementById: (id) => byId[id] || (byId[id] = new El(id)),
  createElement: (tag) => new El(tag),
  createTextNode: (text) => Object.assign(new El('#text'), { text: String(text) }),
};
const store = {};
const localStorage = { getItem: (k) => (k in store ? store[k] : null), setItem: (k, v) => { store[k] = String(v); } };
store['nerve.key'] = key;
store['nerve.maxtok'] = '12';
store['nerve.temp'] = '0';
const context = vm.createContext({
  document, localStorage, performance, TextDecoder, AbortController, console, JSON, Error, String, parseInt, parseFloat, isNaN,
  fetch: (url, opts) => fetch(base + url, opts),
});

/* The tree under el as a compact string: tag(children), text nodes quoted, a link's address after @. */
function shape(el) {
  if (el.tag === '#text') return JSON.stringify(el.text);
  const inner = el.children.length ? el.children.map(shape).join(',') : el.text ? JSON.stringify(el.text) : '';
  return el.tag + (el.href ? '@' + el.href : '') + (el.start ? '#' + el.start : '') + (el.className ? '.' + el.className : '') +
    '(' + inner + ')';
}

/* The page's Markdown: each input's tree as the page builds it. */
function checkMarkdown(markdown) {
  const cases = [
    ['plain\nsecond line', 'div(p("plain","\\n","second line"))'],
    ['# Title\n\nSome **bold** and `a <b>` and *it* [x](https://e.com/a) [y](javascript:alert(1))',
     'div(h1("Title"),p("Some ",strong("bold")," and ",code("a <b>")," and ",em("it")," ",a@https://e.com/a("x")," [y](javascript:alert(1))"))'],
    ['```c\nint <script>;\n```\n- a\n- b\n\n3. c\n4. d', 'div(pre(code.language-c("int <script>;")),ul(li("a"),li("b")),ol#3(li("c"),li("d")))'],
    ['> q1\n> q2\n\n---\nsnake_case_name and 2 * 3 * 4', 'div(blockquote("q1","\\n","q2"),hr(),p("snake_case_name and 2 * 3 * 4"))'],
    ['```\nstill streaming', 'div(pre(code("still streaming")))'],
    ['<img src=x onerror=alert(1)>', 'div(p("<img src=x onerror=alert(1)>"))'],
    ['| Name | Qty |\n| :--- | ---: |\n| **tea** | 2 |\n| cake |\n\nafter',
     'div(table(thead(tr(th.left("Name"),th.right("Qty"))),tbody(tr(td.left(strong("tea")),td.right("2")),tr(td.left("cake"),td.right()))),p("after"))'],
    ['a \\| b | c\n:-: | ---\n1 | <b>2</b>', 'div(table(thead(tr(th.center("a | b"),th("c"))),tbody(tr(td.center("1"),td("<b>2</b>")))))'],
    ['a | b\n---', 'div(p("a | b"),hr())'],
    ['- a\n  - b\n    1. c\n  - d\n- e\n\n- f\ng', 'div(ul(li("a",ul(li("b",ol(li("c"))),li("d"))),li("e"),li("f","\\n","g")))'],
  ];
  for (const [text, want] of cases) {
    const box = new El('div');
    markdown(box, text);
    if (shape(box) !== want) fail('markdown of ' + JSON.stringify(text) + ': ' + shape(box) + ' against ' + want);
  }
}

function fail(msg) {
  console.log('not ok: ' + msg);
  process.exit(1);
}
const until = async (what, cond) => {
  for (let i = 0; i < 600 && !cond(); i++) await new Promise((r) => setTimeout(r, 50));
  if (!cond()) fail('timed out waiting for ' + what);
};

(async () => {
  const html = await (await fetch(base + '/')).text();
  vm.runInContext(html.slice(html.indexOf('<script>') + 8, html.indexOf('</script>')), context);
  const model = document.getElementById('model'), log = document.getElementById('log');
  const markdown = vm.runInContext('markdown', context);
  checkMarkdown(markdown);
  await until('the models list', () => model.children.length > 0);
  model.value = model.children[0].value; // a browser's select takes its first option
  if (!model.value) fail('no model id in the list');

  byId.input.value = 'Once upon a time';
  byId.form.listeners.submit({ preventDefault() {} });
  await until('the answer', () => vm.runInContext('chat.length', context) === 2 && vm.runInContext('busy', context) === null);
  const [q, a] = log.children;
  if (!q || q.className !== 'msg user' || q.textContent !== 'Once upon a time') fail('the question bubble: ' + (q && q.textContent));
  if (!a || a.className !== 'msg assistant') fail('the answer bubble: ' + (a && a.className));
  const said = vm.runInContext('chat[1].content', context);
  const rendered = Object.assign(new El('div'), { className: 'answer' });
  markdown(rendered, said || '');
  if (!said || a.said !== said || shape(a.children[0]) !== shape(rendered))
    fail('the answer kept in the conversation: "' + said + '" against ' + shape(a.children[0]));
  if (!/\d+ prompt tokens, [1-9]\d* generated, [\d.]+ tokens\/s/.test(a.lastChild.textContent)) fail('the usage line: ' + a.lastChild.textContent);
  if (byId.input.value !== '') fail('the input was not cleared');

  byId.key.value = 'not-the-key';
  byId.input.value = 'And then?';
  byId.form.listeners.submit({ preventDefault() {} });
  await until('the refusal', () => log.children.length === 4 && vm.runInContext('busy', context) === null);
  const err = log.children[3];
  if (err.className !== 'msg err' || !/^401: /.test(err.textContent)) fail('the refusal: ' + err.className + ' ' + err.textContent);
  if (vm.runInContext('chat.length', context) !== 2) fail('a refused question stayed in the conversation');
  console.log('ok');
})().catch((e) => fail(String(e && e.stack || e)));
