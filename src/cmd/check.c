/*
 * cmd/check.c - "outboxd check" (preflight) and "outboxd status".
 * Both use an ordinary (non-replication) connection and only read.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "obx/cmd/cli.h"
#include "obx/sys/config_load.h"
#include "obx/core/err.h"
#include "obx/kafka/producer.h"
#include "obx/pg/setup.h"
#include "obx/pg/util.h"
#include "obx/run/poll.h"
#include "obx/core/snapmark.h"
#include "obx/run/snapshot.h"
#include "obx/core/template.h"

struct check_ctx {
	int failures;
	int warnings;
};

static void report(struct check_ctx *cx, const char *verdict, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
report(struct check_ctx *cx, const char *verdict, const char *fmt, ...)
{
	va_list ap;

	printf("%-4s ", verdict);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (strcmp(verdict, "FAIL") == 0)
		cx->failures++;
	else if (strcmp(verdict, "WARN") == 0)
		cx->warnings++;
}

/*
 * Runs a one-row, one-column query with text parameters.  Returns 0 with
 * *out set to a copy of the value (the caller frees it); OBX_ENOENT when
 * there is no row or the value is NULL; OBX_EIO with the server's message
 * in err; OBX_ENOMEM.  *out stays NULL unless 0 is returned.
 */
static int
query_value(PGconn *conn, const char *sql, int nparams, const char *const *params, char **out,
    char *err, size_t errlen)
{
	PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	int r = 0;

	*out = NULL;
	err[0] = '\0';
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		obx_pg_result_error_line(res, err, errlen);
		r = OBX_EIO;
	} else if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0)) {
		r = OBX_ENOENT;
	} else if ((*out = strdup(PQgetvalue(res, 0, 0))) == NULL) {
		snprintf(err, errlen, "%s", obx_strerror(OBX_ENOMEM));
		r = OBX_ENOMEM;
	}
	PQclear(res);
	return r;
}

/*
 * Fails each mapped column the publication's column list hides while the
 * table has it: the columns and the rule by which the relay refuses to start.
 */
static void
check_column_list(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg,
    const char *const *params)
{
	struct obx_names cols = { 0 };
	char *list = NULL, *sql = NULL;
	PGresult *r = NULL;
	char err[1024];

	if (obx_config_mapped_columns(cfg, &cols) != 0 || obx_pg_literal_list(conn, &cols, &list) != 0 ||
	    asprintf(&sql, "SELECT m FROM pg_publication_tables t, unnest(ARRAY[%s]::name[]) m "
	    "WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3 AND t.attnames IS NOT NULL "
	    "AND NOT m = ANY(t.attnames) AND m IN (SELECT attname FROM pg_attribute "
	    "WHERE attrelid = (quote_ident($2) || '.' || quote_ident($3))::regclass "
	    "AND attnum > 0 AND NOT attisdropped)", list) < 0) {
		sql = NULL;
		report(cx, "FAIL", "publication: could not check its column list: out of memory");
		goto out;
	}
	r = PQexecParams(conn, sql, 3, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		report(cx, "FAIL", "publication: could not read the column list of %s: %s",
		    cfg->publication, obx_pg_result_error_line(r, err, sizeof(err)));
		goto out;
	}
	for (int i = 0; i < PQntuples(r); i++)
		report(cx, "FAIL", "publication: %s's column list hides the mapped column %s",
		    cfg->publication, PQgetvalue(r, i, 0));
out:
	PQclear(r);
	free(sql);
	free(list);
	obx_names_reset(&cols);
}

static void
check_publication(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg, bool has_table,
    bool in_recovery)
{
	const char *p[4] = { cfg->publication, cfg->table_schema, cfg->table_name, NULL };
	char err[1024], *v;
	PGresult *r;
	int rc;

	rc = query_value(conn, "SELECT pubinsert::text FROM pg_publication WHERE pubname = $1", 1, p,
	    &v, err, sizeof(err));
	if (rc != 0 && rc != OBX_ENOENT) {
		report(cx, "FAIL", "publication: could not read %s: %s", cfg->publication, err);
		return;
	}
	if (rc == OBX_ENOENT && in_recovery) {
		report(cx, "FAIL", "publication: %s does not exist and this hot standby cannot create it "
		    "(run sql/002_publication.sql on the primary)", cfg->publication);
		return;
	}
	if (rc == OBX_ENOENT) {
		report(cx, cfg->create_publication ? "ok" : "FAIL", "publication: %s does not exist%s",
		    cfg->publication, cfg->create_publication ? " (will be created)" :
		    " and create_publication = false (run sql/002_publication.sql as the table owner)");
		return;
	}
	if (strcmp(v, "true") != 0)
		report(cx, "FAIL", "publication: %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
		    cfg->publication, cfg->publication);
	free(v);
	if (!has_table) {
		report(cx, "ok", "publication: %s exists (messages only: its tables do not matter)",
		    cfg->publication);
		return;
	}
	/* row filters (pg_publication_tables.rowfilter) arrive in PostgreSQL 15 */
	r = PQexecParams(conn, obx_pg_facts(conn).publication_filters ? "SELECT rowfilter IS NOT NULL "
	    "FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3" :
	    "SELECT false FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
	    3, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		char why[512];

		report(cx, "FAIL", "publication: could not read %s: %s", cfg->publication,
		    obx_pg_result_error_line(r, why, sizeof(why)));
		PQclear(r);
		return;
	}
	if (PQntuples(r) == 0) {
		report(cx, "FAIL", "publication: %s does not publish %s.%s (or publishes its partitions "
		    "without publish_via_partition_root)", cfg->publication, cfg->table_schema, cfg->table_name);
		PQclear(r);
		return;
	}
	if (strcmp(PQgetvalue(r, 0, 0), "t") == 0)
		report(cx, "FAIL", "publication: %s has a row filter: filtered events would never be published",
		    cfg->publication);
	PQclear(r);
	if (obx_pg_facts(conn).publication_filters)
		check_column_list(cx, conn, cfg, p);
	report(cx, "ok", "publication: %s publishes inserts of %s.%s", cfg->publication,
	    cfg->table_schema, cfg->table_name);
}

