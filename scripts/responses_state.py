#!/usr/bin/env python3
"""The Responses API's server-side state, measured: background streams (a response followed by 0
and by 32 streams at once, the replay of one that has ended, a resume after an event), the turns
of a conversation (each prompt a prefix-cache hit), and truncation "auto" (40 items on a 512-token
model, against 10 other items that fit).

    scripts/responses_state.py [--nerve build/nerve] [--model models/stories260K.bin] [--tok models/tok512.bin]

Starts `nerve serve` on a free port and prints the figures docs/benchmarks.md records. Python's
standard library only."""
import http.client, json, os, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util
from bench_util import Server

data = os.environ.get('NERVE_DATA', '../shared/data')
ap = bench_util.parser()
ap.set_defaults(model=os.path.join(data, 'models/stories260K.bin'), tok=os.path.join(data, 'models/tok512.bin'))
ap.add_argument('--followers', type=int, default=32)
a = ap.parse_args()
srv = Server(a.nerve, a.model, a.tok, ['--chat-template', 'chatml'], prefix_cache=True)
port = int(srv.base.rsplit(':', 1)[1])


def raw(method, path, body=None):  # (status, the body's bytes)
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=600)
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers={'Content-Type': 'application/json'})
    r = c.getresponse()
    out = (r.status, r.read())
    c.close()
    return out


LONG = {'input': 'Once upon a time', 'max_output_tokens': 200, 'temperature': 0, 'background': True, 'stream': True}


def followed(n):  # one background stream read by its creator while n more streams follow it: (seconds, events, followers' bytes)
    c = http.client.HTTPConnection('127.0.0.1', port, timeout=600)
    t0 = time.time()
    c.request('POST', '/v1/responses', body=json.dumps(LONG), headers={'Content-Type': 'application/json'})
    r = c.getresponse()
    first = r.readline() + r.readline()
    rid = json.loads(first.split(b'data: ', 1)[1])['response']['id']
    got = [None] * n
    ts = [threading.Thread(target=lambda k=k: got.__setitem__(k, raw('GET', f'/v1/responses/{rid}?stream=true')[1])) for k in range(n)]
    for t in ts:
        t.start()
    mine = first + r.read()
    dt = time.time() - t0
    for t in ts:
        t.join()
    c.close()
    assert all(g == mine for g in got), 'a follower read other bytes than the creator'
    return dt, rid, mine


for n in (0, a.followers):  # (a delta event carries what one poll found: their count varies, the answer does not)
    runs = [followed(n) for _ in range(3)]
    tokens = json.loads(runs[0][2].rsplit(b'data: ', 1)[1])['response']['usage']['output_tokens']
    print(f'background stream of {tokens} tokens, {n:2d} followers: best {min(r[0] for r in runs) * 1000:.0f} ms (runs: ' +
          ', '.join(f'{r[2].count(b"event: ")} events in {r[0] * 1000:.0f} ms' for r in runs) + ')')
rid = runs[0][1]
t0 = time.time(); s, whole = raw('GET', f'/v1/responses/{rid}?stream=true'); t1 = time.time()
half = whole.count(b'event: ') // 2
s2, tail = raw('GET', f'/v1/responses/{rid}?stream=true&starting_after={half}'); t2 = time.time()
assert whole.endswith(tail) and tail.startswith(b'event: ')
print(f'replay of an ended one: {whole.count(b"event: ")} events, {len(whole)} bytes in {(t1 - t0) * 1000:.1f} ms; '
      f'after event {half}: {tail.count(b"event: ")} events in {(t2 - t1) * 1000:.1f} ms')

cid = srv.post('/v1/conversations', {'items': [{'role': 'user', 'content': 'Once upon a time'}]})['id']
for turn, text in enumerate(['Tell me more.', 'And then?', 'The end?']):
    u = srv.post('/v1/responses', {'conversation': cid, 'input': text, 'max_output_tokens': 24, 'temperature': 0})['usage']
    print(f'conversation turn {turn + 1}: {u["input_tokens"]} prompt tokens, {u["input_tokens_details"]["cached_tokens"]} cached')

def talk(name, n):  # n alternating turns about name (each ~20 tokens)
    return [{'role': ('user', 'assistant')[k % 2], 'content': f'{k}: {name} went to the park with a red ball.'} for k in range(n)]


t0 = time.time()
u = srv.post('/v1/responses', {'input': talk('Lily', 40), 'max_output_tokens': 16, 'temperature': 0, 'truncation': 'auto'})['usage']
t1 = time.time()
u2 = srv.post('/v1/responses', {'input': talk('Sam', 10), 'max_output_tokens': 16, 'temperature': 0})['usage']  # (no cache shared)
t2 = time.time()
print(f'truncation auto: 40 items -> {u["input_tokens"]} prompt tokens in {(t1 - t0) * 1000:.0f} ms; 10 other items, '
      f'not truncated: {u2["input_tokens"]} prompt tokens in {(t2 - t1) * 1000:.0f} ms')
srv.stop()
