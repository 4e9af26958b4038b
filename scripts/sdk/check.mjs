// Drives a running `nerve serve` (stories260K) with the official OpenAI Node SDK and asserts what
// a client reads: models, completions, chat (whole and streamed with usage), sampling fields,
// log-probabilities, structured outputs, tool calls (against a second server, TOOLS_URL, whose
// model has room for the tools' description), the Responses API, and the error bodies.
// Usage: node check.mjs BASE_URL API_KEY TOOLS_URL
import OpenAI, { toFile } from 'openai';
import { createHash } from 'node:crypto';
import assert from 'node:assert/strict';

const [baseURL, apiKey, toolsURL] = process.argv.slice(2);
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

// structured outputs: the answer parses and fits the schema
const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 9 } },
                 required: ['name', 'age'], additionalProperties: false };
for (const seed of [1, 2, 3]) {
  const r = await client.chat.completions.create({ model, messages: msg, max_tokens: 200, seed,
                                                   response_format: { type: 'json_schema', json_schema: { name: 'kid', schema, strict: true } } });
  if (r.choices[0].finish_reason !== 'stop') continue;
  const v = JSON.parse(r.choices[0].message.content);
  assert.ok(typeof v.name === 'string' && Number.isInteger(v.age) && v.age >= 0 && v.age <= 9 && Object.keys(v).length === 2);
}

// tool calls, whole and streamed (the stream's deltas put together as the SDK's users do)
if (toolsURL) {
  const tc = new OpenAI({ baseURL: toolsURL, apiKey, maxRetries: 0 });
  const tmodel = (await tc.models.list()).data[0].id;
  const tools = [{ type: 'function', function: { name: 'play', description: 'Play with a toy',
                                                 parameters: { type: 'object', properties: { toy: { enum: ['ball', 'car'] } }, required: ['toy'] } } }];
  const req = { model: tmodel, messages: [{ role: 'user', content: 'Play?' }], tools, tool_choice: 'required', max_tokens: 300, seed: 5 };
  const w = await tc.chat.completions.create(req);
  assert.equal(w.choices[0].finish_reason, 'tool_calls');
  assert.equal(w.choices[0].message.content, null);
  const call = w.choices[0].message.tool_calls[0];
  assert.ok(call.id.startsWith('call_') && call.type === 'function' && call.function.name === 'play');
  assert.ok(['ball', 'car'].includes(JSON.parse(call.function.arguments).toy));
  const calls = [];
  let fin = null;
  for await (const chunk of await tc.chat.completions.create({ ...req, stream: true })) {
    for (const d of chunk.choices[0]?.delta?.tool_calls ?? []) {
      calls[d.index] ??= { id: d.id, name: '', arguments: '' };
      calls[d.index].name += d.function?.name ?? '';
      calls[d.index].arguments += d.function?.arguments ?? '';
    }
    fin = chunk.choices[0]?.finish_reason ?? fin;
  }
  assert.equal(fin, 'tool_calls');
  assert.deepEqual(calls.map((c) => [c.name, c.arguments]), w.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]));
  // the result goes back as a tool message
  const next = await tc.chat.completions.create({ model: tmodel, tools, max_tokens: 4, seed: 1,
    messages: [{ role: 'user', content: 'Play?' }, w.choices[0].message, { role: 'tool', tool_call_id: call.id, content: 'played' }] });
  assert.equal(next.choices[0].finish_reason, 'length');

  // the Responses API: a forced function call, whole and streamed, and its output sent back
  const rtools = [{ type: 'function', name: 'play', description: 'Play with a toy', parameters: tools[0].function.parameters }];
  const rreq = { model: tmodel, input: 'Play?', tools: rtools, tool_choice: 'required', max_output_tokens: 300, temperature: 0 };
  const rw = await tc.responses.create(rreq);
  const fc = rw.output.find((o) => o.type === 'function_call');
  assert.ok(fc && fc.name === 'play' && fc.call_id.startsWith('call_') && ['ball', 'car'].includes(JSON.parse(fc.arguments).toy));
  const rs = tc.responses.stream(rreq);
  let args = '';
  rs.on('response.function_call_arguments.delta', (e) => { args += e.delta; });
  const rfinal = await rs.finalResponse();
  assert.equal(args, fc.arguments);
  assert.equal(rfinal.output.find((o) => o.type === 'function_call').arguments, fc.arguments);
  const rnext = await tc.responses.create({ model: tmodel, tools: rtools, max_output_tokens: 4, temperature: 0,
    input: [{ role: 'user', content: 'Play?' }, fc, { type: 'function_call_output', call_id: fc.call_id, output: 'played' }] });
  assert.equal(rnext.status, 'incomplete');
}