static void
check_slot(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg)
{
	const char *p[1] = { cfg->slot };
	char err[1024], *v;
	PGresult *r;

	r = PQexecParams(conn, "SELECT coalesce(wal_status, 'unknown'), coalesce(safe_wal_size::text, 'NULL'), "
	    "active::text FROM pg_replication_slots WHERE slot_name = $1", 1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
		report(cx, strcmp(PQgetvalue(r, 0, 0), "lost") == 0 ? "FAIL" : "ok",
		    "slot: %s, wal_status %s, safe_wal_size %s, active %s%s", cfg->slot, PQgetvalue(r, 0, 0),
		    PQgetvalue(r, 0, 1), PQgetvalue(r, 0, 2),
		    strcmp(PQgetvalue(r, 0, 0), "lost") == 0 ? " (events may have been lost: recreate the slot and reconcile)" : "");
	} else {
		query_value(conn, "SELECT (current_setting('max_replication_slots')::int - "
		    "(SELECT count(*) FROM pg_replication_slots))::text", 0, NULL, &v, err, sizeof(err));
		if (!cfg->create_slot)
			report(cx, "FAIL", "slot: %s does not exist and create_slot = false", cfg->slot);
		else if (v != NULL && atoi(v) <= 0)
			report(cx, "FAIL", "slot: %s does not exist and no replication slot is free "
			    "(raise max_replication_slots)", cfg->slot);
		else
			report(cx, "ok", "slot: %s does not exist (will be created; %s slot(s) free)", cfg->slot,
			    v ? v : "?");
		free(v);
	}
	PQclear(r);
	query_value(conn, "SELECT (current_setting('max_wal_senders')::int - "
	    "(SELECT count(*) FROM pg_stat_replication))::text", 0, NULL, &v, err, sizeof(err));
	report(cx, v != NULL && atoi(v) > 0 ? "ok" : "FAIL", "wal senders: %s free%s", v ? v : "?",
	    v != NULL && atoi(v) > 0 ? "" : " (raise max_wal_senders)");
	free(v);
	query_value(conn, "SELECT current_setting('max_slot_wal_keep_size')", 0, NULL, &v, err,
	    sizeof(err));
	if (v != NULL && strcmp(v, "-1") == 0)
		report(cx, "WARN", "max_slot_wal_keep_size = -1: nothing bounds the WAL a stalled slot retains "
		    "(the disk can fill; set a limit and alert on outboxd_slot_safe_wal_size_bytes)");
	else
		report(cx, "ok", "max_slot_wal_keep_size = %s", v ? v : "?");
	free(v);
}

/*
 * [source] snapshot = pending: which rows a new slot publishes first (the
 * filter is run, so a bad one fails here), or that an earlier snapshot did
 * not finish, or that the slot exists and nothing precedes the stream.
 */
static void
check_snapshot(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg)
{
	char table[600], filter[1024], order[300], err[1024], marker[80], legacy[80];
	char *sql = NULL, *v = NULL;
	const char *p[3] = { cfg->slot, marker, legacy };
	bool slot = false, marked = false;
	PGresult *r;

	if (!cfg->snapshot)
		return;
	obx_snapmark_name(cfg->slot, marker, sizeof(marker));
	/* or the marker an earlier version named with the slot's first 54 characters */
	if (!obx_snapmark_legacy_name(cfg->slot, legacy, sizeof(legacy)))
		snprintf(legacy, sizeof(legacy), "%s", marker);
	r = PQexecParams(conn, "SELECT slot_name = $1 FROM pg_replication_slots WHERE slot_name IN ($1, $2, "
	    "$3)", 3, NULL, p, NULL, NULL, 0);
	for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
		slot = slot || strcmp(PQgetvalue(r, i, 0), "t") == 0;
		marked = marked || strcmp(PQgetvalue(r, i, 0), "f") == 0;
	}
	PQclear(r);
	if (slot && !marked) {
		report(cx, "ok", "snapshot: pending, but slot %s exists: nothing is published before the "
		    "stream (only a slot outboxd creates starts with its pending rows)", cfg->slot);
		return;
	}
	if (obx_snapshot_describe(conn, cfg, table, sizeof(table), filter, sizeof(filter), order,
	    sizeof(order), err, sizeof(err)) != 0) {
		report(cx, "FAIL", "snapshot: %s", err);
		return;
	}
	if (asprintf(&sql, "SELECT count(*)::text FROM (SELECT 1 FROM %s WHERE (%s) LIMIT 1000001) x",
	    table, filter) < 0)
		sql = NULL;
	if (sql == NULL || query_value(conn, sql, 0, NULL, &v, err, sizeof(err)) != 0)
		report(cx, "FAIL", "snapshot: [source] snapshot_filter does not work on %s.%s (WHERE %s): %s",
		    cfg->table_schema, cfg->table_name, filter, sql == NULL ? "out of memory" : err);
	else if (slot)
		report(cx, "WARN", "snapshot: the snapshot of slot %s did not finish (slot %s exists): the "
		    "next start publishes the %s row(s) WHERE %s again, ORDER BY %s, then streams",
		    cfg->slot, marker, strcmp(v, "1000001") == 0 ? "over 1,000,000" : v, filter, order);
	else
		report(cx, "ok", "snapshot: pending: creating slot %s will publish the %s row(s) WHERE %s "
		    "first, ORDER BY %s (one more free replication slot, %s, is used meanwhile)", cfg->slot,
		    strcmp(v, "1000001") == 0 ? "over 1,000,000" : v, filter, order, marker);
	free(v);
	free(sql);
}

