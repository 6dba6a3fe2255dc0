#!/bin/sh
# Build the three C extensions with ASan + UBSan + libFuzzer coverage into build/fuzz (never the
# in-place .so files the tests import) and fuzz each for FUZZ_SECONDS with atheris.
# Usage: fuzz/run.sh [harness ...]   (default: all three; names as in fuzz/fuzz_<name>.py)
# Exits non-zero on any crash, sanitizer report or differential mismatch (input in build/fuzz/artifacts).
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
FUZZ_SECONDS=${FUZZ_SECONDS:-45}
OUT=build/fuzz
mkdir -p "$OUT/artifacts"

if ! command -v clang >/dev/null 2>&1; then
    echo "fuzz: installing clang with apt (log: $OUT/apt.log)"
    (apt-get update -q && apt-get install -y -q clang) >"$OUT/apt.log" 2>&1 || {
        echo "fuzz: FAILED: clang is needed for the sanitizer builds and apt could not install it (see $OUT/apt.log)" >&2
        exit 1
    }
fi
if ! "$PYTHON" -c "import atheris" 2>/dev/null; then
    "$PYTHON" -m pip install -q 'atheris>=3.0' || { echo "fuzz: FAILED: could not install atheris" >&2; exit 1; }
fi

# clang <= 14 (Debian 12) names its runtimes with an arch suffix; newer ones put them in a
# per-target directory without it
ASAN_RT=$(clang -print-file-name=libclang_rt.asan-x86_64.so)
FUZZER_A=$(clang -print-file-name=libclang_rt.fuzzer_no_main-x86_64.a)
[ -f "$ASAN_RT" ] || ASAN_RT=$(clang -print-file-name=libclang_rt.asan.so)
[ -f "$FUZZER_A" ] || FUZZER_A=$(clang -print-file-name=libclang_rt.fuzzer_no_main.a)
[ -f "$ASAN_RT" ] && [ -f "$FUZZER_A" ] || {
    echo "fuzz: FAILED: clang's ASan / libFuzzer runtimes not found ($ASAN_RT, $FUZZER_A)" >&2; exit 1; }
# (PYTHONMALLOC=malloc below: Python objects, the bodies included, come from malloc so ASan
# sees their bounds; pymalloc arenas would hide a read past a body.)
# libFuzzer as a shared library, preloaded ahead of the ASan runtime: the instrumented
# extensions then register their coverage counters with libFuzzer (atheris uses a libFuzzer
# it finds preloaded), not with the ASan runtime's no-op stubs.
clang -shared -o "$OUT/libfuzzer_no_main.so" -Wl,--whole-archive "$FUZZER_A" \
    -Wl,--no-whole-archive -lstdc++ -lpthread -lm

rm -rf "$OUT/lib"
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
CC=clang LDSHARED="clang -shared" CFLAGS="$SAN" LDFLAGS="-fsanitize=address,undefined -shared-libasan" \
    "$PYTHON" setup.py -q build_ext --force --build-lib "$OUT/lib" --build-temp "$OUT/tmp" >"$OUT/build.log" 2>&1 || {
    echo "fuzz: FAILED: sanitizer build (see $OUT/build.log)" >&2; exit 1; }
for mod in collectors/otlp/_native collectors/otlp/_json_native collectors/router/_native; do
    # the extensions are optional in setup.py: a compile error there is only a warning
    ls "$OUT/lib/$mod".*.so >/dev/null 2>&1 || { echo "fuzz: FAILED: $mod did not build (see $OUT/build.log)" >&2; exit 1; }
done

rm -rf "$OUT/corpus"
"$PYTHON" fuzz/seeds.py "$OUT/corpus"

[ $# -gt 0 ] || set -- otlp_decode otlp_json candidates_json
status=0
for name in "$@"; do
    echo "fuzz: $name for ${FUZZ_SECONDS}s"
    if LD_PRELOAD="$PWD/$OUT/libfuzzer_no_main.so:$ASAN_RT" \
       PYTHONMALLOC=malloc ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0:allocator_may_return_null=1:${ASAN_OPTIONS:-}" \
       UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}" \
       "$PYTHON" "fuzz/fuzz_$name.py" -max_total_time="$FUZZ_SECONDS" -timeout=30 -rss_limit_mb=4096 \
           -artifact_prefix="$OUT/artifacts/$name-" -print_final_stats=1 "$OUT/corpus/$name" \
           >"$OUT/$name.log" 2>&1; then
        grep -E "DONE|peak_rss" "$OUT/$name.log" | tail -2
    else
        status=1
        tail -n 60 "$OUT/$name.log" >&2
        echo "fuzz: FAILED: $name (full log $OUT/$name.log; reproduce: see fuzz/README.md)" >&2
    fi
done
exit $status
