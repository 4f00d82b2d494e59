/*
 * cmd/check_slot.c - what "outboxd check" says of the slot: its WAL and the
 * free slots and WAL senders, the snapshot of pending rows, failover
 * (PostgreSQL 17+) and, with --standby, a standby's copy of the slot (see
 * cmd/check_int.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/cmd/check_int.h"
#include "obx/core/tables.h"
#include "obx/pg/tables.h"
#include "obx/core/snapmark.h"
#include "obx/pg/util.h"
#include "obx/run/snapshot.h"
#include "obx/sys/config_load.h"

void
obx_check_slot(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg)
{
	const char *p[1] = { cfg->slot };
	char err[1024], *v;
	PGresult *r;

	r = PQexecParams(conn,
	    "SELECT coalesce(wal_status, 'unknown'), coalesce(safe_wal_size::text, 'NULL'), "
	    "active::text FROM pg_replication_slots WHERE slot_name = $1",
	    1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		obx_check_report(cx, strcmp(PQgetvalue(r, 0, 0), "lost") == 0 ? "FAIL" : "ok",
		    "slot: %s, wal_status %s, safe_wal_size %s, active %s%s", cfg->slot, PQgetvalue(r, 0, 0),
		    PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2),
		    strcmp(PQgetvalue(r, 0, 0), "lost") == 0 ?
		        " (events may have been lost: recreate the slot and reconcile)" :
		        "");
	} else {
		obx_check_query_value(conn,
		    "SELECT (current_setting('max_replication_slots')::int - "
		    "(SELECT count(*) FROM pg_replication_slots))::text",
		    0, NULL, &v, err, sizeof(err));
		if (!cfg->create_slot)
			obx_check_report(cx, "FAIL", "slot: %s does not exist and create_slot = false", cfg->slot);
		else if (v != NULL && obx_check_count(v) <= 0)
			obx_check_report(cx, "FAIL",
			    "slot: %s does not exist and no replication slot is free "
			    "(raise max_replication_slots)",
			    cfg->slot);
		else
			obx_check_report(cx, "ok", "slot: %s does not exist (will be created; %s slot(s) free)",
			    cfg->slot, v ? v : "?");
		free(v);
	}
	PQclear(r);
	obx_check_query_value(conn,
	    "SELECT (current_setting('max_wal_senders')::int - "
	    "(SELECT count(*) FROM pg_stat_replication))::text",
	    0, NULL, &v, err, sizeof(err));
	obx_check_report(cx, obx_check_count(v) > 0 ? "ok" : "FAIL", "wal senders: %s free%s", v ? v : "?",
	    obx_check_count(v) > 0 ? "" : " (raise max_wal_senders)");
	free(v);
	obx_check_query_value(conn, "SELECT current_setting('max_slot_wal_keep_size')", 0, NULL, &v, err,
	    sizeof(err));
	if (v != NULL && strcmp(v, "-1") == 0)
		obx_check_report(cx, "WARN",
		    "max_slot_wal_keep_size = -1: nothing bounds the WAL a stalled slot retains "
		    "(the disk can fill; set a limit and alert on outboxd_slot_safe_wal_size_bytes)");
	else
		obx_check_report(cx, "ok", "max_slot_wal_keep_size = %s", v ? v : "?");
	free(v);
}

/* What the snapshot would publish of cfg's table (one line).  slot: the slot exists, with marker. */
static void
snapshot_of_table(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool slot, const char *marker)
{
	char table[600], filter[1024], order[300], err[1024];
	char *sql = NULL, *v = NULL;
	bool several = obx_tables_several(cfg);
	char of[2 * 64 + 8] = "";

	if (several)
		snprintf(of, sizeof(of), " of %s.%s", cfg->table_schema, cfg->table_name);
	if (obx_snapshot_describe(conn, cfg, table, sizeof(table), filter, sizeof(filter), order, sizeof(order),
	        err, sizeof(err)) != 0) {
		obx_check_report(cx, "FAIL", "snapshot: %s", err);
		return;
	}
	if (asprintf(&sql, "SELECT count(*)::text FROM (SELECT 1 FROM %s WHERE (%s) LIMIT 1000001) x", table,
	        filter) < 0)
		sql = NULL;
	if (sql == NULL || obx_check_query_value(conn, sql, 0, NULL, &v, err, sizeof(err)) != 0)
		obx_check_report(cx, "FAIL",
		    "snapshot: [source] snapshot_filter does not work on %s.%s (WHERE %s): %s", cfg->table_schema,
		    cfg->table_name, filter, sql == NULL ? "out of memory" : err);
	else if (slot)
		obx_check_report(cx, "WARN",
		    "snapshot: the snapshot of slot %s did not finish (slot %s exists): the "
		    "next start publishes the %s row(s)%s WHERE %s again, ORDER BY %s, then streams",
		    cfg->slot, marker, strcmp(v, "1000001") == 0 ? "over 1,000,000" : v, of, filter, order);
	else
		obx_check_report(cx, "ok",
		    "snapshot: pending: creating slot %s will publish the %s row(s)%s WHERE %s "
		    "first, ORDER BY %s (one more free replication slot, %s, is used meanwhile)",
		    cfg->slot, strcmp(v, "1000001") == 0 ? "over 1,000,000" : v, of, filter, order, marker);
	free(v);
	free(sql);
}

