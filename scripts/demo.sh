#!/usr/bin/env bash
# The demo: what this machine offers, then a story sampled from the stories260K model.
# (The training issue turns this into: train a tokenizer and a small model, then sample.)
set -euo pipefail
cd "$(dirname "$0")/.."
data=${NERVE_DATA:-../shared/data}
model=$data/models/stories260K.bin
tok=$data/models/tok512.bin
if [ ! -f "$model" ] || [ ! -f "$tok" ]; then
    echo "demo: $model or $tok not found (set NERVE_DATA to the shared data folder)" >&2
    exit 1
fi
echo "== nerve info"
build/nerve info
echo
echo "== nerve generate -m $model -z $tok -p 'Once upon a time' -n 256 -t 0.8 -s 7"
build/nerve generate -m "$model" -z "$tok" -p "Once upon a time" -n 256 -t 0.8 -s 7
echo
