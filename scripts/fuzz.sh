#!/usr/bin/env bash
# Fuzzes the network-facing decoder (CopyData framing, pgoutput, relation
# cache, event builder) with libFuzzer for SECONDS (default 60), starting
# from the seed corpus and every past crash kept in tests/fuzz/regressions/.
# Prints executions and coverage; exits non-zero on a crash, leaving the
# crashing input in build-fuzz/ (add it to tests/fuzz/regressions/).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
build=${OBX_FUZZ_DIR:-build-fuzz}

CC=clang-14 cmake -S . -B "$build" -DOBX_FUZZ=ON -DBUILD_TESTING=OFF -DOBX_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target fuzz_pgoutput >/dev/null
rm -rf "$build/seeds"
python3 tests/fuzz/make_seeds.py "$build/seeds"
cp tests/fuzz/regressions/* "$build/seeds/" 2>/dev/null || true
mkdir -p "$build/corpus"
# every past crash must stay fixed
for f in tests/fuzz/regressions/*; do
	[ -f "$f" ] && "$build/fuzz_pgoutput" "$f" >/dev/null 2>&1
done
cd "$build"
rc=0
./fuzz_pgoutput -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
	-max_len=8192 corpus seeds >fuzz.log 2>&1 || rc=$?
grep -a -E "DONE|stat::number_of_executed_units|stat::peak_rss_mb|ERROR|SUMMARY" fuzz.log | tail -6 || true
if [ "$rc" -ne 0 ]; then
	tail -40 fuzz.log
	echo "fuzz.sh: the fuzzer found a crash (see $build/crash-*); keep it in tests/fuzz/regressions/" >&2
fi
exit "$rc"