/*
 * [source] snapshot = pending: which rows a new slot publishes first (the
 * filter is run, so a bad one fails here), or that an earlier snapshot did
 * not finish, or that the slot exists and nothing precedes the stream.
 */
void
obx_check_snapshot(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg)
{
	char err[1024], marker[80], legacy[80];
	const char *p[3] = { cfg->slot, marker, legacy };
	struct obx_pg_tables tl;
	bool slot = false, marked = false;
	PGresult *r;

	if (!cfg->snapshot)
		return;
	obx_snapmark_name(cfg->slot, marker, sizeof(marker));
	/* or the marker an earlier version named with the slot's first 54 characters */
	if (!obx_snapmark_legacy_name(cfg->slot, legacy, sizeof(legacy)))
		snprintf(legacy, sizeof(legacy), "%s", marker);
	r = PQexecParams(conn,
	    "SELECT slot_name = $1 FROM pg_replication_slots WHERE slot_name IN ($1, $2, "
	    "$3)",
	    3, NULL, p, NULL, NULL, 0);
	for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
		slot = slot || strcmp(PQgetvalue(r, i, 0), "t") == 0;
		marked = marked || strcmp(PQgetvalue(r, i, 0), "f") == 0;
	}
	PQclear(r);
	if (slot && !marked) {
		obx_check_report(cx, "ok",
		    "snapshot: pending, but slot %s exists: nothing is published before the "
		    "stream (only a slot outboxd creates starts with its pending rows)",
		    cfg->slot);
		return;
	}
	if (!obx_tables_several(cfg)) {
		snapshot_of_table(cx, conn, cfg, slot, marker);
		return;
	}
	if (obx_pg_tables_read(conn, cfg, &tl, err, sizeof(err)) != 0)
		obx_check_report(cx, "FAIL", "snapshot: could not read the outbox tables: %s", err);
	for (size_t i = 0; i < tl.n; i++) {
		struct obx_config view;

		obx_tables_view(cfg, tl.t[i].mapping, tl.t[i].schema, tl.t[i].name, &view);
		snapshot_of_table(cx, conn, &view, slot, marker);
	}
	obx_pg_tables_reset(&tl);
}

/*
 * Failover slots (PostgreSQL 17+): whether the slot is failover-enabled and
 * what the primary can see of the standbys that keep a copy: slot sync
 * workers connected to it (recognised by their application_name, "[cluster_]slotsync
 * worker", unless the standby's primary_conninfo names itself) and the
 * physical slots named in synchronized_standby_slots, which hold a
 * failover slot's changes back until those standbys have them.
 */
