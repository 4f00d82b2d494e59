#!/usr/bin/env bash
# pg-majors-smoke.sh [MAJOR...]
#
# Runs outboxd end to end against each PostgreSQL major (default 13 14 15 16
# 17 18; 15 is Debian's, the others come from scripts/pg-majors.sh), to see
# which catalog queries and replication commands a major refuses.  Per major
# it starts a throwaway cluster (tests/stack/pgstack.sh), creates the outbox
# table (sql/001_outbox.sql), starts the Kafka test broker, and for each
# variant runs `outboxd check`, `outboxd status`, then `outboxd run` while
# rows are inserted, and counts what reached the topic with kcat:
#
#   base       one row
#   streaming  [source] streaming = on, one transaction of 2000 rows larger
#              than logical_decoding_work_mem (64kB here), so 14+ stream it
#   messages   [source] messages = on, a row and a transactional
#              pg_logical_emit_message in one transaction
# OBX_SMOKE_VARIANTS picks some of them (default: "base streaming messages").
#
# Needs outboxd and obx-testbroker built in OBX_BUILD_DIR (default build/):
#   cmake -S . -B build -DOBX_SANITIZE=OFF && cmake --build build --target outboxd obx-testbroker
# Logs go to OBX_SMOKE_OUT (default a new /tmp/obx-smoke.XXXXXX, kept);
# a summary table is printed at the end.  Exits 0 when every variant that
# the major supports published everything, 1 otherwise.  Everything it
# starts (clusters, brokers, relays) is stopped by PID before it exits.
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=${OBX_BUILD_DIR:-$repo/build}
case "$build" in /*) ;; *) build=$repo/$build ;; esac
outboxd=$build/outboxd
broker=$build/tests/obx-testbroker
for f in "$outboxd" "$broker"; do
	if [ ! -x "$f" ]; then
		echo "pg-majors-smoke: $f is missing (build outboxd and obx-testbroker first)" >&2
		exit 2
	fi
done
command -v kcat >/dev/null || { echo "pg-majors-smoke: kcat is missing" >&2; exit 2; }

majors=("$@")
[ "${#majors[@]}" -gt 0 ] || majors=(13 14 15 16 17 18)
read -r -a variants <<<"${OBX_SMOKE_VARIANTS:-base streaming messages}"
out=${OBX_SMOKE_OUT:-$(mktemp -d /tmp/obx-smoke.XXXXXX)}
mkdir -p "$out"
summary=$out/summary.tsv
: >"$summary"

pids=()
stacks=()
cleanup() {
	local p s
	for p in "${pids[@]}"; do
		kill -TERM "$p" 2>/dev/null && { sleep 0.5; kill -KILL "$p" 2>/dev/null; }
		wait "$p" 2>/dev/null
	done
	for s in "${stacks[@]}"; do "$repo/tests/stack/pgstack.sh" stop "$s" >/dev/null 2>&1; done
	[ -n "${bfd:-}" ] && exec {bfd}>&- 2>/dev/null
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# waits for process $1 to end (it is ours), up to $2 seconds, then kills it
stop_pid() {
	local p=$1 t=${2:-10} i
	kill -TERM "$p" 2>/dev/null
	for ((i = 0; i < t * 10; i++)); do
		kill -0 "$p" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$p" 2>/dev/null
	wait "$p" 2>/dev/null
	local rc=$?
	local keep=()
	for q in "${pids[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
	pids=("${keep[@]}")
	return $rc
}

psql_() { psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres "$@"; }

# consumes topic $1 from the beginning until it holds $2 messages or 20 s pass; prints the count
consume() {
	local topic=$1 want=$2 n=0 i
	for ((i = 0; i < 20; i++)); do
		n=$(timeout 10 kcat -b "$bootstrap" -C -t "$topic" -e -o beginning -q -f '%k\n' 2>/dev/null | grep -c . || true)
		[ "$n" -ge "$want" ] && break
		sleep 1
	done
	echo "$n"
}

# the first error-looking lines of a log, one line
errors_of() {
	grep -E '(ERROR|FATAL|FAIL|error|could not)' "$1" 2>/dev/null | grep -v '^ok' | head -3 | tr '\n' '|' | sed 's/|$//'
}

run_variant() {
	local m=$1 v=$2 dir=$out/$1/$2 conf slot=s_$2 agg=order_$2 want=1 rc n pid i active=f slotm=-
	mkdir -p "$dir"
	conf=$dir/outboxd.conf
	cat >"$conf" <<CONF
[source]
conninfo = host=127.0.0.1 port=$port user=postgres dbname=postgres
slot = $slot
status_interval = 1s
CONF
	case "$v" in
	streaming) echo "streaming = on" >>"$conf" ;;
	messages) echo "messages = on" >>"$conf" ;;
	esac
	cat >>"$conf" <<CONF
[kafka]
bootstrap.servers = $bootstrap
[metrics]
listen = 127.0.0.1:0
[log]
format = text
level = debug
CONF
	echo "topic outbox.event.$agg 1" >&"$bfd"

	"$outboxd" check -c "$conf" >"$dir/check.txt" 2>&1
	local check_rc=$?
	"$outboxd" status -c "$conf" >"$dir/status-before.txt" 2>&1
	local status0_rc=$?

	"$outboxd" run -c "$conf" >"$dir/run.log" 2>&1 &
	pid=$!
	pids+=("$pid")
	for ((i = 0; i < 200; i++)); do
		active=$(psql_ -tAc "SELECT active FROM pg_replication_slots WHERE slot_name = '$slot'" 2>/dev/null)
		[ "$active" = t ] && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if [ "$active" = t ]; then
		case "$v" in
		base)
			psql_ -c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('$agg', 'o-1', 'created', '{\"n\": 1}')" >"$dir/insert.txt" 2>&1
			;;
		streaming)
			want=2000
			psql_ -c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT '$agg', 'o-' || g, 'created', jsonb_build_object('n', g, 'pad', repeat('x', 200)) FROM generate_series(1, $want) g" >"$dir/insert.txt" 2>&1
			;;
		messages)
			want=2
			psql_ >"$dir/insert.txt" 2>&1 <<SQL
BEGIN;
INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('$agg', 'o-1', 'created', '{"n": 1}');
SELECT pg_logical_emit_message(true, 'outboxd', json_build_object('id', gen_random_uuid(), 'aggregatetype', '$agg', 'aggregateid', 'm-1', 'type', 'created', 'payload', json_build_object('n', 2))::text);
COMMIT;
SQL
			;;
		esac
		n=$(consume "outbox.event.$agg" "$want")
		"$outboxd" status -c "$conf" >"$dir/status-running.txt" 2>&1
		local status1_rc=$?
		# the metrics poller reads the slot with a query of its own (src/sys/http.c)
		local mport
		mport=$(sed -n 's/.*metrics and health on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/run.log" | head -1)
		if [ -n "$mport" ]; then
			sleep 2
			curl -s --max-time 5 "http://127.0.0.1:$mport/metrics" >"$dir/metrics.txt" 2>&1
			slotm=$(grep -E '^outboxd_slot_(wal_status|safe_wal_size_bytes|retained_wal_bytes) ' "$dir/metrics.txt" | tr '\n' ' ')
		fi
		if [ "$v" = streaming ] && [ "$m" -ge 14 ]; then
			psql_ -tAc "SELECT 'stream_txns=' || stream_txns || ' spill_txns=' || spill_txns FROM pg_stat_replication_slots WHERE slot_name = '$slot'" >"$dir/stream-stats.txt" 2>&1
		fi
	else
		n=0
		local status1_rc=-
	fi
	if kill -0 "$pid" 2>/dev/null; then
		stop_pid "$pid" 10
		rc="stopped:$?"
	else
		wait "$pid"
		rc="exited:$?"
		local keep=()
		for q in "${pids[@]}"; do [ "$q" = "$pid" ] || keep+=("$q"); done
		pids=("${keep[@]}")
	fi
	printf '%s\t%s\tcheck=%s\tstatus(no slot)=%s\tstatus(running)=%s\trun=%s\tslot_active=%s\tpublished=%s/%s\tmetrics=%s\t%s\t%s\n' \
		"$m" "$v" "$check_rc" "$status0_rc" "$status1_rc" "$rc" "${active:-f}" "$n" "$want" "${slotm:--}" \
		"$(grep -E '^(FAIL|WARN)' "$dir/check.txt" | head -3 | tr '\n' '|' | sed 's/|$//')" \
		"$(errors_of "$dir/run.log")" | tee -a "$summary"
}

for m in "${majors[@]}"; do
	if [ "$m" = 15 ]; then
		pgbin=/usr/lib/postgresql/15/bin
	else
		pgbin=$("$repo/scripts/pg-majors.sh" --bin "$m" 2>"$out/pg-majors-$m.log") || {
			echo "pg-majors-smoke: could not install PostgreSQL $m (see $out/pg-majors-$m.log)" >&2
			printf '%s\t-\tinstall failed\n' "$m" >>"$summary"
			continue
		}
	fi
	mkdir -p "$out/$m"
	printf 'logical_decoding_work_mem = 64kB\n' >"$out/$m/extra.conf"
	stack=$out/$m/stack
	stacks+=("$stack")
	if ! OBX_PGBIN=$pgbin "$repo/tests/stack/pgstack.sh" start "$stack" "$out/$m/extra.conf" >"$out/$m/stack.log" 2>&1; then
		cat "$out/$m/stack.log" >&2
		printf '%s\t-\tcluster did not start\n' "$m" >>"$summary"
		continue
	fi
	port=$(sed -n 's/^OBX_PGPORT=//p' "$stack/env")
	psql_ -f "$repo/sql/001_outbox.sql" >"$out/$m/schema.txt" 2>&1
	psql_ -tAc "SELECT version()" >"$out/$m/version.txt"

	# the broker reads commands on stdin: a FIFO held open here keeps it running
	rm -f "$out/$m/broker.in"
	mkfifo "$out/$m/broker.in"
	exec {bfd}<>"$out/$m/broker.in"
	"$broker" <"$out/$m/broker.in" >"$out/$m/broker.out" 2>"$out/$m/broker.err" &
	bpid=$!
	pids+=("$bpid")
	bootstrap=
	for ((i = 0; i < 100; i++)); do
		bootstrap=$(sed -n 's/^bootstrap.servers=//p' "$out/$m/broker.out" | head -1)
		[ -n "$bootstrap" ] && break
		sleep 0.1
	done
	if [ -z "$bootstrap" ]; then
		echo "pg-majors-smoke: the test broker did not start" >&2
		exit 1
	fi

	for v in "${variants[@]}"; do
		run_variant "$m" "$v"
	done

	echo quit >&"$bfd"
	stop_pid "$bpid" 5
	exec {bfd}>&-
	"$repo/tests/stack/pgstack.sh" stop "$stack" >/dev/null 2>&1
	keep=()
	for s in "${stacks[@]}"; do [ "$s" = "$stack" ] || keep+=("$s"); done
	stacks=("${keep[@]}")
done

echo "pg-majors-smoke: logs in $out"
# a variant fails when it published less than it should; on 13 streaming and
# messages need 14 (outboxd says so), which is not counted as a failure
awk -F'\t' '$2 != "-" { split($8, a, "[=/]"); if (a[2] + 0 < a[3] + 0 && !($1 == 13 && $2 != "base")) bad++ }
	$2 == "-" { bad++ } END { exit bad > 0 }' "$summary"
