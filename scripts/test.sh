#!/usr/bin/env bash
# Installs what is missing, builds outboxd with AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs every test (unit, CLI, integration
# against a real PostgreSQL 15 and the Kafka test broker, which the tests
# start and stop themselves).  Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

build=${OBX_BUILD_DIR:-build-asan}
cmake -S . -B "$build" -DOBX_SANITIZE=ON -DOBX_TEST_HOOKS=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
before=$(ls -d /tmp/obx-pg.* 2>/dev/null | sort || true)
rc=0
(cd "$build" && ctest --output-on-failure --timeout 900) || rc=$?

# the micro-benchmarks must keep building and running (figures from a
# sanitized build mean nothing; bench/ is run on a plain build)
"$build/bench_micro" 0.2 tests/fixtures/pgoutput/pg15-v3.hex tests/fixtures/pgoutput/pg15-v1-binary.hex || rc=1
# the end-to-end harness (bench/run.py, minutes long, not run here) must at least parse
python3 -m py_compile bench/run.py || rc=1

# the network-facing decoder under libFuzzer, for a bounded time
echo "test.sh: fuzzing the decoder for ${OBX_FUZZ_SECONDS:-60} s"
bash scripts/fuzz.sh "${OBX_FUZZ_SECONDS:-60}" || rc=1

# the stack must leave nothing behind: no cluster directory, no server
after=$(ls -d /tmp/obx-pg.* 2>/dev/null | sort || true)
left=$(comm -13 <(echo "$before") <(echo "$after") | grep . || true)
if [ -n "$left" ]; then
	echo "test.sh: test stack left directories behind: $left" >&2
	rc=1
fi
exit "$rc"