// the Responses API: the same greedy text as chat, whole and streamed; structured output; errors
const textOf = (r) => r.output.filter((o) => o.type === 'message').flatMap((o) => o.content)
  .filter((c) => c.type === 'output_text').map((c) => c.text).join('');
const rtext = await client.responses.create({ model, input: 'Once upon a time', instructions: 'Tell a story.',
                                              max_output_tokens: 20, temperature: 0 });
const ctext = await client.chat.completions.create({ model, max_tokens: 20, temperature: 0,
  messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }] });
if (client.responses.inputTokens) // (SDKs that have it): the prompt tokens the same request gives, without generating
  assert.equal((await client.responses.inputTokens.count({ model, input: 'Once upon a time', instructions: 'Tell a story.' })).input_tokens,
               rtext.usage.input_tokens);
assert.equal(rtext.object, 'response');
assert.equal(textOf(rtext), ctext.choices[0].message.content, 'the Responses text differs from chat');
assert.equal(rtext.status, 'incomplete');
assert.equal(rtext.incomplete_details.reason, 'max_output_tokens');
assert.equal(rtext.usage.output_tokens, 20);
let rdeltas = '';
const rstream = client.responses.stream({ model, input: 'Once upon a time', instructions: 'Tell a story.', max_output_tokens: 20, temperature: 0 });
rstream.on('response.output_text.delta', (e) => { rdeltas += e.delta; });
const rdone = await rstream.finalResponse();
assert.equal(rdeltas, textOf(rtext));
assert.equal(textOf(rdone), textOf(rtext));
const rjson = await client.responses.create({ model, input: 'Once upon a time', max_output_tokens: 200, temperature: 0,
                                              text: { format: { type: 'json_schema', name: 'kid', schema, strict: true } } });
assert.equal(rjson.status, 'completed');
const kid = JSON.parse(textOf(rjson));
assert.ok(typeof kid.name === 'string' && Number.isInteger(kid.age) && kid.age >= 0 && kid.age <= 9);
await assert.rejects(client.responses.create({ model, input: 'x', previous_response_id: 'resp_1' }),
                     (e) => e.status === 400 && e.param === 'previous_response_id');
// stored responses: continued by previous_response_id (the chat conversation's text), retrieved,
// their input items listed, deleted
assert.equal(rtext.store, true);
const rcont = await client.responses.create({ model, previous_response_id: rtext.id, input: 'And then?', max_output_tokens: 8, temperature: 0 });
const ccont = await client.chat.completions.create({ model, max_tokens: 8, temperature: 0, messages: [
  { role: 'user', content: 'Once upon a time' }, { role: 'assistant', content: textOf(rtext) }, { role: 'user', content: 'And then?' }] });
