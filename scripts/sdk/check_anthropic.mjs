// Drives a running `nerve serve` (stories260K, chatml) with the official Anthropic TypeScript SDK
// and asserts what a client reads from /v1/messages: whole and streamed messages (the SDK's own
// accumulation of the events), stop sequences, prefill, token counting, tool use against a second
// server (TOOLS_URL) whose model has room for the tools, the errors the SDK raises, and Message
// Batches (the first server runs with --files-dir).
// Usage: node check_anthropic.mjs BASE_URL API_KEY TOOLS_URL MODEL TOOLS_MODEL
import Anthropic from '@anthropic-ai/sdk';
import assert from 'node:assert/strict';

const [baseURL, apiKey, toolsURL, model, toolsModel] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey, maxRetries: 0 });
const messages = [{ role: 'user', content: 'Once upon a time' }];

const listed = await client.models.list();
assert.equal(listed.data[0].id, model);
assert.equal(listed.data[0].type, 'model');

const whole = await client.messages.create({ model, max_tokens: 20, temperature: 0, messages });
assert.equal(whole.type, 'message');
assert.equal(whole.role, 'assistant');
assert.ok(whole.id.startsWith('msg_'));
assert.equal(whole.content[0].type, 'text');
assert.ok(whole.content[0].text.length > 0);
assert.equal(whole.stop_reason, 'max_tokens');
assert.equal(whole.usage.output_tokens, 20);

// the SDK's stream helper puts the events together into the same message
const stream = client.messages.stream({ model, max_tokens: 20, temperature: 0, messages });
let deltas = '';
stream.on('text', (t) => { deltas += t; });
const final = await stream.finalMessage();
assert.equal(deltas, whole.content[0].text, 'streamed greedy text differs from the whole response');
assert.equal(final.content[0].text, whole.content[0].text);
assert.equal(final.stop_reason, 'max_tokens');
assert.equal(final.usage.output_tokens, 20);

// raw events, in Anthropic's order
const raw = await client.messages.create({ model, max_tokens: 5, temperature: 0, messages, stream: true });
const types = [];
for await (const ev of raw) types.push(ev.type);
assert.deepEqual([types[0], types.at(-2), types.at(-1)], ['message_start', 'message_delta', 'message_stop']);
assert.ok(types.includes('content_block_start') && types.includes('content_block_delta') && types.includes('content_block_stop'));

// a stop sequence taken from the greedy text ends the answer before it and is named
const words = whole.content[0].text.match(/[a-z]{3,}/g) ?? [];
assert.ok(words.length > 0, 'no word to stop at');
const seq = words.at(-1);
const stopped = await client.messages.create({ model, max_tokens: 20, temperature: 0, messages, stop_sequences: [seq] });
assert.equal(stopped.stop_reason, 'stop_sequence');
assert.equal(stopped.stop_sequence, seq);
assert.equal(stopped.content[0].text, whole.content[0].text.slice(0, whole.content[0].text.indexOf(seq)));

// prefill: the answer continues the assistant's text; a system prompt
const pre = await client.messages.create({ model, max_tokens: 8, temperature: 0, system: 'Tell a story.',
                                           messages: [...messages, { role: 'assistant', content: 'Lily' }] });
const cont = await (await fetch(`${baseURL}/v1/chat/completions`, { method: 'POST',
  headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${apiKey}` },
  body: JSON.stringify({ model, max_tokens: 8, temperature: 0, continue_final_message: true,
                         messages: [{ role: 'system', content: 'Tell a story.' }, ...messages, { role: 'assistant', content: 'Lily' }] }) })).json();
assert.equal(pre.content[0].text, cont.choices[0].message.content, 'the prefill is not continued as continue_final_message does');

const count = await client.messages.countTokens({ model, messages });
assert.equal(count.input_tokens, whole.usage.input_tokens + whole.usage.cache_read_input_tokens);

// errors: the SDK's classes from the status and Anthropic's error body
await assert.rejects(client.messages.create({ model: 'claude-nonesuch', max_tokens: 5, messages }),
                     (e) => e instanceof Anthropic.NotFoundError && e.error?.error?.type === 'not_found_error');
await assert.rejects(client.messages.create({ model, max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image',
                     source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] }),
                     (e) => e instanceof Anthropic.BadRequestError && /text only/.test(e.message));
await assert.rejects(new Anthropic({ baseURL, apiKey: 'wrong', maxRetries: 0 }).messages.create({ model, max_tokens: 5, messages }),
                     (e) => e instanceof Anthropic.AuthenticationError);

// tools: a forced call comes back as a tool_use block whose input fits the schema, whole and streamed
const tools = new Anthropic({ baseURL: toolsURL, apiKey, maxRetries: 0 });
const weather = { name: 'get_weather', description: 'Weather for a city',
                  input_schema: { type: 'object', properties: { city: { type: 'string', maxLength: 12 } }, required: ['city'] } };
const ask = { model: toolsModel, max_tokens: 200, temperature: 0, tools: [weather], tool_choice: { type: 'tool', name: 'get_weather' },
              messages: [{ role: 'user', content: 'Weather in Oslo?' }] };
const call = await tools.messages.create(ask);
assert.equal(call.stop_reason, 'tool_use');
const use = call.content.find((b) => b.type === 'tool_use');
assert.ok(use && use.id.startsWith('toolu_') && use.name === 'get_weather' && typeof use.input.city === 'string');
const streamed = await tools.messages.stream(ask).finalMessage();
assert.deepEqual(streamed.content.find((b) => b.type === 'tool_use').input, use.input);
// and its result goes back
const after = await tools.messages.create({ ...ask, tool_choice: { type: 'auto' }, max_tokens: 4, messages: [
  ...ask.messages, { role: 'assistant', content: call.content },
  { role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'Sunny, 21 C' }] }] });
assert.equal(after.type, 'message');

// Message Batches (the server runs with --files-dir): created inline, polled, results read back
let mb = await client.messages.batches.create({ requests: [0, 1].map((i) => ({ custom_id: `r${i}`,
  params: { model, max_tokens: 10 + i, temperature: 0, messages } })).concat([{ custom_id: 'bad', params: { model: 'nope', max_tokens: 5, messages } }]) });
assert.equal(mb.type, 'message_batch');
assert.equal(mb.request_counts.processing, 3);
for (let t = 0; mb.processing_status !== 'ended' && t < 600; t++) {
  await new Promise((r) => setTimeout(r, 100));
  mb = await client.messages.batches.retrieve(mb.id);
}
assert.equal(mb.processing_status, 'ended');
assert.deepEqual(mb.request_counts, { processing: 0, succeeded: 2, errored: 1, canceled: 0, expired: 0 });
const got = {};
for await (const r of await client.messages.batches.results(mb.id)) got[r.custom_id] = r.result;
assert.equal(got.bad.type, 'errored');
for (const i of [0, 1]) {
  const alone = await client.messages.create({ model, max_tokens: 10 + i, temperature: 0, messages });
  assert.equal(got[`r${i}`].type, 'succeeded');
  assert.equal(got[`r${i}`].message.content[0].text, alone.content[0].text);
}
const ids = [];
for await (const b of client.messages.batches.list({ limit: 10 })) ids.push(b.id);
assert.ok(ids.includes(mb.id));
assert.equal((await client.messages.batches.delete(mb.id)).type, 'message_batch_deleted');
await assert.rejects(client.messages.batches.retrieve(mb.id), (e) => e.status === 404);

console.log('sdk_check: the Anthropic SDK checks passed');
