#!/usr/bin/env bash
# The demo: train a BPE tokenizer and a small Llama (about 1.2M parameters) on TinyStories text
# for two and a half minutes on this machine's fastest engine, then sample a story from it.
# Everything lands in runs/demo (removed first, so the demo always starts fresh).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${NERVE_DATA:-../shared/data}
train=$data/corpus/tinystories_train_first1000.txt
valid=$data/corpus/tinystories_valid_head.txt
for f in "$train" "$valid"; do
    if [ ! -f "$f" ]; then
        echo "demo: $f not found (set NERVE_DATA to the shared data folder)" >&2
        exit 1
    fi
done
out=runs/demo
rm -rf "$out"
mkdir -p "$out"

echo "== nerve info"
build/nerve info
echo
echo "== nerve tokenizer train --vocab 1024 (TinyStories text, $(du -ch "$train" "$valid" | tail -1 | cut -f1))"
build/nerve tokenizer train --vocab 1024 "$train" "$valid" -o "$out/tok.bin"
echo
echo "== nerve train: dim 128, 5 layers, 4 heads, as many steps of 16 x 256 tokens as 150 seconds take (--time-budget; capped at 4 minutes)"
build/nerve train --dim 128 --layers 5 --heads 4 --hidden 384 \
    --data "$train" "$valid" -z "$out/tok.bin" \
    --time-budget 150 --batch 16 --seq 256 --lr 3e-3 --warmup 20 --eval-every 50 --eval-batches 8 \
    --sample-every 250 --sample-tokens 40 --sample-prompt "Once upon a time" \
    --time-limit 240 --out "$out"
echo
echo "== validation loss by step (the unigram baseline is printed above as 'unigram baseline loss')"
grep -o '"step":[0-9]*,[^}]*"val_loss":[0-9.]*' "$out/metrics.jsonl" | sed -E 's/"step":([0-9]+).*"val_loss":([0-9.]+)/  step \1: \2/'
echo
echo "== nerve perplexity on the 5% of each text the run held out"
build/nerve perplexity -m "$out" -f "$train" -f "$valid" --val-frac 0.05 2>/dev/null
echo
echo "== nerve generate -m $out/model.bin -z $out/tokenizer.bin -p 'Once upon a time' -n 200 -t 0.7 -s 7"
build/nerve generate -m "$out/model.bin" -z "$out/tokenizer.bin" -p "Once upon a time" -n 200 -t 0.7 -s 7
echo
echo
echo "demo: the run folder $out holds model.bin, tokenizer.bin, ckpt.bin, metrics.jsonl, samples.txt and loss.svg"
echo "demo: serve it (the OpenAI, Anthropic and Ollama APIs, and a chat page at http://localhost:8000/):"
echo "      build/nerve serve -m $out"
