#!/usr/bin/env python3
"""An interactive request's latency while the server trains a fine-tuning job: its trainer held while
requests run (the default), beside them at nice 10, and beside them at nice 0; and the trainer's
speed in each.

    scripts/finetune_latency.py [--nerve build/nerve] [--model MODEL] [--probes 8]

Starts `nerve serve --files-dir` on a free port (MODEL: default a stories15M-shaped model made by
`nerve init`), uploads chat examples, starts a job long enough to outlast the probes, and prints the
figures docs/benchmarks.md records. Python's standard library only."""
import os, statistics, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util
from bench_util import Server

ap = bench_util.parser()
ap.add_argument('--examples', type=int, default=200)
a = ap.parse_args()
examples = bench_util.day_examples(a.examples)


def probe(srv):  # interactive requests' seconds, one after another
    out = []
    for k in range(a.probes):
        t = time.time()
        srv.post('/v1/completions', {'prompt': f'Once upon a time {k}', 'max_tokens': 32, 'temperature': 0, 'ignore_eos': True})
        out.append(time.time() - t)
        time.sleep(0.2)
    return out


def show(xs):
    return f'{statistics.median(xs):.2f} s (max {max(xs):.2f})'


modes = [('held while requests run (the default)', []), ('beside them at nice 10', ['--no-fine-tune-yield']),
         ('beside them at nice 0', ['--no-fine-tune-yield', '--fine-tune-nice', '0'])]
for what, flags in modes:
    srv = Server(a.nerve, a.model, a.tok, ['--files-dir', '{tmp}/files'] + flags)
    model = srv.get('/v1/models')['data'][0]['id']
    idle = probe(srv)
    fid = srv.upload('fine-tune', examples)
    job = srv.post('/v1/fine_tuning/jobs', {'model': model, 'training_file': fid, 'hyperparameters': {'n_epochs': 50}})
    while srv.get(f"/v1/fine_tuning/jobs/{job['id']}")['status'] != 'running':
        time.sleep(0.1)
    time.sleep(2)
    t0, tok0 = time.time(), srv.get(f"/v1/fine_tuning/jobs/{job['id']}")['trained_tokens'] or 0
    busy = probe(srv)
    j = srv.get(f"/v1/fine_tuning/jobs/{job['id']}")
    rate = ((j['trained_tokens'] or 0) - tok0) / (time.time() - t0)
    alone_t0, alone_tok0 = time.time(), j['trained_tokens'] or 0
    time.sleep(4)
    alone = ((srv.get(f"/v1/fine_tuning/jobs/{job['id']}")['trained_tokens'] or 0) - alone_tok0) / (time.time() - alone_t0)
    srv.post(f"/v1/fine_tuning/jobs/{job['id']}/cancel", {})
    srv.stop()
    print(f'trainer {what}: an interactive request (32 tokens), the median: idle {show(idle)}, while the job trains '
          f'{show(busy)}; the trainer {rate:.0f} tokens/s beside the requests, {alone:.0f} alone')
