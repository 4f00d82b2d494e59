#!/usr/bin/env bash
# The command line: help, version, usage errors (exit 2), config errors
# (one line, exit 2, no secret), and check/status against the real server.
set -uo pipefail
bin=$1
n=0
failed=0
tmp=$(mktemp -d /tmp/obx-cli.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
broker_pid=

ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
# expect DESC WANT_RC PATTERN -- cmd...  (PATTERN must match combined output)
expect() {
	local desc=$1 want=$2 pat=$3
	shift 4
	local out rc
	out=$("$@" 2>&1)
	rc=$?
	if [ "$rc" -eq "$want" ] && grep -qE -- "$pat" <<<"$out"; then
		ok "$desc"
	else
		not_ok "$desc (rc=$rc, want $want; output: $out)"
	fi
}
# refute DESC PATTERN -- cmd...  (output must not contain PATTERN)
refute() {
	local desc=$1 pat=$2
	shift 3
	if "$@" 2>&1 | grep -q -- "$pat"; then not_ok "$desc"; else ok "$desc"; fi
}

expect "help" 0 "Usage:" -- "$bin" --help
refute "help shows no secrets" "hunter2" -- env OUTBOXD_KAFKA_SASL_PASSWORD=hunter2 "$bin" --help
expect "version, with the librdkafka it runs on" 0 \
	"^outboxd [0-9]+\.[0-9]+\.[0-9]+ \(librdkafka [0-9]+\.[0-9]+\.[0-9]+[^)]*\)$" -- "$bin" --version
expect "unknown command" 2 "unknown command 'frob'" -- "$bin" frob
expect "unknown option" 2 "unknown option '--frob'" -- "$bin" --frob
expect "missing -c" 2 "missing -c FILE" -- "$bin" run
expect "missing value" 2 "option needs a value" -- "$bin" check -c
expect "json only for status" 2 "--json applies to status only" -- "$bin" check -c x --json

printf '[kafka]\nbootstrap.servers = 127.0.0.1:1\n[source]\nstatus_interval = 10 years\n' >"$tmp/bad.ini"
expect "config error: one line, exit 2" 2 \
	"^outboxd: config $tmp/bad.ini:4: key 'status_interval': expected a duration such as 10s or 500ms, got '10 years'$" \
	-- "$bin" check -c "$tmp/bad.ini"
expect "missing file" 2 "^outboxd: config $tmp/none.ini: could not open" -- "$bin" run -c "$tmp/none.ini"
printf '[kafka]\nbootstrap.servers = 127.0.0.1:1\n[source]\nconninfo = host=x password=hunter2 '"'"'oops\n' >"$tmp/pw.ini"
expect "bad conninfo: exit 2" 2 "key 'conninfo': not a valid" -- "$bin" check -c "$tmp/pw.ini"
refute "bad conninfo: password not shown" "hunter2" -- "$bin" check -c "$tmp/pw.ini"
printf '[kafka]\nbootstrap.servers = 127.0.0.1:1\n' >"$tmp/ok.ini"
expect "env override error names the variable" 2 \
	"config environment OUTBOXD_LOG_LEVEL: key 'level'" -- env OUTBOXD_LOG_LEVEL=loud "$bin" check -c "$tmp/ok.ini"
expect "--set error" 2 "config --set log.level: key 'level'" -- "$bin" check -c "$tmp/ok.ini" --set log.level=loud
refute "invalid sasl value not shown" "hunter2" -- "$bin" check -c "$tmp/ok.ini" \
	--set kafka.sasl.password=hunter2 --set kafka.sasl.mechanisms=NOPE

# outboxd config: the defaults are a configuration file that reads back to the same
# configuration; the effective one shows file, environment and --set, never a secret
expect "help lists config" 0 "outboxd config \[-c FILE\]" -- "$bin" --help
expect "config --defaults" 0 "^slot = outboxd$" -- "$bin" config --defaults
"$bin" config --defaults >"$tmp/defaults.ini"
"$bin" config -c "$tmp/defaults.ini" --set kafka.bootstrap.servers=127.0.0.1:1 >"$tmp/readback.ini"
if grep -q '^\[kafka\]$' "$tmp/defaults.ini" && grep -q '^bootstrap.servers = 127.0.0.1:1$' "$tmp/readback.ini" &&
	diff <(grep -v '^;' "$tmp/defaults.ini") \
		<(grep -v -e '^;' -e '^bootstrap.servers = 127.0.0.1:1$' "$tmp/readback.ini") >"$tmp/defaults.diff"; then
	ok "config: the printed defaults read back as the defaults"
else
	not_ok "config: the printed defaults read back as the defaults ($(cat "$tmp/defaults.diff"))"
fi
if "$bin" config -c "$tmp/readback.ini" | cmp -s - "$tmp/readback.ini"; then
	ok "config: a printed configuration reads back to itself"
else
	not_ok "config: a printed configuration reads back to itself"
fi
expect "config: the environment and --set apply" 0 "^level = debug$" -- \
	env OUTBOXD_LOG_LEVEL=warn "$bin" config -c "$tmp/ok.ini" --set log.level=debug
expect "config: without a file, the environment" 0 "^bootstrap.servers = 127.0.0.1:2$" -- \
	env OUTBOXD_KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:2 "$bin" config
expect "config: a bad value is the one-line error" 2 "^outboxd: config --set log.level: key 'level': expected" -- \
	"$bin" config -c "$tmp/ok.ini" --set log.level=loud
expect "config --defaults takes no -c" 2 "take no -c or --set" -- "$bin" config --defaults -c "$tmp/ok.ini"
expect "config --reference" 0 '^\| `slot` \| string \| `outboxd` \|' -- "$bin" config --reference
printf '[kafka]\nbootstrap.servers = 127.0.0.1:1\nsasl.password = hunter2\n[source]\nconninfo = host=x password=hunter2 dbname=shop\n' >"$tmp/secrets.ini"
printf 'hunter2\n' >"$tmp/pgpass.secret"
secret_env=(env OUTBOXD_SOURCE_PASSWORD_FILE="$tmp/pgpass.secret" OUTBOXD_KAFKA_SSL_KEY_PASSWORD=hunter2)
expect "config: secrets set" 0 "^; sasl.password = \(secret, not shown\)$" -- \
	"${secret_env[@]}" "$bin" config -c "$tmp/secrets.ini" --set kafka.sasl.username=hunter2
expect "config: the source password not shown" 0 "^; password = \(secret, not shown\)$" -- \
	"${secret_env[@]}" "$bin" config -c "$tmp/secrets.ini"
expect "config: conninfo with its password redacted" 0 "^conninfo = .*password=\*{8}" -- \
	"${secret_env[@]}" "$bin" config -c "$tmp/secrets.ini"
refute "config: no secret appears" "hunter2" -- \
	"${secret_env[@]}" "$bin" config -c "$tmp/secrets.ini" --set kafka.sasl.username=hunter2

# against the real server started by the stack fixture, and a test broker
# shellcheck disable=SC1090
. "$OBX_STACK_ENV"
: "${OBX_PGMAJOR:?$OBX_STACK_ENV names no OBX_PGMAJOR}"
mkfifo "$tmp/broker.in"
"$OBX_TESTBROKER" --brokers 1 <"$tmp/broker.in" >"$tmp/broker.out" 2>&1 &
broker_pid=$!
exec 9>"$tmp/broker.in"
trap 'exec 9>&-; wait $broker_pid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 1 100); do grep -q bootstrap "$tmp/broker.out" && break; sleep 0.1; done
bs=$(sed -n 's/^bootstrap.servers=//p' "$tmp/broker.out" | head -1)
ci="host=$OBX_PGHOST port=$OBX_PGPORT user=$OBX_PGUSER dbname=postgres password=hunter2"
# failover = off keeps the warning count below the same on every major (17 and later warn
# when no standby synchronizes a failover slot)
printf '[kafka]\nbootstrap.servers = %s\n[source]\nconninfo = %s\nslot = cli_slot\nfailover = off\n' "$bs" "$ci" >"$tmp/real.ini"
expect "check: reachable server, logical wal_level, missing table fails" 1 \
	"ok   wal_level: logical" -- "$bin" check -c "$tmp/real.ini"
expect "check: names the missing table" 1 "FAIL table: public.outbox does not exist" -- "$bin" check -c "$tmp/real.ini"
refute "check: no password in output" "hunter2" -- "$bin" check -c "$tmp/real.ini"
psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
	-c "CREATE TABLE IF NOT EXISTS public.outbox (id uuid, aggregatetype text, aggregateid text, type text, payload jsonb)" \
	-c "SELECT pg_create_logical_replication_slot('cli_slot', 'pgoutput')" >/dev/null
expect "check: all ok with table and slot" 0 "0 failed, 1 warnings" -- "$bin" check -c "$tmp/real.ini"
case $OBX_PGMAJOR in 13) proto=1 ;; 14) proto=2 ;; 15) proto=3 ;; *) proto=4 ;; esac
expect "check: names the server's major and pgoutput protocol $proto" 0 \
	"ok   server: reachable, PostgreSQL $OBX_PGMAJOR\.[0-9]+ \(pgoutput protocol $proto[,)]" -- "$bin" check -c "$tmp/real.ini"
