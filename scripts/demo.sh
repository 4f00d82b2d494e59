#!/usr/bin/env bash
# The demo: a local PostgreSQL 15, the Kafka test broker, outboxd, and an
# order service writing events the way an application would (the business
# change, the outbox INSERT and its DELETE in one transaction).  Prints the
# events as they arrive in Kafka and the slot's lag, then tears it all down.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j "$(nproc)" --target outboxd obx-testbroker >/dev/null

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

echo "== creating the schema (sql/001_outbox.sql, sql/002_publication.sql, orders)"
"${psql[@]}" -f sql/001_outbox.sql -f sql/002_publication.sql -f sql/demo/orders.sql

cat >"$work/outboxd.ini" <<INI
[source]
conninfo = host=$OBX_PGHOST port=$OBX_PGPORT user=$OBX_PGUSER dbname=postgres
slot = outboxd_demo
status_interval = 2s
[kafka]
bootstrap.servers = $bootstrap
linger.ms = 5
[log]
format = text
INI

echo "== starting outboxd"
build/outboxd run -c "$work/outboxd.ini" 2>"$work/outboxd.log" &
outboxd_pid=$!
for _ in $(seq 1 100); do grep -q "streaming from slot" "$work/outboxd.log" && break; sleep 0.1; done
sed 's/^/   outboxd| /' "$work/outboxd.log"

echo "== the order service confirms five orders (event row inserted and deleted in the same transaction)"
for i in 1 2 3 4 5; do
	"${psql[@]}" <<SQL
BEGIN;
INSERT INTO orders (customer, total) VALUES ('customer-$i', $i * 10.5);
UPDATE orders SET status = 'confirmed', updated_at = now() WHERE id = currval('orders_id_seq');
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', id::text, 'OrderConfirmed',
       jsonb_build_object('orderId', id, 'customer', customer, 'total', total)
FROM orders WHERE id = currval('orders_id_seq')
RETURNING id AS event_id \gset
DELETE FROM outbox WHERE id = :'event_id';
COMMIT;
SQL
done
echo "   outbox rows left in the table: $("${psql[@]}" -tAc 'SELECT count(*) FROM outbox')"

echo "== events in Kafka (topic outbox.event.order)"
timeout 30 kcat -q -b "$bootstrap" -C -t outbox.event.order -o beginning -c 5 \
	-f '   topic=%t partition=%p offset=%o key=%k\n   headers: %h\n   value: %s\n'

sleep 3
echo "== the slot (outboxd status)"
build/outboxd status -c "$work/outboxd.ini" | sed 's/^/   /'

kill -TERM "$outboxd_pid"
wait "$outboxd_pid" || true
outboxd_pid=""
echo "== outboxd stopped"
tail -1 "$work/outboxd.log" | sed 's/^/   outboxd| /'