/*
 * Failover slots (PostgreSQL 17+): whether the slot is failover-enabled and
 * what the primary can see of the standbys that keep a copy: slot sync
 * workers connected to it (recognised by their application_name, "[cluster_]slotsync
 * worker", unless the standby's primary_conninfo names itself) and the
 * physical slots named in synchronized_standby_slots, which hold a
 * failover slot's changes back until those standbys have them.
 */
static void
check_failover(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg,
    const struct obx_pgfacts *f, bool in_recovery)
{
	const char *p[1] = { cfg->slot };
	char err[1024], ver[32], *v = NULL;
	PGresult *r;
	bool exists, failover, synced;
	long workers;

	if (!f->failover_slots) {
		if (cfg->failover && cfg->failover_set)
			report(cx, "ok", "failover: [source] failover = on is ignored: PostgreSQL %s does not "
			    "synchronize slots to standbys (17 does); a failover loses the slot and the slot "
			    "guard then refuses to go on", obx_pgversion_format(f->version, ver, sizeof(ver)));
		return;
	}
	r = PQexecParams(conn, "SELECT failover, synced FROM pg_replication_slots WHERE slot_name = $1",
	    1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		report(cx, "FAIL", "failover: could not read slot %s: %s", cfg->slot,
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
			report(cx, "ok", "failover: slot %s is synchronized from the primary; it can be used "
			    "here once this server is promoted (outboxd waits until then)", cfg->slot);
		else if (cfg->failover)
			report(cx, "ok", "failover: a hot standby's own slot cannot have failover; outboxd "
			    "enables it on slot %s after this server's promotion", cfg->slot);
		return;
	}
	if (!cfg->failover) {
		report(cx, "ok", "failover: off: a failover to a standby loses slot %s (the slot guard then "
		    "refuses to go on)%s", cfg->slot, failover ? "; outboxd disables failover on it at start" : "");
		return;
	}
	report(cx, "ok", "failover: slot %s %s", cfg->slot, !exists ? "will be created with failover" :
	    failover ? "is failover-enabled" : "is not failover-enabled yet (outboxd enables it at start)");
	query_value(conn, "SELECT count(*)::text FROM pg_stat_activity "
	    "WHERE application_name LIKE '%slotsync worker'", 0, NULL, &v, err, sizeof(err));
	workers = v != NULL ? atol(v) : 0;
	free(v);
	if (workers > 0)
		report(cx, "ok", "failover: %ld slot sync worker(s) connected: standbys keep a copy of "
		    "failover slots", workers);
	else
		report(cx, "WARN", "failover: no standby synchronizes slot %s (no slot sync worker is "
		    "connected; one whose primary_conninfo sets application_name is not recognised): a "
		    "failover would lose it; on the standby set sync_replication_slots = on, "
		    "hot_standby_feedback = on, primary_slot_name and a dbname in primary_conninfo",
		    cfg->slot);
	r = PQexec(conn, "SELECT s.name, r.slot_name IS NOT NULL, coalesce(r.active, false) "
	    "FROM unnest(string_to_array(nullif(replace(current_setting('synchronized_standby_slots'), "
	    "' ', ''), ''), ',')) s(name) "
	    "LEFT JOIN pg_replication_slots r ON r.slot_name = s.name AND r.slot_type = 'physical'");
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		report(cx, "FAIL", "failover: could not read synchronized_standby_slots: %s",
		    obx_pg_result_error_line(r, err, sizeof(err)));
	} else if (PQntuples(r) == 0) {
		report(cx, "WARN", "failover: synchronized_standby_slots is empty: outboxd may publish a "
		    "transaction no standby has received, and after a failover Kafka would hold events "
		    "the new primary never committed (name the standby's physical slot there)");
	}
	for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
		const char *name = PQgetvalue(r, i, 0);

		if (strcmp(PQgetvalue(r, i, 1), "t") != 0)
			report(cx, "WARN", "failover: synchronized_standby_slots names %s, which is no physical "
			    "slot here: failover slots wait for it, outboxd receives nothing", name);
		else if (strcmp(PQgetvalue(r, i, 2), "t") != 0)
			report(cx, "WARN", "failover: physical slot %s (synchronized_standby_slots) is not "
			    "active: failover slots wait until its standby is back", name);
		else
			report(cx, "ok", "failover: physical slot %s (synchronized_standby_slots) is active: "
			    "outboxd receives only what its standby has", name);
	}
	PQclear(r);
}