void
obx_check_failover(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, const struct obx_pgfacts *f,
    bool in_recovery)
{
	const char *p[1] = { cfg->slot };
	char err[1024], ver[32], *v = NULL;
	PGresult *r;
	bool exists, failover, synced;
	long long workers;

	if (!f->failover_slots) {
		if (cfg->failover && cfg->failover_set)
			obx_check_report(cx, "ok",
			    "failover: [source] failover = on is ignored: PostgreSQL %s does not "
			    "synchronize slots to standbys (17 does); a failover loses the slot and the slot "
			    "guard then refuses to go on",
			    obx_pgversion_format(f->version, ver, sizeof(ver)));
		return;
	}
	r = PQexecParams(conn, "SELECT failover, synced FROM pg_replication_slots WHERE slot_name = $1", 1, NULL,
	    p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		obx_check_report(cx, "FAIL", "failover: could not read slot %s: %s", cfg->slot,
		    obx_pg_result_error_line(r, err, sizeof(err)));
		PQclear(r);
		return;
	}
	exists = PQntuples(r) == 1;
	failover = exists && strcmp(PQgetvalue(r, 0, 0), "t") == 0;
	synced = exists && strcmp(PQgetvalue(r, 0, 1), "t") == 0;
	PQclear(r);
	if (in_recovery) {
		if (synced)
			obx_check_report(cx, "ok",
			    "failover: slot %s is synchronized from the primary; it can be used "
			    "here once this server is promoted (outboxd waits until then)",
			    cfg->slot);
		else if (cfg->failover)
			obx_check_report(cx, "ok",
			    "failover: a hot standby's own slot cannot have failover; outboxd "
			    "enables it on slot %s after this server's promotion",
			    cfg->slot);
		return;
	}
	if (!cfg->failover) {
		obx_check_report(cx, "ok",
		    "failover: off: a failover to a standby loses slot %s (the slot guard then "
		    "refuses to go on)%s",
		    cfg->slot, failover ? "; outboxd disables failover on it at start" : "");
		return;
	}
	obx_check_report(cx, "ok", "failover: slot %s %s", cfg->slot,
	    !exists      ? "will be created with failover" :
	        failover ? "is failover-enabled" :
	                   "is not failover-enabled yet (outboxd enables it at start)");
	obx_check_query_value(conn,
	    "SELECT count(*)::text FROM pg_stat_activity "
	    "WHERE application_name LIKE '%slotsync worker'",
	    0, NULL, &v, err, sizeof(err));
	workers = obx_check_count(v);
	free(v);
	if (workers > 0)
		obx_check_report(cx, "ok",
		    "failover: %lld slot sync worker(s) connected: standbys keep a copy of "
		    "failover slots",
		    workers);
	else
		obx_check_report(cx, "WARN",
		    "failover: no standby synchronizes slot %s (no slot sync worker is "
		    "connected; one whose primary_conninfo sets application_name is not recognised): a "
		    "failover would lose it; on the standby set sync_replication_slots = on, "
		    "hot_standby_feedback = on, primary_slot_name and a dbname in primary_conninfo",
		    cfg->slot);
	r = PQexec(conn,
	    "SELECT s.name, r.slot_name IS NOT NULL, coalesce(r.active, false) "
	    "FROM unnest(string_to_array(nullif(replace(current_setting('synchronized_standby_slots'), "
	    "' ', ''), ''), ',')) s(name) "
	    "LEFT JOIN pg_replication_slots r ON r.slot_name = s.name AND r.slot_type = 'physical'");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		obx_check_report(cx, "FAIL", "failover: could not read synchronized_standby_slots: %s",
		    obx_pg_result_error_line(r, err, sizeof(err)));
	} else if (PQntuples(r) == 0) {
		obx_check_report(cx, "WARN",
		    "failover: synchronized_standby_slots is empty: outboxd may publish a "
		    "transaction no standby has received, and after a failover Kafka would hold events "
		    "the new primary never committed (name the standby's physical slot there)");
	}
	for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
		const char *name = PQgetvalue(r, i, 0);

		if (strcmp(PQgetvalue(r, i, 1), "t") != 0)
			obx_check_report(cx, "WARN",
			    "failover: synchronized_standby_slots names %s, which is no physical "
			    "slot here: failover slots wait for it, outboxd receives nothing",
			    name);
		else if (strcmp(PQgetvalue(r, i, 2), "t") != 0)
			obx_check_report(cx, "WARN",
			    "failover: physical slot %s (synchronized_standby_slots) is not "
			    "active: failover slots wait until its standby is back",
			    name);
		else
			obx_check_report(cx, "ok",
			    "failover: physical slot %s (synchronized_standby_slots) is active: "
			    "outboxd receives only what its standby has",
			    name);
	}
	PQclear(r);
}