assert.equal(rcont.previous_response_id, rtext.id);
assert.equal(textOf(rcont), ccont.choices[0].message.content, 'a continued response differs from the chat conversation');
assert.equal(rcont.usage.input_tokens, ccont.usage.prompt_tokens);
const got = await client.responses.retrieve(rtext.id);
const { output_text: _a, ...gotFields } = got, { output_text: _b, ...rtextFields } = rtext; // the SDK's convenience field, on create() only
assert.deepEqual(gotFields, rtextFields);
const items = [];
for await (const it of client.responses.inputItems.list(rcont.id)) items.push(it);
assert.equal(items.length, 1);
assert.equal(items[0].content[0].text, 'And then?');
await client.responses.del(rtext.id);
await assert.rejects(client.responses.retrieve(rtext.id), (e) => e.status === 404);
// a background response: answered queued, polled until it ends, the text the foreground gives
const bgReq = { model, input: 'Once upon a time', max_output_tokens: 24, temperature: 0 };
let bg = await client.responses.create({ ...bgReq, background: true });
assert.equal(bg.status, 'queued');
assert.equal(bg.background, true);
for (let t = 0; ['queued', 'in_progress'].includes(bg.status) && t < 600; t++) {
  await new Promise((r) => setTimeout(r, 50));
  bg = await client.responses.retrieve(bg.id);
}
assert.equal(textOf(bg), textOf(await client.responses.create(bgReq)));
if (typeof client.responses.cancel === 'function') assert.equal((await client.responses.cancel(bg.id)).status, bg.status); // an ended one: as it ended
// a background response streamed: the client leaves after event 5 (the stream closes, the response
// runs on) and resumes after it; the events in order, the same text
const evs = [];
let bgId;
for await (const ev of await client.responses.create({ ...bgReq, background: true, stream: true })) {
  evs.push(ev);
  if (ev.type === 'response.created') bgId = ev.response.id;
  if (ev.sequence_number === 5) break;
}
assert.deepEqual(evs.slice(0, 3).map((e) => e.type), ['response.created', 'response.queued', 'response.in_progress']);
for await (const ev of await client.responses.retrieve(bgId, { stream: true, starting_after: 5 })) evs.push(ev);
assert.deepEqual(evs.map((e) => e.sequence_number), evs.map((_, i) => i));
const bgLast = evs[evs.length - 1].response;
assert.equal(bgLast.status, bg.status);
assert.equal(textOf(bgLast), textOf(bg));
assert.equal(evs.filter((e) => e.type === 'response.output_text.delta').map((e) => e.delta).join(''), textOf(bg));

// the Conversations API (SDKs from v5 have it): a response in a conversation sees its items, and
// its own input and answer are added to it
if (client.conversations) {
  const conv = await client.conversations.create({ items: [{ type: 'message', role: 'user', content: 'Once upon a time' }], metadata: { k: 'v' } });
  assert.ok(conv.id.startsWith('conv_'));
  const r1 = await client.responses.create({ model, conversation: conv.id, input: 'The end?', max_output_tokens: 8, temperature: 0 });
  const c1 = await client.chat.completions.create({ model, max_tokens: 8, temperature: 0, messages: [
    { role: 'user', content: 'Once upon a time' }, { role: 'user', content: 'The end?' }] });
  assert.equal(textOf(r1), c1.choices[0].message.content);
  assert.equal(r1.conversation.id, conv.id);
  const its = [];
  for await (const it of client.conversations.items.list(conv.id, { order: 'asc' })) its.push(it);
  assert.deepEqual(its.map((i) => i.role), ['user', 'user', 'assistant']);
  assert.equal((await client.conversations.items.retrieve(its[2].id, { conversation_id: conv.id })).id, r1.output[0].id);
  const added = await client.conversations.items.create(conv.id, { items: [{ type: 'message', role: 'user', content: 'More.' }] });
  assert.equal(added.data.length, 1);
  await client.conversations.items.delete(its[0].id, { conversation_id: conv.id });
  assert.equal((await client.conversations.update(conv.id, { metadata: { k: 'w' } })).metadata.k, 'w');
  assert.equal((await client.conversations.delete(conv.id)).deleted, true);
  await assert.rejects(client.conversations.retrieve(conv.id), (e) => e.status === 404);
}

