#!/usr/bin/env bash
# outboxd built against Debian 12's librdkafka 2.0.2 (-DOBX_SYSTEM_RDKAFKA=ON):
# it still builds and runs, says which library it runs with, and warns, in
# check and once at start, that Apache Kafka 4 refuses that library's SCRAM
# login; a build on librdkafka 2.6.1 or later does not.  No server is needed:
# the warning comes before the first connection.
#   test_old_rdkafka.sh OLD_BUILD_DIR CURRENT_BUILD_DIR
set -uo pipefail
old=${1:?build dir on librdkafka 2.0.2}
cur=${2:?build dir on the current librdkafka}
tmp=$(mktemp -d /tmp/obx-oldrk.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
has() { if grep -q -- "$2" "$3"; then ok "$1"; else not_ok "$1: no '$2' in: $(cat "$3")"; fi; }
lacks() { if grep -q -- "$2" "$3"; then not_ok "$1: '$2' in: $(cat "$3")"; else ok "$1"; fi; }

# nothing listens on port 1: check and run meet refused connections, after the warning
cat >"$tmp/scram.ini" <<'INI'
[source]
conninfo = host=127.0.0.1 port=1 dbname=app user=outboxd connect_timeout=2
[kafka]
bootstrap.servers = 127.0.0.1:1
security.protocol = SASL_SSL
sasl.mechanisms = SCRAM-SHA-512
sasl.username = alice
sasl.password = s3cret-pw-9
INI
sed 's/SCRAM-SHA-512/PLAIN/' "$tmp/scram.ini" >"$tmp/plain.ini"

"$old/outboxd" --version >"$tmp/version" 2>&1
has "the 2.0.2 build says which librdkafka it runs with" "(librdkafka 2\.0\.2)" "$tmp/version"

"$old/outboxd" check -c "$tmp/scram.ini" >"$tmp/check" 2>&1
has "check on 2.0.2 with SCRAM: WARN naming the library" "WARN.*librdkafka 2\.0\.2: Apache Kafka 4\.0 and later refuse" "$tmp/check"
has "check on 2.0.2 with SCRAM: the fix named" "2\.6\.1 or later" "$tmp/check"
lacks "check never shows the password" "s3cret-pw-9" "$tmp/check"
"$old/outboxd" check -c "$tmp/plain.ini" >"$tmp/check-plain" 2>&1
lacks "check on 2.0.2 with PLAIN: no SCRAM warning" "refuse this library's SCRAM" "$tmp/check-plain"

timeout -s TERM 4 "$old/outboxd" run -c "$tmp/scram.ini" >"$tmp/run" 2>&1
count=$(grep -c "refuse this library's SCRAM login" "$tmp/run")
if [ "$count" -eq 1 ]; then ok "run on 2.0.2 with SCRAM: the warning once"; else not_ok "run: the warning $count times: $(cat "$tmp/run")"; fi
lacks "run never shows the password" "s3cret-pw-9" "$tmp/run"

"$cur/outboxd" --version >"$tmp/version-cur" 2>&1
lacks "the current build does not run on 2.0.2" "(librdkafka 2\.0\.2)" "$tmp/version-cur"
"$cur/outboxd" check -c "$tmp/scram.ini" >"$tmp/check-cur" 2>&1
lacks "check on the current librdkafka with SCRAM: no warning" "refuse this library's SCRAM" "$tmp/check-cur"

echo "1..$n"
[ "$failed" -eq 0 ]