/*
 * Reads setting name on conn.  Returns 0 with *out set to its value as text
 * (the caller frees it), or as obx_check_query_value() with *out NULL.
 */
static int
setting(PGconn *conn, const char *name, char **out, char *errbuf, size_t errlen)
{
	const char *p[1] = { name };

	return obx_check_query_value(conn, "SELECT current_setting($1)", 1, p, out, errbuf, errlen);
}

/*
 * "outboxd check --standby": does the standby at conninfo hold a
 * persistent synchronized copy of the slot, usable after a failover
 * (PostgreSQL 17+)?  A synced copy starts temporary and is dropped at
 * promotion until it becomes persistent, which happens once the primary's
 * slot passes the standby's catalog xmin and restart point.
 */
void
obx_check_standby(struct obx_check *cx, PGconn *primary, const struct obx_config *cfg, const char *conninfo)
{
	const char *p[1] = { cfg->slot };
	char err[1024], ver[32], safe[1024];
	char *sync = NULL, *feedback = NULL, *pslot = NULL, *listed = NULL, *v = NULL;
	PGconn *sb = NULL;
	PGresult *r = NULL, *pr = NULL;
	bool p_exists, p_failover;

	obx_conninfo_redact(conninfo, safe, sizeof(safe));
	if (PQserverVersion(primary) < 170000) {
		obx_check_report(cx, "WARN",
		    "standby: failover slots need PostgreSQL 17 or later (primary is %s): "
		    "a failover loses slot %s",
		    obx_pgversion_format(PQserverVersion(primary), ver, sizeof(ver)), cfg->slot);
		return;
	}
	if (obx_pg_connect(conninfo, cfg->password, NULL, NULL, "outboxd check", &sb, err, sizeof(err)) != 0) {
		obx_check_report(cx, "FAIL", "standby: could not connect to %s: %s", safe, err);
		return;
	}
	obx_check_query_value(sb, "SELECT pg_is_in_recovery()::text", 0, NULL, &v, err, sizeof(err));
	if (v == NULL || strcmp(v, "true") != 0) {
		obx_check_report(cx, "FAIL", "standby: %s is not a standby (not in recovery)", safe);
		goto out;
	}
	pr = PQexecParams(primary,
	    "SELECT failover, confirmed_flush_lsn::text FROM pg_replication_slots "
	    "WHERE slot_name = $1",
	    1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(pr) != PGRES_TUPLES_OK) {
		obx_check_report(cx, "FAIL", "standby: could not read slot %s on the primary: %s", cfg->slot,
		    obx_pg_result_error_line(pr, err, sizeof(err)));
		goto out;
	}
	p_exists = PQntuples(pr) == 1;
	p_failover = p_exists && strcmp(PQgetvalue(pr, 0, 0), "t") == 0;
	r = PQexecParams(sb,
	    "SELECT synced, temporary, "
	    "invalidation_reason IS NOT NULL OR coalesce(conflicting, false), "
	    "coalesce(confirmed_flush_lsn::text, ''), coalesce(catalog_xmin::text, ''), "
	    "coalesce(restart_lsn::text, ''), coalesce(invalidation_reason, '') "
	    "FROM pg_replication_slots WHERE slot_name = $1",
	    1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		obx_check_report(cx, "FAIL", "standby: could not read slot %s there: %s", cfg->slot,
		    obx_pg_result_error_line(r, err, sizeof(err)));
		goto out;
	}
	if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0 && strcmp(PQgetvalue(r, 0, 1), "f") == 0 &&
	    strcmp(PQgetvalue(r, 0, 2), "f") == 0) {
		const char *at = PQgetvalue(r, 0, 3);
		const char *primary_at = p_exists ? PQgetvalue(pr, 0, 1) : "?";

		obx_check_report(cx, "ok",
		    "standby: ready: it holds a persistent synchronized copy of slot %s at "
		    "%s (the primary's is at %s); a failover there keeps the slot",
		    cfg->slot, at, primary_at);
		goto out;
	}
	if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 2), "t") == 0) {
		obx_check_report(cx, "FAIL",
		    "standby: not ready: its copy of slot %s is invalidated%s%s; drop it "
		    "there and let it synchronize again",
		    cfg->slot, PQgetvalue(r, 0, 6)[0] ? ": " : "", PQgetvalue(r, 0, 6));
		goto out;
	}
	if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0) {
		obx_check_report(cx, "FAIL",
		    "standby: not ready: its copy of slot %s is temporary (catalog xmin %s, "
		    "restart_lsn %s) and would be dropped at promotion; it becomes persistent once the "
		    "primary's slot passes them, i.e. after the next activity the relay confirms (the standby "
		    "logs \"could not synchronize replication slot\" until then); run this check again, or "
		    "on the standby: SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = '%s'",
		    cfg->slot, PQgetvalue(r, 0, 4), PQgetvalue(r, 0, 5), cfg->slot);
		goto out;
	}
	/* no synchronized copy: name what is missing */
	/* a setting that cannot be read is named "unknown" below */
	(void)setting(sb, "sync_replication_slots", &sync, err, sizeof(err));
	(void)setting(sb, "hot_standby_feedback", &feedback, err, sizeof(err));
	(void)setting(sb, "primary_slot_name", &pslot, err, sizeof(err));
	if (pslot != NULL && pslot[0] != '\0') {
		const char *q[1] = { pslot };

		obx_check_query_value(primary,
		    "SELECT ($1 = ANY (string_to_array(replace(current_setting("
		    "'synchronized_standby_slots'), ' ', ''), ',')))::text",
		    1, q, &listed, err, sizeof(err));
	}
	if (PQntuples(r) == 1)
		obx_check_report(cx, "FAIL",
		    "standby: not ready: slot %s there is its own, not a synchronized copy "
		    "(drop it there so the primary's can be synchronized)",
		    cfg->slot);
	else if (!p_exists)
		obx_check_report(cx, "FAIL",
		    "standby: not ready: slot %s does not exist on the primary yet (outboxd "
		    "creates it at start)",
		    cfg->slot);
	else if (!p_failover)
		obx_check_report(cx, "FAIL",
		    "standby: not ready: slot %s has failover off on the primary, so no "
		    "standby synchronizes it (set [source] failover = on; outboxd enables it at start)",
		    cfg->slot);
	else if (sync == NULL || strcmp(sync, "on") != 0)
		obx_check_report(cx, "FAIL", "standby: not ready: sync_replication_slots is %s there (set it on)",
		    sync != NULL ? sync : "unknown");
	else if (pslot == NULL || pslot[0] == '\0')
		obx_check_report(cx, "FAIL",
		    "standby: not ready: primary_slot_name is not set there (slot "
		    "synchronization needs a physical slot on the primary)");
	else if (feedback == NULL || strcmp(feedback, "on") != 0)
		obx_check_report(cx, "FAIL", "standby: not ready: hot_standby_feedback is %s there (set it on)",
		    feedback != NULL ? feedback : "unknown");
	else
		obx_check_report(cx, "FAIL",
		    "standby: not ready: no copy of slot %s there yet (the slot sync worker "
		    "may not have run: check primary_conninfo has a dbname, and the standby's log)",
		    cfg->slot);
	if (pslot != NULL && pslot[0] != '\0' && (listed == NULL || strcmp(listed, "true") != 0))
		obx_check_report(cx, "WARN",
		    "standby: synchronized_standby_slots on the primary does not name %s "
		    "(the standby's primary_slot_name): outboxd may publish what the standby has not "
		    "received",
		    pslot);
out:
	free(v);
	free(sync);
	free(feedback);
	free(pslot);
	free(listed);
	PQclear(r);
	PQclear(pr);
	PQfinish(sb);
}