// embeddings: the SDK asks for base64 by default and decodes it; float gives the same numbers
const emb = await client.embeddings.create({ model, input: ['Once upon a time', 'The dog ran'] });
assert.equal(emb.data.length, 2);
assert.equal(emb.data[1].index, 1);
const v0 = emb.data[0].embedding;
assert.ok(v0.length > 0 && Math.abs(v0.reduce((s, x) => s + x * x, 0) - 1) < 1e-4, 'unit length');
const embf = await client.embeddings.create({ model, input: 'Once upon a time', encoding_format: 'float' });
assert.deepEqual(embf.data[0].embedding.map((x) => Math.fround(x)), Array.from(v0));
assert.ok(emb.usage.prompt_tokens > 0);
await assert.rejects(client.embeddings.create({ model, input: '' }), (e) => e.status === 400 && e.param === 'input');

await assert.rejects(client.chat.completions.create({ model, messages: [], max_tokens: 5 }),
                     (e) => e.status === 400 && e.param === 'messages');
await assert.rejects(client.chat.completions.create({ model: 'gpt-4', messages: msg }),
                     (e) => e.status === 404 && e.code === 'model_not_found');
await assert.rejects(new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0 }).models.list(), (e) => e.status === 401);

// the Files and Batch APIs (the server runs with --files-dir): the SDK's multipart upload, a batch
// answered as the endpoint answers each body, its output file read back
const lines = [0, 1, 2].map((i) => JSON.stringify({ custom_id: `c${i}`, method: 'POST', url: '/v1/chat/completions',
  body: { model, messages: msg, max_tokens: 12 + i, temperature: 0 } })).join('\n') + '\n';
const up = await client.files.create({ file: await toFile(Buffer.from(lines), 'requests.jsonl'), purpose: 'batch' });
assert.equal(up.object, 'file');
assert.equal(up.bytes, Buffer.byteLength(lines));
assert.equal(up.filename, 'requests.jsonl');
assert.equal(await (await client.files.content(up.id)).text(), lines);
let batch = await client.batches.create({ input_file_id: up.id, endpoint: '/v1/chat/completions', completion_window: '24h' });
for (let t = 0; !['completed', 'failed', 'expired', 'cancelled'].includes(batch.status) && t < 600; t++) {
  await new Promise((r) => setTimeout(r, 100));
  batch = await client.batches.retrieve(batch.id);
}
assert.equal(batch.status, 'completed');
assert.deepEqual(batch.request_counts, { total: 3, completed: 3, failed: 0 });
assert.equal(batch.error_file_id, null);
const results = (await (await client.files.content(batch.output_file_id)).text()).trim().split('\n').map((l) => JSON.parse(l));
assert.equal(results.length, 3);
for (const r of results) {
  const i = Number(r.custom_id.slice(1));
  const alone = await client.chat.completions.create({ model, messages: msg, max_tokens: 12 + i, temperature: 0 });
  assert.equal(r.response.status_code, 200);
  assert.equal(r.response.body.choices[0].message.content, alone.choices[0].message.content);
}
const listed = [];
for await (const b of client.batches.list({ limit: 10 })) listed.push(b.id);
assert.ok(listed.includes(batch.id));
await assert.rejects(client.batches.cancel(batch.id), (e) => e.status === 409);
assert.equal((await client.files.del(up.id)).deleted, true);
await assert.rejects(client.files.retrieve(up.id), (e) => e.status === 404);
// the fine-tuning jobs API: a chat file, a job, its events and checkpoints, one going on from an earlier epoch's model, its model answering, deleted
const examples = Array.from({ length: 24 }, (_, i) =>
  JSON.stringify({ messages: [{ role: 'user', content: `Who is friend ${i}?` }, { role: 'assistant', content: 'The friend is Lily.' }] })).join('\n') + '\n';
// sent in two parts through the Uploads API (the second first), put together in order and checked by its md5
const exBuf = Buffer.from(examples), half = Math.floor(exBuf.length / 2);
const upl = await client.uploads.create({ bytes: exBuf.length, filename: 'chats.jsonl', mime_type: 'text/jsonl', purpose: 'fine-tune' });
assert.equal(upl.status, 'pending');
const part2 = await client.uploads.parts.create(upl.id, { data: await toFile(exBuf.subarray(half), 'part2') });
const part1 = await client.uploads.parts.create(upl.id, { data: await toFile(exBuf.subarray(0, half), 'part1') });
await assert.rejects(client.uploads.complete(upl.id, { part_ids: [part1.id] }), (e) => e.status === 400 && e.param === 'part_ids');
const uploaded = await client.uploads.complete(upl.id, { part_ids: [part1.id, part2.id],
  md5: createHash('md5').update(exBuf).digest('hex') });
