#!/usr/bin/env bash
# Installs what is missing, builds outboxd with AddressSanitizer and
# UndefinedBehaviorSanitizer, and runs every test (unit, CLI, integration
# against real PostgreSQL servers, the Kafka test broker and, on 15, a real
# Apache Kafka broker, which the tests start and stop themselves).  Exits non-zero on any failure.
#
# PostgreSQL majors: the whole suite runs on Debian's 15 and on 18 (there
# without the slow tests labelled major15, which run on 15 alone); 13, 14,
# 16 and 17 run the compatibility set (the tests labelled compat in
# tests/CMakeLists.txt, which says what it holds) and the failover tests.  The majors other than
# 15 come from scripts/pg-majors.sh; each gets a fresh cluster (ctest's
# stack.start/stop fixture with OBX_PGBIN).  OBX_TEST_MAJORS="15 17"
# runs those majors only, in that order.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

read -r -a majors <<<"${OBX_TEST_MAJORS:-15 18 13 14 16 17}"
declare -A pgbin=([15]=/usr/lib/postgresql/15/bin)
others=()
for m in "${majors[@]}"; do
	case "$m" in
	15) ;;
	13 | 14 | 16 | 17 | 18) others+=("$m") ;;
	*) echo "test.sh: OBX_TEST_MAJORS: no PostgreSQL major '$m' (13 to 18)" >&2; exit 2 ;;
	esac
done
if [ "${#others[@]}" -gt 0 ]; then
	# the servers run as postgres, which must reach the binaries: a checkout it
	# cannot enter keeps them outside
	if [ "$(id -u)" -eq 0 ] && [ -z "${OBX_PGMAJORS_DIR:-}" ] && ! runuser -u postgres -- test -x "$PWD"; then
		export OBX_PGMAJORS_DIR=/var/cache/obx-pgmajors
	fi
	# one line per major: MAJOR VERSION BINDIR
	installed=$(bash scripts/pg-majors.sh "${others[@]}")
	while read -r m _ bin; do pgbin[$m]=$bin; done <<<"$installed"
fi

build=${OBX_BUILD_DIR:-build-asan}
cmake -S . -B "$build" -DOBX_SANITIZE=ON -DOBX_TEST_HOOKS=ON -DOBX_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
before=$(ls -d /tmp/obx-pg.* /tmp/obx-kafka.* 2>/dev/null | sort || true)
rc=0
summary=()
npass=0
nfail=0
for m in "${majors[@]}"; do
	case "$m" in
	15) what="whole suite" sel=(-LE compat) ;;
	# the tests labelled major15 (tests/CMakeLists.txt) earn their time on one major
	18) what="whole suite but the major15 tests" sel=(-LE 'compat|major15') ;;
	# and the failover tests, whose content follows the major: a synchronized slot
	# surviving a crash on 17, a standby as the source on 16, refusals before
	*) what="compatibility set and failover" sel=(-L 'compat|failover') ;;
	esac
	echo "test.sh: PostgreSQL $m, $what"
	t0=$(date +%s)
	r=0
	# two programs at a time: most of an integration test's time is waiting on the server or the
	# broker; the ones that stop or reconfigure the shared server are RUN_SERIAL (tests/CMakeLists.txt)
	(cd "$build" && OBX_PGBIN=${pgbin[$m]} ctest --output-on-failure --timeout 900 -j "${OBX_TEST_JOBS:-2}" \
		"${sel[@]}") || r=$?
	if [ "$r" -eq 0 ]; then
		result=passed
		npass=$((npass + 1))
	else
		result=failed
		nfail=$((nfail + 1))
		rc=1
	fi
	summary+=("test.sh: PostgreSQL $m ($what): $result, $(($(date +%s) - t0)) s")
done

# the build a user installs: Release (-O3, whose warnings differ; they fail it
# here), without the tests and so without cmocka, then cmake --install and the
# installed files used (tests/install/test_install.sh)
release=${OBX_RELEASE_BUILD_DIR:-build-release}
echo "test.sh: Release build without the tests, installed"
if cmake -S . -B "$release" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DOBX_WERROR=ON >/dev/null &&
	cmake --build "$release" -j "$(nproc)" >/dev/null; then
	bash tests/install/test_install.sh "$release" || rc=1
else
	echo "test.sh: the Release build failed" >&2
	rc=1
fi

# a distribution may still build on Debian 12's librdkafka 2.0.2: it must compile, and say that
# Apache Kafka 4 refuses its SCRAM login (tests/install/test_old_rdkafka.sh); about 15 s
old_rdkafka=${OBX_OLD_RDKAFKA_BUILD_DIR:-build-rdkafka-2.0}
echo "test.sh: Release build on Debian 12's librdkafka 2.0.2"
if cmake -S . -B "$old_rdkafka" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DOBX_WERROR=ON \
	-DOBX_SYSTEM_RDKAFKA=ON >/dev/null && cmake --build "$old_rdkafka" -j "$(nproc)" >/dev/null; then
	bash tests/install/test_old_rdkafka.sh "$old_rdkafka" "$build" || rc=1
else
	echo "test.sh: the build on librdkafka 2.0.2 failed" >&2
	rc=1
fi

# the micro-benchmarks must keep building and running (figures from a
# sanitized build mean nothing; bench/ is run on a plain build)
"$build/bench_micro" 0.2 tests/fixtures/pgoutput/pg15-v3.hex tests/fixtures/pgoutput/pg15-v1-binary.hex || rc=1
# the end-to-end harness (bench/run.py, minutes long, not run here) must at least parse
python3 -m py_compile bench/run.py || rc=1

# the network-facing decoder under libFuzzer, for a bounded time
echo "test.sh: fuzzing the decoder for ${OBX_FUZZ_SECONDS:-30} s"
bash scripts/fuzz.sh "${OBX_FUZZ_SECONDS:-30}" || rc=1

# the stacks must leave nothing behind: no cluster or broker directory, no server
after=$(ls -d /tmp/obx-pg.* /tmp/obx-kafka.* 2>/dev/null | sort || true)
left=$(comm -13 <(echo "$before") <(echo "$after") | grep . || true)
if [ -n "$left" ]; then
	echo "test.sh: test stack left directories behind: $left" >&2
	rc=1
fi
printf '%s\n' "${summary[@]}"
echo "majors: $npass passed, $nfail failed"
exit "$rc"
