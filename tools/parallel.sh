#!/usr/bin/env bash
# tools/parallel.sh - runs each argument as a shell command, all at the same time, each into its own log;
# then prints the logs one after another, each under its command and with its time, and exits 1 if any
# command failed. The Makefile runs single-threaded checks this way (valgrind's shards of the unit tests,
# the CUDA emulation's test runs), so that two cores halve their time and their output stays readable.
#   tools/parallel.sh 'valgrind ./build/test_valgrind --shard 0/2' 'valgrind ./build/test_valgrind --shard 1/2'
set -u
if [ $# -eq 0 ]; then
    echo "usage: tools/parallel.sh COMMAND..." >&2
    exit 2
fi
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM
t0=$SECONDS
i=0
for cmd in "$@"; do
    (
        s=$SECONDS
        bash -c "$cmd" > "$dir/$i.log" 2>&1
        rc=$?
        echo "$rc $((SECONDS - s))" > "$dir/$i.rc"
    ) &
    i=$((i + 1))
done
wait
failed=0
i=0
for cmd in "$@"; do
    read -r rc secs < "$dir/$i.rc" || { rc=1; secs=?; }
    echo "---- $cmd"
    cat "$dir/$i.log"
    if [ "$rc" -eq 0 ]; then
        echo "---- ok ($secs s)"
    else
        echo "---- FAILED with status $rc ($secs s)"
        failed=1
    fi
    i=$((i + 1))
done
echo "---- $# commands at once: $((SECONDS - t0)) s"
exit $failed