/* The value of setting name on conn as text (caller frees), or NULL with err set. */
static char *
setting(PGconn *conn, const char *name, char *err, size_t errlen)
{
	const char *p[1] = { name };
	char *v = NULL;

	query_value(conn, "SELECT current_setting($1)", 1, p, &v, err, errlen);
	return v;
}

/*
 * "outboxd check --standby": does the standby at conninfo hold a
 * persistent synchronized copy of the slot, usable after a failover
 * (PostgreSQL 17+)?  A synced copy starts temporary and is dropped at
 * promotion until it becomes persistent, which happens once the primary's
 * slot passes the standby's catalog xmin and restart point.
 */
static void
check_standby(struct check_ctx *cx, PGconn *primary, const struct obx_config *cfg,
    const char *conninfo)
{
	const char *p[1] = { cfg->slot };
	char err[1024], ver[32], safe[1024];
	char *sync = NULL, *feedback = NULL, *pslot = NULL, *listed = NULL, *v = NULL;
	PGconn *sb = NULL;
	PGresult *r = NULL, *pr = NULL;
	bool p_exists, p_failover;

	obx_conninfo_redact(conninfo, safe, sizeof(safe));
	if (PQserverVersion(primary) < 170000) {
		report(cx, "WARN", "standby: failover slots need PostgreSQL 17 or later (primary is %s): "
		    "a failover loses slot %s", obx_pgversion_format(PQserverVersion(primary), ver,
		    sizeof(ver)), cfg->slot);
		return;
	}
	if (obx_pg_connect(conninfo, cfg->password, NULL, NULL, "outboxd check", &sb, err, sizeof(err)) != 0) {
		report(cx, "FAIL", "standby: could not connect to %s: %s", safe, err);
		return;
	}
	query_value(sb, "SELECT pg_is_in_recovery()::text", 0, NULL, &v, err, sizeof(err));
	if (v == NULL || strcmp(v, "true") != 0) {
		report(cx, "FAIL", "standby: %s is not a standby (not in recovery)", safe);
		goto out;
	}
	pr = PQexecParams(primary, "SELECT failover, confirmed_flush_lsn::text FROM pg_replication_slots "
	    "WHERE slot_name = $1", 1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(pr) != PGRES_TUPLES_OK) {
		report(cx, "FAIL", "standby: could not read slot %s on the primary: %s", cfg->slot,
		    obx_pg_result_error_line(pr, err, sizeof(err)));
		goto out;
	}
	p_exists = PQntuples(pr) == 1;
	p_failover = p_exists && strcmp(PQgetvalue(pr, 0, 0), "t") == 0;
	r = PQexecParams(sb, "SELECT synced, temporary, "
	    "invalidation_reason IS NOT NULL OR coalesce(conflicting, false), "
	    "coalesce(confirmed_flush_lsn::text, ''), coalesce(catalog_xmin::text, ''), "
	    "coalesce(restart_lsn::text, ''), coalesce(invalidation_reason, '') "
	    "FROM pg_replication_slots WHERE slot_name = $1", 1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		report(cx, "FAIL", "standby: could not read slot %s there: %s", cfg->slot,
		    obx_pg_result_error_line(r, err, sizeof(err)));
		goto out;
	}
	if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0 &&
	    strcmp(PQgetvalue(r, 0, 1), "f") == 0 && strcmp(PQgetvalue(r, 0, 2), "f") == 0) {
		const char *at = PQgetvalue(r, 0, 3);
		const char *primary_at = p_exists ? PQgetvalue(pr, 0, 1) : "?";

		report(cx, "ok", "standby: ready: it holds a persistent synchronized copy of slot %s at "
		    "%s (the primary's is at %s); a failover there keeps the slot", cfg->slot, at,
		    primary_at);
		goto out;
	}
	if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 2), "t") == 0) {
		report(cx, "FAIL", "standby: not ready: its copy of slot %s is invalidated%s%s; drop it "
		    "there and let it synchronize again", cfg->slot, PQgetvalue(r, 0, 6)[0] ? ": " : "",
		    PQgetvalue(r, 0, 6));
		goto out;
	}
	if (PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0) {
		report(cx, "FAIL", "standby: not ready: its copy of slot %s is temporary (catalog xmin %s, "
		    "restart_lsn %s) and would be dropped at promotion; it becomes persistent once the "
		    "primary's slot passes them, i.e. after the next activity the relay confirms (the standby "
		    "logs \"could not synchronize replication slot\" until then); run this check again, or "
		    "on the standby: SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = '%s'",
		    cfg->slot, PQgetvalue(r, 0, 4), PQgetvalue(r, 0, 5), cfg->slot);
		goto out;
	}
	/* no synchronized copy: name what is missing */
	sync = setting(sb, "sync_replication_slots", err, sizeof(err));
	feedback = setting(sb, "hot_standby_feedback", err, sizeof(err));
	pslot = setting(sb, "primary_slot_name", err, sizeof(err));
	if (pslot != NULL && pslot[0] != '\0') {
		const char *q[1] = { pslot };

		query_value(primary, "SELECT ($1 = ANY (string_to_array(replace(current_setting("
		    "'synchronized_standby_slots'), ' ', ''), ',')))::text", 1, q, &listed, err, sizeof(err));
	}
	if (PQntuples(r) == 1)
		report(cx, "FAIL", "standby: not ready: slot %s there is its own, not a synchronized copy "
		    "(drop it there so the primary's can be synchronized)", cfg->slot);
	else if (!p_exists)
		report(cx, "FAIL", "standby: not ready: slot %s does not exist on the primary yet (outboxd "
		    "creates it at start)", cfg->slot);
	else if (!p_failover)
		report(cx, "FAIL", "standby: not ready: slot %s has failover off on the primary, so no "
		    "standby synchronizes it (set [source] failover = on; outboxd enables it at start)",
		    cfg->slot);
	else if (sync == NULL || strcmp(sync, "on") != 0)
		report(cx, "FAIL", "standby: not ready: sync_replication_slots is %s there (set it on)",
		    sync != NULL ? sync : "unknown");
	else if (pslot == NULL || pslot[0] == '\0')
		report(cx, "FAIL", "standby: not ready: primary_slot_name is not set there (slot "
		    "synchronization needs a physical slot on the primary)");
	else if (feedback == NULL || strcmp(feedback, "on") != 0)
		report(cx, "FAIL", "standby: not ready: hot_standby_feedback is %s there (set it on)",
		    feedback != NULL ? feedback : "unknown");
	else
		report(cx, "FAIL", "standby: not ready: no copy of slot %s there yet (the slot sync worker "
		    "may not have run: check primary_conninfo has a dbname, and the standby's log)", cfg->slot);
	if (pslot != NULL && pslot[0] != '\0' && (listed == NULL || strcmp(listed, "true") != 0))
		report(cx, "WARN", "standby: synchronized_standby_slots on the primary does not name %s "
		    "(the standby's primary_slot_name): outboxd may publish what the standby has not "
		    "received", pslot);
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

