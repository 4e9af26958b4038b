// Drives a running `nerve serve` (stories260K) with Ollama's official JavaScript library (`ollama`
// from npm) and asserts what its clients read: the model list, a model's details, chat whole and
// streamed (the library's own reading of the JSON lines), generate through the template and raw,
// structured output by a JSON schema, embeddings, the version, and the error the library raises for an
// unknown model. Usage: node check_ollama.mjs HOST API_KEY MODEL
import { Ollama } from 'ollama';
import assert from 'node:assert/strict';

const [host, apiKey, model] = process.argv.slice(2);
const ollama = new Ollama({ host, headers: { Authorization: `Bearer ${apiKey}` } });
const messages = [{ role: 'user', content: 'Once upon a time' }];
const options = { temperature: 0, num_predict: 20 };

const list = await ollama.list();
assert.equal(list.models[0].name, `${model}:latest`);
assert.ok(list.models[0].details.parameter_size.length > 0);
const shown = await ollama.show({ model });
assert.ok(shown.details.family.length > 0);
assert.ok(shown.capabilities.includes('completion'));
const ps = await ollama.ps();
assert.equal(ps.models[0].name, `${model}:latest`);
assert.ok((await ollama.version()).version.length > 0);

const whole = await ollama.chat({ model: `${model}:latest`, messages, options });
assert.equal(whole.done, true);
assert.equal(whole.done_reason, 'length');
assert.equal(whole.eval_count, 20);
assert.equal(whole.message.role, 'assistant');
assert.ok(whole.message.content.length > 0);

let streamed = '', last = null;
for await (const part of await ollama.chat({ model, messages, options, stream: true })) {
  streamed += part.message.content;
  last = part;
}
assert.equal(streamed, whole.message.content, 'streamed greedy text differs from the whole answer');
assert.equal(last.done, true);
assert.equal(last.eval_count, 20);
assert.ok(last.prompt_eval_count > 0 && last.total_duration > 0);

const gen = await ollama.generate({ model, prompt: 'Once upon a time', raw: true, options });
assert.equal(gen.done, true);
assert.ok(gen.response.length > 0);
let genStreamed = '';
for await (const part of await ollama.generate({ model, prompt: 'Once upon a time', raw: true, options, stream: true }))
  genStreamed += part.response;
assert.equal(genStreamed, gen.response);

const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 } }, required: ['name'] };
const structured = await ollama.chat({ model, messages: [{ role: 'user', content: 'Hi' }], format: schema,
                                       options: { temperature: 0 } });
assert.equal(typeof JSON.parse(structured.message.content).name, 'string');

const emb = await ollama.embed({ model, input: ['Once upon a time', 'Hi'] });
assert.equal(emb.embeddings.length, 2);
const norm = Math.hypot(...emb.embeddings[0]);
assert.ok(Math.abs(norm - 1) < 1e-4, `an embedding of length ${norm}`);

await assert.rejects(ollama.chat({ model: 'no-such-model', messages }), (e) => e.status_code === 404 && /not found/.test(e.message));
console.log(`ollama SDK check: ok (${model})`);
