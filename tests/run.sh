#!/usr/bin/env bash
# Runs every test program of one build and adds up their results.
# usage: tests/run.sh LABEL BINDIR NERVE_BIN  -> appends "passed failed skipped" to $RESULTS_FILE
set -u
label=$1 bindir=$2 nerve=$3
export NERVE_BIN=$nerve
# anything a test leaves in the user's cache folders (the server's KV disk cache) stays private to the run
XDG_CACHE_HOME=$(mktemp -d)
export XDG_CACHE_HOME
trap 'rm -rf "$XDG_CACHE_HOME"' EXIT
p=0 f=0 s=0
for t in "$bindir"/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    echo "== [$label] $name"
    # a hung test must not hang the suite: 20 minutes each at most (the longest, the sanitizer build of
    # test_train, takes ~2.5 minutes on a 2-core AVX2 machine)
    start=$SECONDS
    out=$(timeout 1200 "$t" 2>&1)
    rc=$?
    echo "  ($name: $((SECONDS - start)) s)"
    [ "$rc" -eq 124 ] && echo "  FAIL     $name timed out after 1200 s"
    printf '%s\n' "$out" | grep -v '^@@ RESULT'
    res=$(printf '%s\n' "$out" | grep '^@@ RESULT' | tail -n1)
    if [ -z "$res" ]; then
        echo "  FAIL     $name crashed or exited early (exit $rc)"
        f=$((f + 1))
        continue
    fi
    set -- $res
    p=$((p + $3)) f=$((f + $4)) s=$((s + $5))
    if [ "$rc" -ne 0 ] && [ "$4" -eq 0 ]; then
        echo "  FAIL     $name exited $rc after its cases"
        f=$((f + 1))
    fi
done
echo "$p $f $s" >> "${RESULTS_FILE:?}"