/* The topic template as an SQL expression over the outbox's columns; NULL when out of memory. */
static char *
template_sql(PGconn *conn, const char *topic)
{
	struct obx_template tpl;
	char why[256];
	char *out = NULL;
	size_t len = 0;
	FILE *fp;

	if (obx_template_parse(&tpl, topic, why, sizeof(why)) != 0)
		return NULL;
	fp = open_memstream(&out, &len);
	if (fp == NULL) {
		obx_template_reset(&tpl);
		return NULL;
	}
	fputs("''", fp);
	for (size_t i = 0; i < tpl.nparts; i++) {
		const struct obx_template_part *part = &tpl.parts[i];
		char *e;

		if (part->is_column) {
			e = PQescapeIdentifier(conn, part->text, strlen(part->text));
			fprintf(fp, " || %s::text", e ? e : "NULL");
		} else {
			e = PQescapeLiteral(conn, part->text, strlen(part->text));
			fprintf(fp, " || %s", e ? e : "''");
		}
		PQfreemem(e);
	}
	fclose(fp);
	obx_template_reset(&tpl);
	return out;
}

static void
check_kafka(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg, bool has_table)
{
	const struct rd_kafka_metadata *md = NULL;
	rd_kafka_conf_t *conf;
	rd_kafka_resp_err_t e;
	rd_kafka_t *rk;
	char err[512];

	conf = obx_kafka_conf(cfg, err, sizeof(err));
	if (conf == NULL) {
		report(cx, "FAIL", "broker: %s", err);
		return;
	}
	rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (rk == NULL) {
		rd_kafka_conf_destroy(conf);
		report(cx, "FAIL", "broker: could not create a producer: %s", err);
		return;
	}
	e = rd_kafka_metadata(rk, 1, NULL, &md, 10000);
	if (e != RD_KAFKA_RESP_ERR_NO_ERROR) {
		report(cx, "FAIL", "broker: could not reach %s: %s", obx_config_kafka_get(cfg, "bootstrap.servers"),
		    rd_kafka_err2str(e));
		rd_kafka_destroy(rk);
		return;
	}
	report(cx, "ok", "broker: reachable, %d broker(s), %d topic(s)", md->broker_cnt, md->topic_cnt);
	if (has_table) {
		char *expr = template_sql(conn, cfg->topic);
		char *tq = NULL, *sql = NULL;
		int missing = 0, total = 0;
		PGresult *r = NULL;

		tq = PQescapeIdentifier(conn, cfg->table_name, strlen(cfg->table_name));
		if (expr != NULL && tq != NULL) {
			char *sq = PQescapeIdentifier(conn, cfg->table_schema, strlen(cfg->table_schema));

			/* a sample, never the whole outbox (which may hold millions of kept rows) */
			if (sq != NULL && asprintf(&sql, "SELECT DISTINCT %s FROM (SELECT * FROM %s.%s LIMIT 10000) s "
			    "LIMIT 1000", expr, sq, tq) > 0)
				r = PQexec(conn, sql);
			PQfreemem(sq);
		}
		if (r != NULL && PQresultStatus(r) == PGRES_TUPLES_OK) {
			for (int i = 0; i < PQntuples(r); i++) {
				const char *t = PQgetvalue(r, i, 0);
				int found = 0;

				if (PQgetisnull(r, i, 0))
					continue;
				total++;
				for (int j = 0; j < md->topic_cnt && !found; j++)
					found = strcmp(md->topics[j].topic, t) == 0;
				if (!found) {
					report(cx, "WARN", "topic: %s does not exist (create it, or allow auto-creation)", t);
					missing++;
				}
			}
			if (total == 0)
				report(cx, "ok", "topics: the outbox is empty; topic names come from '%s' at run time",
				    cfg->topic);
			else if (missing == 0)
				report(cx, "ok", "topics: all %d topic(s) the outbox's rows map to exist", total);
		} else {
			report(cx, "FAIL", "topics: template '%s' does not fit the outbox's columns: %s", cfg->topic,
			    r ? PQresultErrorMessage(r) : "out of memory");
		}
		PQclear(r);
		free(sql);
		free(expr);
		PQfreemem(tq);
	}
	if (cfg->exactly_once) {
		int parts = -1;

		for (int j = 0; j < md->topic_cnt && parts < 0; j++)
			if (strcmp(md->topics[j].topic, cfg->progress_topic) == 0)
				parts = md->topics[j].partition_cnt;
		if (parts >= 0)
			report(cx, "ok", "exactly-once: progress topic %s exists (%d partition(s))", cfg->progress_topic,
			    parts);
		else
			report(cx, "WARN", "exactly-once: progress topic %s does not exist (create it with "
			    "cleanup.policy=compact, or allow auto-creation)", cfg->progress_topic);
	}
	rd_kafka_metadata_destroy(md);
	rd_kafka_destroy(rk);
}

