// Drives a running `nerve serve` (stories260K) with the official OpenAI Node SDK and asserts what
// a client reads: models, completions, chat (whole and streamed with usage), sampling fields,
// log-probabilities, and the error bodies. Usage: node check.mjs BASE_URL API_KEY
import OpenAI from 'openai';
import assert from 'node:assert/strict';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const msg = [{ role: 'user', content: 'Once upon a time' }];

const models = await client.models.list();
assert.equal(models.data.length, 1);
const model = models.data[0].id;

const whole = await client.chat.completions.create({ model, messages: msg, max_tokens: 20, temperature: 0 });
assert.equal(whole.object, 'chat.completion');
assert.equal(whole.choices[0].message.role, 'assistant');
assert.ok(whole.choices[0].message.content.length > 0);
assert.equal(whole.usage.completion_tokens, 20);

const stream = await client.chat.completions.create({ model, messages: msg, max_tokens: 20, temperature: 0, stream: true,
                                                      stream_options: { include_usage: true } });
let text = '', usage = null, finish = null;
for await (const chunk of stream) {
  assert.equal(chunk.object, 'chat.completion.chunk');
  if (chunk.choices[0]?.delta?.content) text += chunk.choices[0].delta.content;
  if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
  if (chunk.usage) usage = chunk.usage;
}
assert.equal(text, whole.choices[0].message.content, 'streamed greedy text differs from the whole response');
assert.equal(finish, 'length');
assert.equal(usage.completion_tokens, 20);

const seeded = (seed) => client.chat.completions.create({ model, messages: msg, max_tokens: 24, temperature: 0.9, top_p: 0.9, seed,
                                                          frequency_penalty: 0.5, presence_penalty: 0.2, logit_bias: { '400': -100 } });
const [a, b] = [await seeded(42), await seeded(42)];
assert.equal(a.choices[0].message.content, b.choices[0].message.content, 'the same seed gave different text');

const lp = await client.chat.completions.create({ model, messages: msg, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 });
const content = lp.choices[0].logprobs.content;
assert.equal(content.length, lp.usage.completion_tokens);
assert.equal(content.map((t) => t.token).join(''), lp.choices[0].message.content);
for (const t of content) {
  assert.ok(t.logprob <= 0 && t.top_logprobs.length === 3 && t.top_logprobs[0].token === t.token);
  assert.deepEqual(Buffer.from(t.bytes).toString('utf8'), t.token);
}

const two = await client.chat.completions.create({ model, messages: msg, max_tokens: 8, temperature: 1, seed: 3, n: 2 });
assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);

const comp = await client.completions.create({ model, prompt: 'Lily and Ben', max_tokens: 16, temperature: 0, stop: ['.'] });
assert.equal(comp.object, 'text_completion');
assert.equal(comp.choices[0].finish_reason, 'stop');
assert.ok(!comp.choices[0].text.includes('.'));

// scoring a text, as evaluation harnesses do: echo, logprobs, nothing generated
const scored = await client.completions.create({ model, prompt: 'Lily and Ben went to the park', max_tokens: 0, echo: true, logprobs: 1 });
const sl = scored.choices[0].logprobs;
assert.equal(scored.choices[0].text, 'Lily and Ben went to the park');
assert.equal(sl.token_logprobs.length, scored.usage.prompt_tokens);
assert.equal(sl.token_logprobs[0], null);
assert.ok(sl.token_logprobs.slice(1).every((v) => v <= 0));
assert.equal(sl.tokens.join(''), scored.choices[0].text);

await assert.rejects(client.chat.completions.create({ model, messages: [], max_tokens: 5 }),
                     (e) => e.status === 400 && e.param === 'messages');
await assert.rejects(client.chat.completions.create({ model: 'gpt-4', messages: msg }),
                     (e) => e.status === 404 && e.code === 'model_not_found');
await assert.rejects(new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list(), (e) => e.status === 401);
console.log('openai SDK check: ok (' + model + ')');
