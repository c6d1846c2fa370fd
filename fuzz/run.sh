#!/usr/bin/env bash
# Coverage-guided fuzzing of one protocol parser, or of the WebSocket layer,
# with AFL++ on stable Rust.
#   fuzz/run.sh TARGET SECONDS [OUT_DIR]
#   fuzz/run.sh --build        (install and build only: before runs in parallel)
# TARGET: client_message | event | filter | ws_frames | ws_upgrade (see
# fuzz/src/lib.rs for what each checks).
# Installs cargo-afl (which builds AFL++) when missing, builds the targets
# instrumented, runs TARGET for SECONDS from fuzz/corpus/TARGET, and exits 1 when
# AFL++ saved a crash or a hang, printing where the inputs are. See docs/fuzzing.md.
set -euo pipefail
usage="usage: fuzz/run.sh client_message|event|filter|ws_frames|ws_upgrade SECONDS [OUT_DIR] | --build"
target=${1:?$usage}
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
if [ "$target" != --build ]; then
  secs=${2:?$usage}
  out=${3:-"$here/out/$target"}
  [ -d "corpus/$target" ] || { echo "no corpus for target $target" >&2; exit 2; }
fi

if ! cargo afl --version >/dev/null 2>&1; then
  echo "== installing cargo-afl (builds AFL++)"
  cargo install --locked cargo-afl
fi
echo "== building the fuzz targets"
cargo afl build --release --quiet
[ "$target" = --build ] && exit 0

rm -rf "$out"
mkdir -p "$out"
echo "== fuzzing $target for $secs s (output in $out)"
# No UI, no CPU-frequency or core-pattern checks (CI and containers), a
# 1 s per-input timeout: a parse that takes longer is a hang.
AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
AFL_NO_AFFINITY=1 AFL_SKIP_CRASHES=0 \
  cargo afl fuzz -i "corpus/$target" -o "$out" -V "$secs" -t 1000 \
    "target/release/$target" > "$out/afl.log" 2>&1 || {
    echo "afl-fuzz failed:" >&2; tail -30 "$out/afl.log" >&2; exit 2; }

stats="$out/default/fuzzer_stats"
for k in execs_done execs_per_sec corpus_count edges_found total_edges saved_crashes saved_hangs; do
  grep -E "^$k +:" "$stats" || true
done
found=$(find "$out/default/crashes" "$out/default/hangs" -type f ! -name README.txt 2>/dev/null | wc -l)
if [ "$found" -gt 0 ]; then
  echo "FOUND $found crashing or hanging inputs:" >&2
  find "$out/default/crashes" "$out/default/hangs" -type f ! -name README.txt >&2
  echo "reproduce: cat FILE | fuzz/target/release/$target" >&2
  exit 1
fi
echo "== $target: no crash, no hang in $secs s"