/* ---- polling mode ([source] mode = poll; README, "Polling mode") ---- */

/*
 * What polling needs instead of a slot: the bookkeeping columns, the right
 * to mark rows, the pending-rows index; the NOTIFY trigger is optional.
 * Returns whether the table and its columns are usable.
 */
static bool
check_poll(struct check_ctx *cx, PGconn *conn, const struct obx_config *cfg)
{
	const char *tp[6] = { cfg->table_schema, cfg->table_name, cfg->col_published_at,
		cfg->col_attempts, cfg->col_last_error, cfg->col_next_attempt_at };
	struct obx_poll_sql sql;
	char err[1024];
	PGresult *res;
	char *v;
	bool ok;

	if (obx_poll_sql_build(&sql, cfg) != 0) {
		report(cx, "FAIL", "polling: out of memory");
		return false;
	}
	res = PQexec(conn, sql.check);
	ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (ok)
		report(cx, "ok", "polling: %s.%s has every mapped column and %s, %s, %s, %s, %s%s%s",
		    cfg->table_schema, cfg->table_name, cfg->col_seq, cfg->col_published_at,
		    cfg->col_attempts, cfg->col_last_error, cfg->col_next_attempt_at,
		    cfg->col_created_at[0] != '\0' ? ", " : "", cfg->col_created_at);
	else
		report(cx, "FAIL", "polling: cannot read %s.%s: %s (apply sql/008_polling.sql, or map the "
		    "columns in [outbox])", cfg->table_schema, cfg->table_name,
		    PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) != NULL ?
		    PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : obx_pg_result_error_line(res, err, sizeof(err)));
	PQclear(res);
	obx_poll_sql_reset(&sql);
	if (!ok)
		return false;
	query_value(conn, "SELECT (has_table_privilege(r, 'SELECT') AND has_column_privilege(r, $3, 'UPDATE') "
	    "AND has_column_privilege(r, $4, 'UPDATE') AND has_column_privilege(r, $5, 'UPDATE') "
	    "AND has_column_privilege(r, $6, 'UPDATE'))::text "
	    "FROM (SELECT (quote_ident($1) || '.' || quote_ident($2))::regclass AS r) t", 6, tp, &v, err,
	    sizeof(err));
	if (v != NULL && strcmp(v, "true") == 0)
		report(cx, "ok", "polling: the role may read the table and mark rows");
	else
		report(cx, "FAIL", "polling: the role may not read the table or update %s, %s, %s, %s "
		    "(sql/008_polling.sql grants it to outboxd)", cfg->col_published_at, cfg->col_attempts,
		    cfg->col_last_error, cfg->col_next_attempt_at);
	free(v);
	query_value(conn, "SELECT count(*)::text FROM pg_index i WHERE i.indrelid = "
	    "(quote_ident($1) || '.' || quote_ident($2))::regclass AND i.indpred IS NOT NULL "
	    "AND pg_get_expr(i.indpred, i.indrelid) LIKE ('%' || quote_ident($3) || ' IS NULL%')", 3, tp, &v, err,
	    sizeof(err));
	if (v != NULL && strcmp(v, "0") != 0)
		report(cx, "ok", "polling: %s partial index(es) on the pending rows", v);
	else
		report(cx, "WARN", "polling: no index WHERE %s IS NULL: every claim scans the table "
		    "(sql/008_polling.sql creates two)", cfg->col_published_at);
	free(v);
	query_value(conn, "SELECT count(*)::text FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = "
	    "(quote_ident($1) || '.' || quote_ident($2))::regclass", 2, tp, &v, err, sizeof(err));
	if (cfg->poll_notify_channel[0] == '\0')
		report(cx, "ok", "polling: every %d ms when idle ([poll] notify_channel is empty)",
		    cfg->poll_interval_ms);
	else if (v != NULL && strcmp(v, "0") != 0)
		report(cx, "ok", "polling: every %d ms when idle, sooner on NOTIFY %s (the table has %s "
		    "trigger(s))", cfg->poll_interval_ms, cfg->poll_notify_channel, v);
	else
		report(cx, "ok", "polling: every %d ms when idle (no trigger: sql/009_polling_notify.sql "
		    "wakes it at each commit)", cfg->poll_interval_ms);
	free(v);
	return true;
}

