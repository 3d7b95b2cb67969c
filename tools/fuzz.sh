#!/usr/bin/env bash
# tools/fuzz.sh [seconds] [libFuzzer options...] - fuzz the safetensors reader.
#
# Builds tests/fuzz_safetensors.c with clang -g -O1 -fsanitize=fuzzer,address,undefined into
# build/fuzz/ and runs it for `seconds` (default 60), seeded from tests/st_corpus (read only: new
# inputs go to build/fuzz/corpus). Exits non-zero when the fuzzer finds a crash, a sanitizer
# report, a leak, a timeout or an out-of-memory; the input that caused it is saved as
# build/fuzz/crash-* (or leak-*, timeout-*, oom-*) and can be replayed with
#     build/fuzz/fuzz_safetensors build/fuzz/crash-...
# Extra arguments go to libFuzzer (e.g. -jobs=4 -workers=4).
#
# Needs clang with libFuzzer (Debian: apt-get install clang libclang-rt-14-dev, matching the
# clang version). CLANG=... picks the compiler.
set -euo pipefail

cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
case $secs in
'' | *[!0-9]*)
    echo "tools/fuzz.sh: seconds must be a whole number (got '$secs')" >&2
    exit 2
    ;;
esac

CLANG=${CLANG:-clang}
if ! command -v "$CLANG" >/dev/null 2>&1; then
    echo "tools/fuzz.sh: $CLANG not found (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
fi

out=build/fuzz
bin=$out/fuzz_safetensors
mkdir -p "$out/corpus"

# Rebuild when a source is newer than the binary.
srcs=(tests/fuzz_safetensors.c transformer.h)
need=0
[ -x "$bin" ] || need=1
for s in "${srcs[@]}"; do
    [ "$s" -nt "$bin" ] && need=1
done
if [ $need = 1 ]; then
    echo "tools/fuzz.sh: building $bin"
    if ! "$CLANG" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -fno-omit-frame-pointer -Wall -Wextra -o "$bin" tests/fuzz_safetensors.c -lm; then
        echo "tools/fuzz.sh: build failed; if -fsanitize=fuzzer does not link, install" \
            "libclang-rt-<version>-dev for your clang" >&2
        exit 1
    fi
fi

# Tokens of the format, so mutations reach the deeper checks sooner.
dict=$out/safetensors.dict
cat >"$dict" <<'EOF'
"__metadata__"
"dtype"
"shape"
"data_offsets"
"F32"
"F16"
"\"F32\""
"{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"
"\\u"
"\\ud83d\\ude00"
"\\u0000"
"\\ud800"
"\\udc00"
"\\\""
"\\\\"
"true"
"false"
"null"
"1e308"
"-0.5e-3"
"18446744073709551615"
"9223372036854775807"
"4294967296"
"\xc3\xa9"
"\xf0\x9f\x98\x80"
"\xed\xa0\x80"
EOF

echo "tools/fuzz.sh: fuzzing for ${secs}s (seeds: tests/st_corpus, corpus: $out/corpus)"
# -max_len: headers of real interest are small; -rss_limit_mb / -malloc_limit_mb catch any
# allocation driven by a number in the input rather than by its size.
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    "$bin" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=256 -dict="$dict" -artifact_prefix="$out/" -print_final_stats=1 \
    "$@" "$out/corpus" tests/st_corpus
rc=$?
set -e
if [ $rc -ne 0 ]; then
    echo "tools/fuzz.sh: the fuzzer stopped with status $rc: see the report above and $out/" >&2
    exit $rc
fi
echo "tools/fuzz.sh: no crash in ${secs}s"