assert.equal(uploaded.status, 'completed');
const tf = uploaded.file;
assert.equal(tf.bytes, exBuf.length);
assert.equal(await (await client.files.content(tf.id)).text(), examples);
let job = await client.fineTuning.jobs.create({ model, training_file: tf.id, suffix: 'sdk', seed: 3,
  method: { type: 'supervised', supervised: { hyperparameters: { n_epochs: 4, batch_size: 2 } } } });
assert.equal(job.object, 'fine_tuning.job');
assert.equal(job.status, 'queued');
for (let t = 0; !['succeeded', 'failed', 'cancelled'].includes(job.status) && t < 1200; t++) {
  await new Promise((r) => setTimeout(r, 100));
  job = await client.fineTuning.jobs.retrieve(job.id);
}
assert.equal(job.status, 'succeeded', JSON.stringify(job.error));
assert.ok(job.fine_tuned_model.startsWith(`ft:${model}:local:sdk:`));
assert.equal(job.hyperparameters.n_epochs, 4);
const events = [];
for await (const e of client.fineTuning.jobs.listEvents(job.id, { limit: 10 })) events.push(e);
assert.equal(events.filter((e) => e.type === 'metrics').length, 48);
assert.equal(events[0].message, 'The job has successfully completed');
const ckpts = []; // the final model and the two earlier epochs' (pages of one: the SDK follows the cursor)
for await (const c of client.fineTuning.jobs.checkpoints.list(job.id, { limit: 1 })) ckpts.push(c);
assert.deepEqual(ckpts.map((c) => c.step_number), [48, 36, 24]);
assert.ok(ckpts.every((c) => c.metrics.train_mean_token_accuracy >= 0 && c.metrics.train_mean_token_accuracy <= 1));
assert.equal(ckpts[1].fine_tuned_model_checkpoint, `${job.fine_tuned_model}:ckpt-step-36`);
// a job going on from an earlier epoch's model, which is then deleted
let more = await client.fineTuning.jobs.create({ model: ckpts[2].fine_tuned_model_checkpoint, training_file: tf.id, seed: 3,
  method: { type: 'supervised', supervised: { hyperparameters: { n_epochs: 1, batch_size: 2 } } } });
assert.equal(more.model, ckpts[2].fine_tuned_model_checkpoint);
for (let t = 0; !['succeeded', 'failed', 'cancelled'].includes(more.status) && t < 1200; t++) {
  await new Promise((r) => setTimeout(r, 100));
  more = await client.fineTuning.jobs.retrieve(more.id);
}
assert.equal(more.status, 'succeeded', JSON.stringify(more.error));
assert.equal((await client.models.del(ckpts[2].fine_tuned_model_checkpoint)).deleted, true);
const jobs = [];
for await (const j of client.fineTuning.jobs.list({ limit: 1 })) jobs.push(j.id);
assert.ok(jobs.includes(job.id));
const taught = await client.chat.completions.create({ model: job.fine_tuned_model, messages: [{ role: 'user', content: 'Who is friend 3?' }],
  max_tokens: 8, temperature: 0 });
assert.ok(taught.choices[0].message.content.includes('friend is'), taught.choices[0].message.content);
assert.ok((await client.models.list()).data.some((m) => m.id === job.fine_tuned_model));
await assert.rejects(client.fineTuning.jobs.cancel(job.id), (e) => e.status === 400);
assert.equal((await client.models.del(job.fine_tuned_model)).deleted, true);
await assert.rejects(client.fineTuning.jobs.create({ model: 'gpt-4o-mini', training_file: tf.id }), (e) => e.status === 400 && e.param === 'model');
console.log('openai SDK check: ok (' + model + ')');
