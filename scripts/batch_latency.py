#!/usr/bin/env python3
"""An interactive request's latency while the server runs a batch: idle, beside a Batch API batch
(its requests queued behind everyone else's), and beside the same requests sent by plain clients.

    scripts/batch_latency.py [--nerve build/nerve] [--model MODEL] [--requests 48] [--tokens 96]

Starts `nerve serve --files-dir` on a free port (MODEL: default a stories15M-shaped model made by
`nerve init`), and prints the figures docs/benchmarks.md records. Python's standard library only."""
import json, os, statistics, sys, threading, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util
from bench_util import Server

ap = bench_util.parser()
ap.add_argument('--requests', type=int, default=96)
ap.add_argument('--tokens', type=int, default=96)
ap.add_argument('--max-batch', type=int, default=8)
a = ap.parse_args()
srv = Server(a.nerve, a.model, a.tok, ['--files-dir', '{tmp}/files', '--max-batch', str(a.max_batch)])
post, get = srv.post, srv.get

def body(i, n):
    return {'prompt': f'Once upon a time {i}', 'max_tokens': n, 'temperature': 0, 'ignore_eos': True}

def probe(busy=lambda: True):  # interactive requests' seconds, one after another, while busy() holds
    out = []
    for k in range(a.probes):
        t = time.time()
        post('/v1/completions', body(1000 + k, 32))
        if not busy():
            break
        out.append(time.time() - t)
        time.sleep(0.2)
    return out

def show(xs):
    return f'{statistics.median(xs):.2f} s (max {max(xs):.2f}, {len(xs)} requests)' if xs else '- (the load ended first)'

idle = probe()
# a Batch API batch
lines = ''.join(json.dumps({'custom_id': f'r{i}', 'method': 'POST', 'url': '/v1/completions', 'body': body(i, a.tokens)}) + '\n'
                for i in range(a.requests)).encode()
fid = srv.upload('batch', lines)
t0 = time.time()
bid = post('/v1/batches', {'input_file_id': fid, 'endpoint': '/v1/completions', 'completion_window': '24h'})['id']
while get(f'/v1/batches/{bid}')['request_counts']['completed'] < a.max_batch:
    time.sleep(0.05)
beside_batch = probe(lambda: get(f'/v1/batches/{bid}')['status'] == 'in_progress')
while get(f'/v1/batches/{bid}')['status'] != 'completed':
    time.sleep(0.1)
batch_s = time.time() - t0
# the same requests from plain clients, twice --max-batch at a time (as a client library's pool would)
done = [0]
lock = threading.Lock()
todo = list(range(a.requests))
def client():
    while True:
        with lock:
            if not todo:
                return
            i = todo.pop(0)
        post('/v1/completions', body(i, a.tokens))
        with lock:
            done[0] += 1
t0 = time.time()
th = [threading.Thread(target=client) for _ in range(2 * a.max_batch)]
for t in th:
    t.start()
while done[0] < a.max_batch:
    time.sleep(0.05)
beside_clients = probe(lambda: done[0] < a.requests - 2 * a.max_batch)
for t in th:
    t.join()
clients_s = time.time() - t0
srv.stop()
toks = a.requests * a.tokens
print(f'an interactive request (32 tokens), the median: idle {show(idle)}; beside a Batch API batch {show(beside_batch)}; '
      f'beside the same requests from {2 * a.max_batch} clients {show(beside_clients)}')
print(f'{a.requests} requests of {a.tokens} tokens: Batch API {batch_s:.1f} s ({toks / batch_s:.0f} tokens/s), '
      f'clients {clients_s:.1f} s ({toks / clients_s:.0f} tokens/s)')