expect "check: broker reachable" 0 "ok   broker: reachable, 1 broker" -- "$bin" check -c "$tmp/real.ini"
expect "check: warns about unbounded WAL retention" 0 "WARN max_slot_wal_keep_size = -1" -- "$bin" check -c "$tmp/real.ini"
expect "check: publication will be created" 0 "ok   publication: outboxd does not exist \(will be created\)" -- "$bin" check -c "$tmp/real.ini"
expect "check: empty outbox, topics at run time" 0 "topics: the outbox is empty" -- "$bin" check -c "$tmp/real.ini"
expect "check: exactly-once names a missing progress topic" 0 \
	"WARN exactly-once: progress topic outboxd.progress does not exist" -- "$bin" check -c "$tmp/real.ini" --set delivery.exactly_once=on
echo "topic outboxd.progress 1" >&9
sleep 1
expect "check: exactly-once finds the progress topic" 0 \
	"ok   exactly-once: progress topic outboxd.progress exists \(1 partition" -- "$bin" check -c "$tmp/real.ini" --set delivery.exactly_once=on
if [ "$OBX_PGMAJOR" -lt 15 ]; then
	# no row filters or column lists before 15: the topic listing alone
	psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
		-c "INSERT INTO public.outbox VALUES (gen_random_uuid(), 'order', 'k', 't', '{}')" \
		-c "CREATE PUBLICATION outboxd FOR TABLE public.outbox" >/dev/null
	expect "check: lists a topic the rows map to that does not exist" 0 "WARN topic: outbox.event.order does not exist" -- "$bin" check -c "$tmp/real.ini"
	echo "# skipped on PostgreSQL $OBX_PGMAJOR: publications with a row filter or a column list (needs 15)"
