#!/usr/bin/env bash
# Every file in sql/ runs cleanly with psql -v ON_ERROR_STOP=1 against the
# real server (twice: they are idempotent where they say so), and does what
# it says: the cleanup deletes old rows in batches, the monitoring view shows
# the slot, the reconciliation lists exactly the changes without an effect.
set -uo pipefail
# shellcheck disable=SC1090
. "$OBX_STACK_ENV"
src=${OBX_SOURCE_DIR:?}
db=sqltest_$$
n=0
failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
psql_db() { psql -X -q -v ON_ERROR_STOP=1 -h "$OBX_PGHOST" -p "$OBX_PGPORT" -U "$OBX_PGUSER" "$@"; }
check() { if [ "$2" = "$3" ]; then ok "$1"; else not_ok "$1 (got '$2', want '$3')"; fi; }

psql_db -d postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
trap 'psql_db -d postgres -c "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1' EXIT

for f in 001_outbox.sql 002_publication.sql 003_role.sql 004_cleanup.sql 005_monitoring.sql demo/orders.sql; do
	if psql_db -d "$db" -f "$src/sql/$f" >/dev/null; then ok "$f runs"; else not_ok "$f runs"; fi
done
for f in 001_outbox.sql 003_role.sql 004_cleanup.sql 005_monitoring.sql; do
	if psql_db -d "$db" -f "$src/sql/$f" >/dev/null; then ok "$f runs again"; else not_ok "$f runs again"; fi
done

check "the role may replicate and log in, not more" \
	"$(psql_db -d "$db" -tAc "SELECT rolreplication AND rolcanlogin AND NOT rolsuper FROM pg_roles WHERE rolname = 'outboxd'")" t
check "the role reads the outbox" \
	"$(psql_db -d "$db" -tAc "SELECT has_table_privilege('outboxd', 'outbox', 'SELECT')")" t
check "the role does not write it" \
	"$(psql_db -d "$db" -tAc "SELECT has_table_privilege('outboxd', 'outbox', 'INSERT')")" f
check "the role owns the publication" \
	"$(psql_db -d "$db" -tAc "SELECT pg_get_userbyid(pubowner) FROM pg_publication WHERE pubname = 'outboxd'")" outboxd

psql_db -d "$db" -c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, created_at)
	SELECT 'a', g::text, 't', '{}', now() - interval '2 days' FROM generate_series(1, 2500) g" \
	-c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('a', 'new', 't', '{}')" >/dev/null
psql_db -d "$db" -c "CALL outbox_cleanup(interval '1 day', 1000)" >/dev/null
check "cleanup deleted the old rows in batches, kept the new one" \
	"$(psql_db -d "$db" -tAc "SELECT count(*) FROM outbox")" 1

# polling mode: the migration and the trigger, twice; cleanup then takes published rows only
psql_db -d "$db" -c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('a', 'before', 't', '{}')" >/dev/null
for f in 008_polling.sql 009_polling_notify.sql 008_polling.sql 009_polling_notify.sql; do
	if psql_db -d "$db" -f "$src/sql/$f" >/dev/null; then ok "$f runs"; else not_ok "$f runs"; fi
done
check "rows there before the migration count as published, new ones are pending" \
	"$(psql_db -d "$db" -tAc "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('a', 'after', 't', '{}');
		SELECT string_agg(aggregateid || ':' || (published_at IS NULL) || ':' || attempts || ':' || (seq > 0), ',' ORDER BY seq) FROM outbox")" \
	"new:false:0:true,before:false:0:true,after:true:0:true"
check "the role may mark rows" \
	"$(psql_db -d "$db" -tAc "SELECT has_column_privilege('outboxd', 'outbox', 'published_at', 'UPDATE')")" t
check "an insert notifies the poller's channel" \
	"$(psql_db -d "$db" -tA -c "LISTEN outboxd" -c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('a', 'n', 't', '{}')" 2>&1 | grep -c 'notification \"outboxd\"')" 1
psql_db -d "$db" -c "DELETE FROM outbox" \
	-c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, created_at, published_at)
	SELECT 'a', g::text, 't', '{}', now() - interval '3 days', now() - interval '2 days' FROM generate_series(1, 2500) g" \
	-c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, created_at)
	SELECT 'a', 'pending' || g, 't', '{}', now() - interval '3 days' FROM generate_series(1, 3) g" \
	-c "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, published_at) VALUES ('a', 'fresh', 't', '{}', now())" >/dev/null
psql_db -d "$db" -c "CALL outbox_cleanup(interval '1 day', 1000)" >/dev/null
check "polling cleanup deleted the old published rows, kept the pending and the fresh ones" \
	"$(psql_db -d "$db" -tAc "SELECT string_agg(aggregateid, ',' ORDER BY aggregateid) FROM outbox")" \
	"fresh,pending1,pending2,pending3"

psql_db -d "$db" -c "SELECT pg_create_logical_replication_slot('sqltest_$$', 'pgoutput')" >/dev/null
check "the monitoring view shows the slot" \
	"$(psql_db -d "$db" -tAc "SELECT slot_name || ' ' || wal_status || ' ' || (lag_bytes >= 0) FROM outboxd_slot_status")" \
	"sqltest_$$ reserved true"
psql_db -d "$db" -c "SELECT pg_drop_replication_slot('sqltest_$$')" >/dev/null

psql_db -d "$db" -c "CREATE TABLE invoices (order_id bigint)" \
	-c "INSERT INTO orders (customer, total, status) VALUES ('a', 1, 'confirmed'), ('b', 2, 'confirmed'), ('c', 3, 'new')" \
	-c "INSERT INTO invoices SELECT id FROM orders WHERE customer = 'a'" >/dev/null
out=$(psql_db -d "$db" -tA -f "$src/sql/006_reconciliation.sql" | cut -d'|' -f1)
want=$(psql_db -d "$db" -tAc "SELECT id FROM orders WHERE customer = 'b'")
check "reconciliation lists the confirmed order without an invoice, only it" "$out" "$want"

echo "1..$n"
[ "$failed" -eq 0 ]
