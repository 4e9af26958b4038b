#!/usr/bin/env bash
# Runs every test program of one build and adds up their results.
# usage: tests/run.sh LABEL BINDIR NERVE_BIN  -> appends "passed failed skipped" to $RESULTS_FILE
# NERVE_TEST_JOBS programs run at once (default: the CPU count): one program keeps ~1.2 of 2 cores
# busy (servers wait on sockets, runs on files and child processes), so two at a time take ~40% less
# wall time. Each program's output is printed whole when it ends.
set -u
label=$1 bindir=$2 nerve=$3
export NERVE_BIN=$nerve
jobs_max=${NERVE_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
case $jobs_max in '' | *[!0-9]* | 0) jobs_max=1 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The longest programs first, so that none of them starts last and runs alone (the rest by name).
first="test_train test_serve test_gguf test_cli test_train_grad test_archs test_perplexity test_engine test_gbnf"
order=()
for n in $first; do [ -x "$bindir/$n" ] && order+=("$bindir/$n"); done
for t in "$bindir"/test_*; do
    [ -x "$t" ] || continue
    case " $first " in *" $(basename "$t") "*) continue ;; esac
    order+=("$t")
done

# One program: its output, exit status and seconds into $work/NAME.*. Anything it leaves in the user's
# cache folders (the server's KV disk cache, tuned settings) stays private to it.
run_one() {
    local t=$1 name start rc
    name=$(basename "$t")
    mkdir -p "$work/$name.cache"
    start=$SECONDS
    # a hung test must not hang the suite: 20 minutes each at most (the longest, the sanitizer build of
    # test_train, takes ~3 minutes on a 2-core machine)
    XDG_CACHE_HOME="$work/$name.cache" timeout 1200 "$t" > "$work/$name.out" 2>&1
    rc=$?
    echo "$((SECONDS - start))" > "$work/$name.sec"
    echo "$rc" > "$work/$name.rc.part" && mv "$work/$name.rc.part" "$work/$name.rc" # whole when it appears
}

p=0 f=0 s=0
# Prints a finished program's block and adds up its results.
report() {
    local name=$1 rc res
    rc=$(cat "$work/$name.rc")
    echo "== [$label] $name"
    echo "  ($name: $(cat "$work/$name.sec") s)"
    [ "$rc" -eq 124 ] && echo "  FAIL     $name timed out after 1200 s"
    grep -v '^@@ RESULT' "$work/$name.out"
    res=$(grep '^@@ RESULT' "$work/$name.out" | tail -n1)
    if [ -z "$res" ]; then
        echo "  FAIL     $name crashed or exited early (exit $rc)"
        f=$((f + 1))
        return
    fi
    set -- $res
    p=$((p + $3)) f=$((f + $4)) s=$((s + $5))
    if [ "$rc" -ne 0 ] && [ "$4" -eq 0 ]; then
        echo "  FAIL     $name exited $rc after its cases"
        f=$((f + 1))
    fi
}

running=() # the names of the programs started and not yet reported
# Reports every program that has finished; keeps the others in `running`.
reap() {
    local still=() name
    for name in "${running[@]}"; do
        if [ -e "$work/$name.rc" ]; then report "$name"; else still+=("$name"); fi
    done
    running=("${still[@]}")
}
for t in "${order[@]}"; do
    while [ "${#running[@]}" -ge "$jobs_max" ]; do
        wait -n 2>/dev/null || true
        reap
    done
    run_one "$t" &
    running+=("$(basename "$t")")
done
wait
reap
echo "$p $f $s" >> "${RESULTS_FILE:?}"
