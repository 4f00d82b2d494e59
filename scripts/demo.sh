#!/usr/bin/env bash
# The demo: the whole pattern on one machine.  A local PostgreSQL 15, the
# Kafka test broker, outboxd, an order service that confirms orders (the
# change and its event in one transaction, written with liboutbox) and a
# billing consumer that issues one invoice per confirmed order through the
# inbox.  On the way the broker goes down while orders are confirmed, and
# every message is delivered to the consumer twice.  It ends with the
# reconciliation: confirmed orders = invoices, no duplicates.  Then it tears
# everything down.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target outboxd obx-testbroker order_service billing_consumer >/dev/null

work=$(mktemp -d /tmp/outboxd-demo.XXXXXX)
broker_pid=""
outboxd_pid=""
cleanup() {
	[ -n "$outboxd_pid" ] && kill "$outboxd_pid" 2>/dev/null && wait "$outboxd_pid" 2>/dev/null || true
	exec 9>&- 2>/dev/null || true # end of stdin stops the broker
	[ -n "$broker_pid" ] && wait "$broker_pid" 2>/dev/null || true
	bash "$root/tests/stack/pgstack.sh" stop "$work/stack" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "== starting PostgreSQL 15"
bash tests/stack/pgstack.sh start "$work/stack"
# shellcheck disable=SC1091
. "$work/stack/env"
psql=(psql -X -q -v ON_ERROR_STOP=1 -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" -d postgres)

echo "== starting the Kafka test broker"
mkfifo "$work/broker.in"
build/tests/obx-testbroker --brokers 3 <"$work/broker.in" >"$work/broker.out" 2>&1 &
broker_pid=$!
exec 9>"$work/broker.in"
for _ in $(seq 1 100); do grep -q bootstrap "$work/broker.out" && break; sleep 0.1; done
bootstrap=$(sed -n 's/^bootstrap.servers=//p' "$work/broker.out" | head -1)
echo "   bootstrap.servers=$bootstrap"

echo "== creating the schema (sql/001_outbox.sql, sql/002_publication.sql, sql/007_inbox.sql, orders, invoices)"
"${psql[@]}" -f sql/001_outbox.sql -f sql/002_publication.sql -f sql/007_inbox.sql -f sql/demo/orders.sql \
	-c "CREATE TABLE invoices (order_id bigint NOT NULL, amount numeric(12, 2) NOT NULL, issued_at timestamptz NOT NULL DEFAULT now())"
conninfo="host=$OBX_PGHOST port=$OBX_PGPORT user=$OBX_PGUSER dbname=postgres"

cat >"$work/outboxd.ini" <<INI
[source]
conninfo = host=$OBX_PGHOST port=$OBX_PGPORT user=$OBX_PGUSER dbname=postgres
slot = outboxd_demo
status_interval = 2s
[kafka]
bootstrap.servers = $bootstrap
linger.ms = 5
[metrics]
listen = 127.0.0.1:9898
[log]
format = text
INI

echo "== starting outboxd"
build/outboxd run -c "$work/outboxd.ini" 2>"$work/outboxd.log" &
outboxd_pid=$!
for _ in $(seq 1 100); do grep -q "streaming from slot" "$work/outboxd.log" && break; sleep 0.1; done
sed 's/^/   outboxd| /' "$work/outboxd.log"

echo "== the order service confirms 5 orders (change + event in one transaction; the outbox row is deleted in it)"
build/order_service "$conninfo" 5
echo "   outbox rows left in the table: $("${psql[@]}" -tAc 'SELECT count(*) FROM outbox')"

echo "== the broker goes down; the order service keeps confirming (the business never waits for Kafka)"
for b in 1 2 3; do echo "down $b" >&9; done
build/order_service "$conninfo" 5
sleep 2
"${psql[@]}" -tAc "SELECT '   slot confirmed ' || confirmed_flush_lsn || ', server at ' || pg_current_wal_lsn() || ' (held back: not acknowledged yet)' FROM pg_replication_slots WHERE slot_name = 'outboxd_demo'"
echo "== the broker is back"
for b in 1 2 3; do echo "up $b" >&9; done

echo "== events in Kafka (topic outbox.event.order)"
timeout 30 kcat -q -b "$bootstrap" -C -t outbox.event.order -o beginning -c 10 \
	-f '   partition=%p offset=%o key=%k headers: %h\n   value: %s\n'

echo "== the billing consumer; every message is delivered to it twice"
build/billing_consumer "$conninfo" "$bootstrap" billing-demo 10 --duplicate

sleep 3
echo "== the slot (outboxd status)"
build/outboxd status -c "$work/outboxd.ini" | sed 's/^/   /'

echo "== reconciliation"
"${psql[@]}" -tA <<'SQL' | sed 's/^/   /'
SELECT 'confirmed orders: ' || (SELECT count(*) FROM orders WHERE status = 'confirmed');
SELECT 'invoices:         ' || (SELECT count(*) FROM invoices);
SELECT 'orders invoiced more than once: ' || (SELECT count(*) FROM (SELECT order_id FROM invoices GROUP BY order_id HAVING count(*) > 1) d);
SELECT 'messages marked in the inbox (each was delivered twice): ' || (SELECT count(*) FROM inbox);
SQL
missing=$("${psql[@]}" -tA -f sql/006_reconciliation.sql | wc -l)
echo "   confirmed orders without an invoice (sql/006_reconciliation.sql): $missing"
confirmed=$("${psql[@]}" -tAc "SELECT count(*) FROM orders WHERE status = 'confirmed'")
invoiced=$("${psql[@]}" -tAc "SELECT count(DISTINCT order_id) || '/' || count(*) FROM invoices")
if [ "$invoiced" = "$confirmed/$confirmed" ] && [ "$missing" -eq 0 ]; then
	echo "   OK: confirmed orders = invoices, no duplicates"
else
	echo "   MISMATCH: $confirmed confirmed, invoices distinct/total $invoiced" >&2
	exit 1
fi

kill -TERM "$outboxd_pid"
wait "$outboxd_pid" || true
outboxd_pid=""
echo "== outboxd stopped"
tail -1 "$work/outboxd.log" | sed 's/^/   outboxd| /'
