#!/usr/bin/env bash
# The official OpenAI and Anthropic Node SDKs and Ollama's JavaScript library against `nerve serve`:
# installs `openai` (v4), `@anthropic-ai/sdk` and `ollama` from the npm registry into a temporary folder, starts build/nerve serve on
# stories260K with an API key on a free port, and a second one for tool calls on a
# stories260K-shaped model with a 2,048-token context (`nerve init`: the tools' description
# outgrows stories260K's 512), and runs scripts/sdk/check.mjs (chat, completions, logprobs,
# structured outputs, tools, embeddings, the Responses API, the Files, Uploads, Batch and fine-tuning jobs APIs) and scripts/sdk/check_anthropic.mjs
# (/v1/messages whole and streamed, stop sequences, prefill, token counting, tool use, errors) and
# scripts/sdk/check_ollama.mjs (/api/chat and /api/generate whole and streamed, the model list, errors).
# Needs node and npm; not part of `make test` (it downloads).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${NERVE_DATA:-../shared/data}
[ -x build/nerve ] || make build/nerve
command -v node >/dev/null && command -v npm >/dev/null || { echo "sdk_check: needs node and npm" >&2; exit 2; }
tmp=$(mktemp -d)
pid= pid2=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; [ -n "$pid2" ] && kill "$pid2" 2>/dev/null; rm -rf "$tmp"' EXIT
(cd "$tmp" && npm init -y >/dev/null && npm install --silent openai@4 @anthropic-ai/sdk ollama >/dev/null)
cp scripts/sdk/check.mjs scripts/sdk/check_anthropic.mjs scripts/sdk/check_ollama.mjs "$tmp/"
NERVE_API_KEY=sdk-check build/nerve serve -m "$data/models/stories260K.bin" -z "$data/models/tok512.bin" --port 0 \
    --no-prefix-cache --files-dir "$tmp/files" 2>"$tmp/serve.log" &
pid=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/serve.log" && break; sleep 0.1; done
port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/serve.log")
[ -n "$port" ] || { cat "$tmp/serve.log" >&2; exit 1; }
build/nerve init --preset stories260K --seq-len 2048 --seed 7 -o "$tmp/tools-2k.bin" 2>/dev/null
NERVE_API_KEY=sdk-check build/nerve serve -m "$tmp/tools-2k.bin" -z "$data/models/tok512.bin" --port 0 \
    --no-prefix-cache --kv-memory 64M 2>"$tmp/serve2.log" &
pid2=$!
for _ in $(seq 100); do grep -q 'listening on' "$tmp/serve2.log" && break; sleep 0.1; done
port2=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$tmp/serve2.log")
[ -n "$port2" ] || { cat "$tmp/serve2.log" >&2; exit 1; }
node "$tmp/check.mjs" "http://127.0.0.1:$port/v1" sdk-check "http://127.0.0.1:$port2/v1"
node "$tmp/check_anthropic.mjs" "http://127.0.0.1:$port" sdk-check "http://127.0.0.1:$port2" stories260K tools-2k
node "$tmp/check_ollama.mjs" "http://127.0.0.1:$port" sdk-check stories260K
