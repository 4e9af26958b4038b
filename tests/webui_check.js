// Runs the chat page's script (src/serve/webui.html) in node against a live `nerve serve`, on a
// small stand-in for the DOM: the models list, a streamed answer with its usage line, the
// conversation kept for the next turn, and a refused request (a wrong API key) shown as an error
// that leaves the conversation as it was. The page is the one the server answers GET / with.
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
  if (!said || !a.textContent.startsWith(said)) fail('the answer kept in the conversation: "' + said + '" against "' + a.textContent + '"');
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