/* "outboxd status" in polling mode: the pending rows. */
static int
poll_status(PGconn *conn, const struct obx_config *cfg, bool json)
{
	static const char *const names[] = { "pending_rows", "oldest_pending_age_seconds",
		"retrying_rows", "max_attempts" };
	struct obx_poll_sql sql;
	char err[1024];
	PGresult *res;
	int rc = OBX_EXIT_FAILURE;

	if (obx_poll_sql_build(&sql, cfg) != 0) {
		fprintf(stderr, "outboxd: out of memory\n");
		return OBX_EXIT_FAILURE;
	}
	res = PQexec(conn, sql.stats);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
		fprintf(stderr, "outboxd: could not read the pending rows of %s.%s: %s\n", cfg->table_schema,
		    cfg->table_name, obx_pg_result_error_line(res, err, sizeof(err)));
	} else if (json) {
		json_t *o = json_object();
		char *s;

		json_object_set_new(o, "mode", json_string("poll"));
		for (int i = 0; i < 4; i++)
			json_object_set_new(o, names[i], i == 1 ? json_real(strtod(PQgetvalue(res, 0, i), NULL)) :
			    json_integer(strtoll(PQgetvalue(res, 0, i), NULL, 10)));
		s = json_dumps(o, JSON_COMPACT);
		if (s != NULL)
			printf("%s\n", s);
		free(s);
		json_decref(o);
		rc = OBX_EXIT_OK;
	} else {
		printf("%-27s %s\n", "mode", "poll");
		for (int i = 0; i < 4; i++)
			printf("%-27s %s\n", names[i], PQgetvalue(res, 0, i));
		rc = OBX_EXIT_OK;
	}
	PQclear(res);
	obx_poll_sql_reset(&sql);
	return rc;
}

int
obx_cmd_check(const struct obx_config *cfg, const char *standby)
{
	struct check_ctx cx = { 0, 0 };
	const char *tparams[2] = { cfg->table_schema, cfg->table_name };
	const char *cols[] = { cfg->col_id, cfg->col_key, cfg->col_aggregate_type,
		cfg->col_type, cfg->col_payload, cfg->col_headers, cfg->col_timestamp };
	char err[1024], ver[32];
	struct obx_pgfacts facts;
	PGconn *conn;
	char *v;
	bool has_table, in_recovery;
	int rc;

	if (obx_pg_connect(cfg->conninfo, cfg->password, NULL, NULL, "outboxd check", &conn, err, sizeof(err)) != 0) {
		report(&cx, "FAIL", "server: could not connect: %s", err);
		return OBX_EXIT_FAILURE;
	}
	obx_pgversion_format(PQserverVersion(conn), ver, sizeof(ver));
	if (obx_pgfacts_for(PQserverVersion(conn), &facts, err, sizeof(err)) != 0)
		report(&cx, "FAIL", "server: %s", err);
	else
		report(&cx, "ok", "server: reachable, PostgreSQL %s (pgoutput protocol %d%s%s%s)",
		    obx_pgversion_format(facts.version, ver, sizeof(ver)), facts.proto,
		    facts.streaming ? ", streaming" : "", facts.publication_filters ?
		    ", row filters" : "", facts.failover_slots ? ", failover slots" : "");
	query_value(conn, "SELECT pg_is_in_recovery()::text", 0, NULL, &v, err, sizeof(err));
	in_recovery = v != NULL && strcmp(v, "true") == 0;
	free(v);
	if (in_recovery && !facts.standby_decoding) {
		report(&cx, "FAIL", "server: a hot standby (in recovery): PostgreSQL %s cannot decode there "
		    "(16 and later can); point conninfo at the primary", ver);
	} else if (in_recovery) {
		report(&cx, "ok", "server: a hot standby (in recovery): outboxd decodes here; the publication "
		    "comes from the primary");
		query_value(conn, "SELECT current_setting('hot_standby_feedback')", 0, NULL, &v, err,
		    sizeof(err));
		if (v != NULL && strcmp(v, "on") == 0)
			report(&cx, "ok", "hot_standby_feedback: on");
		else
			report(&cx, "WARN", "hot_standby_feedback: %s: the primary may remove catalog rows the "
			    "slot needs, which invalidates it (set it on, with primary_slot_name)", v ? v : err);
		free(v);
	}
	if (cfg->mode == OBX_SOURCE_POLL) {
		/* no slot, publication, wal_level or REPLICATION: the table is read with plain SQL */
		check_kafka(&cx, conn, cfg, check_poll(&cx, conn, cfg));
		goto done;
	}
	if (cfg->messages && !facts.messages)
		report(&cx, "FAIL", "messages: [source] messages = on needs PostgreSQL 14 or later "
		    "(server is %s)", ver);
	if (cfg->streaming && !facts.streaming)
		report(&cx, "WARN", "streaming: [source] streaming = on needs PostgreSQL 14 or later "
		    "(server is %s): large transactions are decoded whole", ver);

	query_value(conn, "SELECT current_setting('wal_level')", 0, NULL, &v, err, sizeof(err));
	if (v != NULL && strcmp(v, "logical") == 0)
		report(&cx, "ok", "wal_level: logical");
	else
		report(&cx, "FAIL", "wal_level: %s (set wal_level = logical and restart the server)",
		    v ? v : err);
	free(v);

	/* managed services: RDS and Aurora grant replication through the rds_replication role
	 * (Cloud SQL and Azure set the REPLICATION attribute itself) */
	query_value(conn, "SELECT rolreplication OR rolsuper OR EXISTS (SELECT 1 FROM pg_roles m "
	    "WHERE m.rolname = 'rds_replication' AND pg_has_role(current_user, m.oid, 'MEMBER')) "
	    "FROM pg_roles WHERE rolname = current_user", 0, NULL, &v, err, sizeof(err));
	if (v != NULL && strcmp(v, "t") == 0)
		report(&cx, "ok", "role: may replicate");
	else
		report(&cx, "FAIL", "role: lacks REPLICATION (ALTER ROLE ... REPLICATION; on RDS and Aurora "
		    "GRANT rds_replication TO ...)");
	free(v);

	rc = query_value(conn,
	    "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	    "WHERE n.nspname = $1 AND c.relname = $2", 2, tparams, &v, err, sizeof(err));
	if (rc != 0 && rc != OBX_ENOENT) {
		report(&cx, "FAIL", "table: could not look up %s.%s: %s", cfg->table_schema,
		    cfg->table_name, err);
	} else if (v == NULL && cfg->messages) {
		report(&cx, "ok", "table: %s.%s does not exist: logical decoding messages with prefix '%s' "
		    "only", cfg->table_schema, cfg->table_name, cfg->message_prefix);
	} else if (v == NULL) {
		report(&cx, "FAIL", "table: %s.%s does not exist", cfg->table_schema, cfg->table_name);
	} else {
		report(&cx, "ok", "table: %s.%s exists", cfg->table_schema, cfg->table_name);
		for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
			const char *p[3] = { cfg->table_schema, cfg->table_name, cols[i] };
			char *t;

			if (cols[i][0] == '\0')
				continue;
			query_value(conn,
			    "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
			    "WHERE a.attrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass "
			    "AND a.attname = $3 AND a.attnum > 0 AND NOT a.attisdropped",
			    3, p, &t, err, sizeof(err));
			if (t == NULL)
				report(&cx, "FAIL", "column: %s is missing from the outbox table",
				    cols[i]);
			else
				report(&cx, "ok", "column: %s (%s)", cols[i], t);
			free(t);
		}
	}
	has_table = v != NULL;
	free(v);
	check_publication(&cx, conn, cfg, has_table, in_recovery);

	check_slot(&cx, conn, cfg);
	check_snapshot(&cx, conn, cfg);
	check_failover(&cx, conn, cfg, &facts, in_recovery);
	if (standby != NULL)
		check_standby(&cx, conn, cfg, standby);
	check_kafka(&cx, conn, cfg, has_table);
done:
	PQfinish(conn);
	printf("%d failed, %d warnings\n", cx.failures, cx.warnings);
	return cx.failures == 0 ? OBX_EXIT_OK : OBX_EXIT_FAILURE;
}

