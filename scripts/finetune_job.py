#!/usr/bin/env python3
"""One fine-tuning job end to end: `nerve serve --files-dir` on a free port, 200 chat examples of one
pattern uploaded, a job of --epochs (default one) with the defaults, timed from POST
/v1/fine_tuning/jobs to `succeeded` (its adapters loaded); then its checkpoints (the earlier epochs'
models), the trainer's efficiency line and the fine-tuned model's greedy answer to a prompt of the
pattern, as docs/benchmarks.md records them.

    scripts/finetune_job.py [--nerve build/nerve] [--model MODEL] [--tok TOKENIZER] [--epochs N]

MODEL: default a stories15M-shaped model made by `nerve init`. Python's standard library only."""
import os, sys, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_util
from bench_util import Server

p = bench_util.parser()
p.add_argument('--epochs', type=int, default=1)
a = p.parse_args()
examples = bench_util.day_examples(200)
srv = Server(a.nerve, a.model, a.tok, ['--files-dir', '{tmp}/files'])
model = srv.get('/v1/models')['data'][0]['id']
fid = srv.upload('fine-tune', examples)
t0 = time.time()
job = srv.post('/v1/fine_tuning/jobs', {'model': model, 'training_file': fid, 'hyperparameters': {'n_epochs': a.epochs}})
while True:
    j = srv.get(f"/v1/fine_tuning/jobs/{job['id']}")
    if j['status'] in ('succeeded', 'failed', 'cancelled'):
        break
    time.sleep(0.2)
wall = time.time() - t0
last = [e for e in srv.get(f"/v1/fine_tuning/jobs/{job['id']}/events?limit=20")['data'] if e['type'] == 'metrics']
print(f"{model}: {j['status']} in {wall:.1f} s, {last[0]['data']['step'] if last else 0} steps, "
      f"last loss {last[0]['data'].get('train_loss', float('nan')) if last else float('nan'):.2f} "
      f"(token accuracy {last[0]['data'].get('train_mean_token_accuracy', float('nan')) if last else float('nan'):.2f}), "
      f"{j['trained_tokens']} tokens")
if j['status'] == 'succeeded':
    for c in srv.get(f"/v1/fine_tuning/jobs/{job['id']}/checkpoints")['data']:
        mm = c['metrics']
        print(f"checkpoint: step {c['step_number']}, train loss {mm.get('train_loss', float('nan')):.2f}, "
              f"token accuracy {mm.get('train_mean_token_accuracy', float('nan')):.2f}: {c['fine_tuned_model_checkpoint']}")
    ans = srv.post('/v1/chat/completions', {'model': j['fine_tuned_model'], 'max_tokens': 16, 'temperature': 0,
                                            'messages': [{'role': 'user', 'content': 'Tell me about day 7 of the week.'}]})
    print('the fine-tuned model answers:', repr(ans['choices'][0]['message']['content']))
with open(os.path.join(srv.tmp, 'files', job['id'] + '.run', 'train.log')) as f:
    print(''.join(l for l in f if 'efficiency' in l), end='')
srv.stop()
