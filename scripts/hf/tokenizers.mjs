// tokenizer.json read by nerve against transformers.js's tokenizers (@lenml/tokenizers, a port of
// them), in both directions:
//   read:    a Hub tokenizer.json (+ tokenizer_config.json) in FOLDER, encoded by nerve -z FOLDER/tokenizer.json
//   written: a tokenizer.json nerve exported into FOLDER, encoded by the library, against nerve -z ORIGINAL
// The ids of every text must be the same.
//   node tokenizers.mjs NODE_MODULES NERVE FOLDER CORPUS [ORIGINAL_TOKENIZER]
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [modules, nerve, folder, corpus, original] = process.argv.slice(2);
const { TokenizerLoader } = await import(pathToFileURL(`${modules}/@lenml/tokenizers/dist/main.mjs`));
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(`${folder}/tokenizer.json`, 'utf8')),
  tokenizerConfig: JSON.parse(readFileSync(`${folder}/tokenizer_config.json`, 'utf8')),
});
const texts = [
  'grabbed', ' grabbed', '           grabbed', '\n', ' \n', '\ttabs\t\t\t\tout here', 'ax\n####\nboo', '镇', '🦙', 'Ꙋ🦙',
  'This is a test sentence.', "I'll can't WE'RE you've HE'S they'd", '1 12 123 1234 12345 123456', '3.14159, 2,718 and -42',
  '   leading and trailing   ', 'a\r\nb\r\n\r\nc', 'Ünïcödé façade naïve café', 'Привет, мир! Как дела?', '日本語のテキストと中文文本',
  'emoji 👍🏽 family 👨‍👩‍👧 flags 🇫🇷', 'x\u00a0nbsp\u2009thin\u3000ideographic', '<html><body class="x">&amp;</body></html>',
  'new\n\n\nlines\n', ' ', '  ', 'trailing space ',
  'a  1', 'x   42 y', 'tab\t\t7', '  9', 'end  \n3', '1  2  3', // white space before digits (SmolLM's split)
  'cafe\u0301 A\u030a\u0301 \u0958 \u1100\u1161\u11a8 o\u0308\u0304', // decomposed: Qwen's NFC composes them
];
for (const line of readFileSync(corpus, 'utf8').split('\n')) if (line.length) texts.push(line);
const want = texts.map((t) => Array.from(tok.encode(t, { add_special_tokens: false })).join(' '));
const z = original ?? `${folder}/tokenizer.json`;
const out = execFileSync(nerve, ['tokenize', '-z', z, '--null-separated'], {
  input: Buffer.from(texts.join('\0'), 'utf8'), maxBuffer: 1 << 28,
}).toString('utf8').split('\n');
let bad = 0;
texts.forEach((t, i) => {
  if (out[i] === want[i]) return;
  if (bad++ < 5) console.error(`differs: ${JSON.stringify(t.slice(0, 80))}\n  nerve:   ${out[i].slice(0, 200)}\n  library: ${want[i].slice(0, 200)}`);
});
console.log(`hf_check: ${original ? `${folder}/tokenizer.json (written from ${original})` : `${folder}/tokenizer.json`}: ` +
            `${texts.length - bad} of ${texts.length} texts encode as transformers.js does`);
process.exit(bad ? 1 : 0);