int
obx_cmd_status(const struct obx_config *cfg, bool json)
{
	static const char *const names[] = { "slot", "active", "active_pid", "restart_lsn",
		"confirmed_flush_lsn", "wal_status", "safe_wal_size", "server_wal_lsn", "lag_bytes" };
	const char *p[1] = { cfg->slot };
	char err[1024];
	PGconn *conn;
	PGresult *res;
	int rc = OBX_EXIT_FAILURE;

	if (obx_pg_connect(cfg->conninfo, cfg->password, NULL, NULL, "outboxd status", &conn, err, sizeof(err)) != 0) {
		fprintf(stderr, "outboxd: could not connect: %s\n", err);
		return OBX_EXIT_FAILURE;
	}
	if (cfg->mode == OBX_SOURCE_POLL) {
		rc = poll_status(conn, cfg, json);
		PQfinish(conn);
		return rc;
	}
	res = PQexecParams(conn,
	    "SELECT slot_name, active, active_pid, restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, "
	    "w.lsn, pg_wal_lsn_diff(w.lsn, confirmed_flush_lsn)::bigint "
	    "FROM pg_replication_slots, (SELECT CASE WHEN pg_is_in_recovery() "
	    "THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END AS lsn) w "
	    "WHERE slot_name = $1", 1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		fprintf(stderr, "outboxd: could not read slot %s: %s\n", cfg->slot,
		    obx_pg_result_error_line(res, err, sizeof(err)));
	} else if (PQntuples(res) == 0) {
		fprintf(stderr, "outboxd: slot %s does not exist\n", cfg->slot);
	} else if (json) {
		json_t *o = json_object();
		char *s;

		for (int i = 0; i < PQnfields(res); i++) {
			json_t *val;

			if (PQgetisnull(res, 0, i))
				val = json_null();
			else if (i == 1)
				val = json_boolean(strcmp(PQgetvalue(res, 0, i), "t") == 0);
			else if (i == 2 || i == 6 || i == 8)
				val = json_integer(strtoll(PQgetvalue(res, 0, i), NULL, 10));
			else
				val = json_string(PQgetvalue(res, 0, i));
			json_object_set_new(o, names[i], val);
		}
		s = json_dumps(o, JSON_COMPACT);
		if (s != NULL)
			printf("%s\n", s);
		free(s);
		json_decref(o);
		rc = OBX_EXIT_OK;
	} else {
		for (int i = 0; i < PQnfields(res); i++)
			printf("%-20s %s\n", names[i], PQgetisnull(res, 0, i) ? "-" : PQgetvalue(res, 0, i));
		rc = OBX_EXIT_OK;
	}
	PQclear(res);
	PQfinish(conn);
	return rc;
}