else
	psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
		-c "INSERT INTO public.outbox VALUES (gen_random_uuid(), 'order', 'k', 't', '{}')" \
		-c "CREATE PUBLICATION outboxd FOR TABLE public.outbox WHERE (type <> 'x')" >/dev/null
	expect "check: lists a topic the rows map to that does not exist" 1 "WARN topic: outbox.event.order does not exist" -- "$bin" check -c "$tmp/real.ini"
	expect "check: refuses a row filter" 1 "FAIL publication: outboxd has a row filter" -- "$bin" check -c "$tmp/real.ini"
	# a column list is judged by the columns the relay maps, as the relay judges it
	psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 -c "DROP PUBLICATION outboxd" \
		-c "CREATE PUBLICATION outboxd FOR TABLE public.outbox (id, aggregateid, type, payload)" >/dev/null
	expect "check: refuses a column list without a template column" 1 \
		"FAIL publication: outboxd's column list hides the mapped column aggregatetype" -- "$bin" check -c "$tmp/real.ini"
	refute "check: an unmapped column may be left out" "hides the mapped column" -- \
		"$bin" check -c "$tmp/real.ini" --set outbox.topic=orders
	expect "check: refuses a column list without a header column" 1 \
		"FAIL publication: outboxd's column list hides the mapped column aggregatetype" -- \
		"$bin" check -c "$tmp/real.ini" --set outbox.topic=orders --set outbox.header.kind=aggregatetype
fi
psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -c "DROP PUBLICATION outboxd" -c "DELETE FROM public.outbox" >/dev/null
printf '[kafka]\nbootstrap.servers = 127.0.0.1:1\nmessage.timeout.ms = 1000\n[source]\nconninfo = %s\nslot = cli_slot\n' "$ci" >"$tmp/nobroker.ini"
expect "check: unreachable broker fails" 1 "FAIL broker: could not reach 127.0.0.1:1" -- "$bin" check -c "$tmp/nobroker.ini"
expect "status: slot position" 0 "confirmed_flush_lsn +[0-9A-F]+/[0-9A-F]+" -- "$bin" status -c "$tmp/real.ini"
expect "status --json" 0 '"slot":"cli_slot"' -- "$bin" status -c "$tmp/real.ini" --json
expect "status: safe_wal_size (null: unbounded)" 0 '"safe_wal_size":null' -- "$bin" status -c "$tmp/real.ini" --json
psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres \
	-c "SELECT pg_drop_replication_slot('cli_slot')" -c "DROP TABLE public.outbox" >/dev/null
expect "status: missing slot" 1 "slot cli_slot does not exist" -- "$bin" status -c "$tmp/real.ini"
printf '[kafka]\nbootstrap.servers = 127.0.0.1:1\n[source]\nconninfo = host=127.0.0.1 port=1 password=hunter2\n' >"$tmp/down.ini"
expect "check: unreachable server" 1 "FAIL server: could not connect" -- "$bin" check -c "$tmp/down.ini"
refute "check: unreachable, no password" "hunter2" -- "$bin" check -c "$tmp/down.ini"

# the server line names the major and what it offers; RDS and Aurora grant replication
# through membership in rds_replication, which check accepts instead of the attribute
expect "check: names the server's major" 1 "ok   server: reachable, PostgreSQL ${OBX_PGMAJOR:-15}\.[0-9]+ \(pgoutput protocol [1-4]" \
	-- "$bin" check -c "$tmp/real.ini"
psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
	-c "CREATE ROLE rds_replication NOLOGIN" -c "CREATE ROLE cli_rds LOGIN" -c "CREATE ROLE cli_plain LOGIN" >/dev/null
for who in cli_rds cli_plain; do
	printf '[kafka]\nbootstrap.servers = %s\n[source]\nconninfo = host=%s port=%s user=%s dbname=postgres\nslot = cli_slot\n' \
		"$bs" "$OBX_PGHOST" "$OBX_PGPORT" "$who" >"$tmp/$who.ini"
done
expect "check: a role without REPLICATION fails" 1 "FAIL role: lacks REPLICATION" -- "$bin" check -c "$tmp/cli_rds.ini"
psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
	-c "GRANT rds_replication TO cli_rds" >/dev/null
expect "check: a member of rds_replication may replicate" 1 "ok   role: may replicate" -- "$bin" check -c "$tmp/cli_rds.ini"
expect "check: membership is not inherited by others" 1 "FAIL role: lacks REPLICATION" -- "$bin" check -c "$tmp/cli_plain.ini"
psql -X -q -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres -v ON_ERROR_STOP=1 \
	-c "DROP ROLE cli_rds" -c "DROP ROLE cli_plain" -c "DROP ROLE rds_replication" >/dev/null

echo "1..$n"
[ "$failed" -eq 0 ]
