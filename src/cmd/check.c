/*
 * cmd/check.c - "outboxd check" (preflight): the server, the role, the
 * outbox table and its columns, the publication, or polling mode's table;
 * then the slot, the snapshot, failover and a standby (check_slot.c) and
 * the broker and the topics (check_kafka.c).  Uses an ordinary
 * (non-replication) connection and only reads.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "obx/cmd/check_int.h"
#include "obx/cmd/cli.h"
#include "obx/core/config.h"
#include "obx/core/err.h"
#include "obx/core/kafkacompat.h"
#include "obx/core/tables.h"
#include "obx/core/template.h"
#include "obx/pg/tables.h"
#include "obx/pg/util.h"
#include "obx/run/poll.h"

void
obx_check_report(struct obx_check *cx, const char *verdict, const char *fmt, ...)
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

int
obx_check_query_value(PGconn *conn, const char *sql, int nparams, const char *const *params, char **out,
    char *errbuf, size_t errlen)
{
	PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	int r = 0;

	*out = NULL;
	errbuf[0] = '\0';
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		obx_pg_result_error_line(res, errbuf, errlen);
		r = OBX_EIO;
	} else if (PQntuples(res) == 0 || PQgetisnull(res, 0, 0)) {
		r = OBX_ENOENT;
	} else if ((*out = strdup(PQgetvalue(res, 0, 0))) == NULL) {
		snprintf(errbuf, errlen, "%s", obx_strerror(OBX_ENOMEM));
		r = OBX_ENOMEM;
	}
	PQclear(res);
	return r;
}


long long
obx_check_count(const char *v)
{
	long long n;

	if (v == NULL || obx_parse_int(v, LLONG_MIN, LLONG_MAX, &n) != 0)
		return 0;
	return n;
}

/*
 * Fails each mapped column the publication's column list hides while the
 * table has it: the columns and the rule by which the relay refuses to start.
 */
static void
check_column_list(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, const char *const *params)
{
	struct obx_names cols = { 0 };
	char *list = NULL, *sql = NULL;
	PGresult *r = NULL;
	char err[1024];

	if (obx_config_mapped_columns(cfg, &cols) != 0 || obx_pg_literal_list(conn, &cols, &list) != 0 ||
	    asprintf(&sql,
	        "SELECT m FROM pg_publication_tables t, unnest(ARRAY[%s]::name[]) m "
	        "WHERE t.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3 AND t.attnames IS NOT NULL "
	        "AND NOT m = ANY(t.attnames) AND m IN (SELECT attname FROM pg_attribute "
	        "WHERE attrelid = (quote_ident($2) || '.' || quote_ident($3))::regclass "
	        "AND attnum > 0 AND NOT attisdropped)",
	        list) < 0) {
		sql = NULL;
		obx_check_report(cx, "FAIL", "publication: could not check its column list: out of memory");
		goto out;
	}
	r = PQexecParams(conn, sql, 3, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		obx_check_report(cx, "FAIL", "publication: could not read the column list of %s: %s",
		    cfg->publication, obx_pg_result_error_line(r, err, sizeof(err)));
		goto out;
	}
	for (int i = 0; i < PQntuples(r); i++)
		obx_check_report(cx, "FAIL", "publication: %s's column list hides the mapped column %s",
		    cfg->publication, PQgetvalue(r, i, 0));
out:
	PQclear(r);
	free(sql);
	free(list);
	obx_names_reset(&cols);
}

static void
check_publication(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool has_table,
    bool in_recovery)
{
	const char *p[4] = { cfg->publication, cfg->table_schema, cfg->table_name, NULL };
	char err[1024], *v;
	PGresult *r;
	int rc;

	rc = obx_check_query_value(conn, "SELECT pubinsert::text FROM pg_publication WHERE pubname = $1", 1, p, &v,
	    err, sizeof(err));
	if (rc != 0 && rc != OBX_ENOENT) {
		obx_check_report(cx, "FAIL", "publication: could not read %s: %s", cfg->publication, err);
		return;
	}
	if (rc == OBX_ENOENT && in_recovery) {
		obx_check_report(cx, "FAIL",
		    "publication: %s does not exist and this hot standby cannot create it "
		    "(run sql/002_publication.sql on the primary)",
		    cfg->publication);
		return;
	}
	if (rc == OBX_ENOENT) {
		obx_check_report(cx, cfg->create_publication ? "ok" : "FAIL", "publication: %s does not exist%s",
		    cfg->publication,
		    cfg->create_publication ?
		        " (will be created)" :
		        " and create_publication = false (run sql/002_publication.sql as the table owner)");
		return;
	}
	if (strcmp(v, "true") != 0)
		obx_check_report(cx, "FAIL",
		    "publication: %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
		    cfg->publication, cfg->publication);
	free(v);
	if (!has_table) {
		obx_check_report(cx, "ok", "publication: %s exists (messages only: its tables do not matter)",
		    cfg->publication);
		return;
	}
	/* row filters (pg_publication_tables.rowfilter) arrive in PostgreSQL 15 */
	r = PQexecParams(conn,
	    obx_pg_facts(conn).publication_filters ?
	        "SELECT rowfilter IS NOT NULL "
	        "FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3" :
	        "SELECT false FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
	    3, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		obx_check_report(cx, "FAIL", "publication: could not read %s: %s", cfg->publication,
		    obx_pg_result_error_line(r, err, sizeof(err)));
		PQclear(r);
		return;
	}
	if (PQntuples(r) == 0) {
		obx_check_report(cx, "FAIL",
		    "publication: %s does not publish %s.%s (or publishes its partitions "
		    "without publish_via_partition_root)",
		    cfg->publication, cfg->table_schema, cfg->table_name);
		PQclear(r);
		return;
	}
	if (strcmp(PQgetvalue(r, 0, 0), "t") == 0)
		obx_check_report(cx, "FAIL",
		    "publication: %s has a row filter: filtered events would never be published",
		    cfg->publication);
	PQclear(r);
	if (obx_pg_facts(conn).publication_filters)
		check_column_list(cx, conn, cfg, p);
	obx_check_report(cx, "ok", "publication: %s publishes inserts of %s.%s", cfg->publication,
	    cfg->table_schema, cfg->table_name);
}

/* ---- polling mode ([source] mode = poll; README, "Polling mode") ---- */

/*
 * What polling needs instead of a slot: the bookkeeping columns, the right
 * to mark rows, the pending-rows index; the NOTIFY trigger is optional.
 * Returns 0 when the table and its columns are usable, else OBX_ECONFIG or
 * OBX_ENOMEM (each with its FAIL line).
 */
static int
check_poll(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg)
{
	const char *tp[6] = { cfg->table_schema, cfg->table_name, cfg->col_published_at, cfg->col_attempts,
		cfg->col_last_error, cfg->col_next_attempt_at };
	struct obx_poll_sql sql;
	char err[1024];
	PGresult *res;
	char *v;
	int r;

	if (obx_poll_sql_build(&sql, cfg) != 0) {
		obx_check_report(cx, "FAIL", "polling: out of memory");
		return OBX_ENOMEM;
	}
	res = PQexec(conn, sql.check);
	r = PQresultStatus(res) == PGRES_TUPLES_OK ? 0 : OBX_ECONFIG;
	if (r == 0)
		obx_check_report(cx, "ok", "polling: %s.%s has every mapped column and %s, %s, %s, %s, %s%s%s",
		    cfg->table_schema, cfg->table_name, cfg->col_seq, cfg->col_published_at, cfg->col_attempts,
		    cfg->col_last_error, cfg->col_next_attempt_at, cfg->col_created_at[0] != '\0' ? ", " : "",
		    cfg->col_created_at);
	else
		obx_check_report(cx, "FAIL",
		    "polling: cannot read %s.%s: %s (apply sql/008_polling.sql, or map the "
		    "columns in [outbox])",
		    cfg->table_schema, cfg->table_name,
		    PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) != NULL ?
		        PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) :
		        obx_pg_result_error_line(res, err, sizeof(err)));
	PQclear(res);
	obx_poll_sql_reset(&sql);
	if (r != 0)
		return r;
	obx_check_query_value(conn,
	    "SELECT (has_table_privilege(r, 'SELECT') AND has_column_privilege(r, $3, 'UPDATE') "
	    "AND has_column_privilege(r, $4, 'UPDATE') AND has_column_privilege(r, $5, 'UPDATE') "
	    "AND has_column_privilege(r, $6, 'UPDATE'))::text "
	    "FROM (SELECT (quote_ident($1) || '.' || quote_ident($2))::regclass AS r) t",
	    6, tp, &v, err, sizeof(err));
	if (v != NULL && strcmp(v, "true") == 0)
		obx_check_report(cx, "ok", "polling: the role may read the table and mark rows");
	else
		obx_check_report(cx, "FAIL",
		    "polling: the role may not read the table or update %s, %s, %s, %s "
		    "(sql/008_polling.sql grants it to outboxd)",
		    cfg->col_published_at, cfg->col_attempts, cfg->col_last_error, cfg->col_next_attempt_at);
	free(v);
	obx_check_query_value(conn,
	    "SELECT count(*)::text FROM pg_index i WHERE i.indrelid = "
	    "(quote_ident($1) || '.' || quote_ident($2))::regclass AND i.indpred IS NOT NULL "
	    "AND pg_get_expr(i.indpred, i.indrelid) LIKE ('%' || quote_ident($3) || ' IS NULL%')",
	    3, tp, &v, err, sizeof(err));
	if (v != NULL && strcmp(v, "0") != 0)
		obx_check_report(cx, "ok", "polling: %s partial index(es) on the pending rows", v);
	else
		obx_check_report(cx, "WARN",
		    "polling: no index WHERE %s IS NULL: every claim scans the table "
		    "(sql/008_polling.sql creates two)",
		    cfg->col_published_at);
	free(v);
	obx_check_query_value(conn,
	    "SELECT count(*)::text FROM pg_trigger WHERE NOT tgisinternal AND tgrelid = "
	    "(quote_ident($1) || '.' || quote_ident($2))::regclass",
	    2, tp, &v, err, sizeof(err));
	if (cfg->poll_notify_channel[0] == '\0')
		obx_check_report(cx, "ok", "polling: every %d ms when idle ([poll] notify_channel is empty)",
		    cfg->poll_interval_ms);
	else if (v != NULL && strcmp(v, "0") != 0)
		obx_check_report(cx, "ok",
		    "polling: every %d ms when idle, sooner on NOTIFY %s (the table has %s "
		    "trigger(s))",
		    cfg->poll_interval_ms, cfg->poll_notify_channel, v);
	else
		obx_check_report(cx, "ok",
		    "polling: every %d ms when idle (no trigger: sql/009_polling_notify.sql "
		    "wakes it at each commit)",
		    cfg->poll_interval_ms);
	free(v);
	return 0;
}

void
obx_check_columns(struct obx_check *cx, PGconn *conn, const struct obx_config *cfg, bool name_table)
{
	struct obx_names cols = { 0 };
	char err[1024], where[2 * 64 + 8] = "";

	if (name_table)
		snprintf(where, sizeof(where), " of %s.%s", cfg->table_schema, cfg->table_name);
	/* what the event builder reads: the topic template's columns, not a fixed list */
	if (obx_config_mapped_columns(cfg, &cols) != 0) {
		obx_check_report(cx, "FAIL", "column: out of memory");
		obx_names_reset(&cols);
		return;
	}
	for (size_t i = 0; i < cols.n; i++) {
		const char *p[3] = { cfg->table_schema, cfg->table_name, cols.v[i] };
		char *t;

		obx_check_query_value(conn,
		    "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
		    "WHERE a.attrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass "
		    "AND a.attname = $3 AND a.attnum > 0 AND NOT a.attisdropped",
		    3, p, &t, err, sizeof(err));
		if (t == NULL)
			obx_check_report(cx, "FAIL", "column: %s is missing from the outbox table%s", cols.v[i],
			    where);
		else
			obx_check_report(cx, "ok", "column: %s (%s)%s", cols.v[i], t, where);
		free(t);
	}
	obx_names_reset(&cols);
}

int
obx_cmd_check(const struct obx_config *cfg, const char *standby)
{
	struct obx_check cx = { 0, 0 };
	const char *tparams[2] = { cfg->table_schema, cfg->table_name };
	char err[1024], ver[32];
	struct obx_pgfacts facts;
	struct obx_pg_tables tl;
	const struct obx_table_pat *e;
	PGconn *conn;
	char *v;
	bool has_table, in_recovery;
	int rc;

	/* the library before the servers: it is what it is, whichever server answers */
	if (obx_kafka_scram_too_old(cfg, (unsigned)rd_kafka_version(), err, sizeof(err)))
		obx_check_report(&cx, "WARN", "broker: %s", err);
	if (obx_pg_connect(cfg->conninfo, cfg->password, NULL, NULL, "outboxd check", &conn, err, sizeof(err)) !=
	    0) {
		obx_check_report(&cx, "FAIL", "server: could not connect: %s", err);
		return OBX_EXIT_FAILURE;
	}
	obx_pgversion_format(PQserverVersion(conn), ver, sizeof(ver));
	if (obx_pgfacts_for(PQserverVersion(conn), &facts, err, sizeof(err)) != 0)
		obx_check_report(&cx, "FAIL", "server: %s", err);
	else
		obx_check_report(&cx, "ok", "server: reachable, PostgreSQL %s (pgoutput protocol %d%s%s%s)",
		    obx_pgversion_format(facts.version, ver, sizeof(ver)), facts.proto,
		    facts.streaming ? ", streaming" : "", facts.publication_filters ? ", row filters" : "",
		    facts.failover_slots ? ", failover slots" : "");
	obx_check_query_value(conn, "SELECT pg_is_in_recovery()::text", 0, NULL, &v, err, sizeof(err));
	in_recovery = v != NULL && strcmp(v, "true") == 0;
	free(v);
	if (in_recovery && !facts.standby_decoding) {
		obx_check_report(&cx, "FAIL",
		    "server: a hot standby (in recovery): PostgreSQL %s cannot decode there "
		    "(16 and later can); point conninfo at the primary",
		    ver);
	} else if (in_recovery) {
		obx_check_report(&cx, "ok",
		    "server: a hot standby (in recovery): outboxd decodes here; the publication "
		    "comes from the primary");
		obx_check_query_value(conn, "SELECT current_setting('hot_standby_feedback')", 0, NULL, &v, err,
		    sizeof(err));
		if (v != NULL && strcmp(v, "on") == 0)
			obx_check_report(&cx, "ok", "hot_standby_feedback: on");
		else
			obx_check_report(&cx, "WARN",
			    "hot_standby_feedback: %s: the primary may remove catalog rows the "
			    "slot needs, which invalidates it (set it on, with primary_slot_name)",
			    v ? v : err);
		free(v);
	}
	if (cfg->mode == OBX_SOURCE_POLL) {
		/* no slot, publication, wal_level or REPLICATION: the table is read with plain SQL */
		if (!obx_tables_several(cfg)) {
			obx_check_kafka(&cx, conn, cfg, check_poll(&cx, conn, cfg) == 0);
			goto done;
		}
		/* several tables: each table polled, in its mapping; the topics are not sampled */
		if (obx_pg_tables_read(conn, cfg, &tl, err, sizeof(err)) != 0)
			obx_check_report(&cx, "FAIL", "tables: could not read the tables: %s", err);
		else if (tl.n == 0)
			obx_check_report(&cx, obx_tables_wild(cfg) ? "WARN" : "FAIL",
			    "tables: no table of [source] table exists yet");
		for (size_t next = 0; (e = obx_tables_next_missing(cfg, &next, obx_pg_tables_has, &tl)) != NULL;)
			obx_check_report(&cx, "FAIL", "table: %s.%s does not exist", e->schema, e->name);
		for (size_t i = 0; i < tl.n; i++) {
			struct obx_config view;

			obx_tables_view(cfg, tl.t[i].mapping, tl.t[i].schema, tl.t[i].name, &view);
			obx_check_report(&cx, "ok", "table: %s.%s (mapping: [%s])", tl.t[i].schema, tl.t[i].name,
			    tl.t[i].mapping > 0 ? cfg->overrides[tl.t[i].mapping - 1].section : "outbox");
			(void)check_poll(&cx, conn, &view);
		}
		obx_pg_tables_reset(&tl);
		obx_check_kafka(&cx, conn, cfg, false);
		goto done;
	}
	if (cfg->messages && !facts.messages)
		obx_check_report(&cx, "FAIL",
		    "messages: [source] messages = on needs PostgreSQL 14 or later "
		    "(server is %s)",
		    ver);
	if (cfg->streaming && !facts.streaming)
		obx_check_report(&cx, "WARN",
		    "streaming: [source] streaming = on needs PostgreSQL 14 or later "
		    "(server is %s): large transactions are decoded whole",
		    ver);

	obx_check_query_value(conn, "SELECT current_setting('wal_level')", 0, NULL, &v, err, sizeof(err));
	if (v != NULL && strcmp(v, "logical") == 0)
		obx_check_report(&cx, "ok", "wal_level: logical");
	else
		obx_check_report(&cx, "FAIL", "wal_level: %s (set wal_level = logical and restart the server)",
		    v ? v : err);
	free(v);

	/* managed services: RDS and Aurora grant replication through the rds_replication role
	 * (Cloud SQL and Azure set the REPLICATION attribute itself) */
	obx_check_query_value(conn,
	    "SELECT rolreplication OR rolsuper OR EXISTS (SELECT 1 FROM pg_roles m "
	    "WHERE m.rolname = 'rds_replication' AND pg_has_role(current_user, m.oid, 'MEMBER')) "
	    "FROM pg_roles WHERE rolname = current_user",
	    0, NULL, &v, err, sizeof(err));
	if (v != NULL && strcmp(v, "t") == 0)
		obx_check_report(&cx, "ok", "role: may replicate");
	else
		obx_check_report(&cx, "FAIL",
		    "role: lacks REPLICATION (ALTER ROLE ... REPLICATION; on RDS and Aurora "
		    "GRANT rds_replication TO ...)");
	free(v);

	if (obx_tables_several(cfg)) {
		has_table = obx_check_tables(&cx, conn, cfg, in_recovery);
		goto slot;
	}
	rc = obx_check_query_value(conn,
	    "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	    "WHERE n.nspname = $1 AND c.relname = $2",
	    2, tparams, &v, err, sizeof(err));
	if (rc != 0 && rc != OBX_ENOENT) {
		obx_check_report(&cx, "FAIL", "table: could not look up %s.%s: %s", cfg->table_schema,
		    cfg->table_name, err);
	} else if (v == NULL && cfg->messages) {
		obx_check_report(&cx, "ok",
		    "table: %s.%s does not exist: logical decoding messages with prefix '%s' "
		    "only",
		    cfg->table_schema, cfg->table_name, cfg->message_prefix);
	} else if (v == NULL) {
		obx_check_report(&cx, "FAIL", "table: %s.%s does not exist", cfg->table_schema, cfg->table_name);
	} else {
		obx_check_report(&cx, "ok", "table: %s.%s exists", cfg->table_schema, cfg->table_name);
		obx_check_columns(&cx, conn, cfg, false);
	}
	has_table = v != NULL;
	free(v);
	check_publication(&cx, conn, cfg, has_table, in_recovery);
slot:
	obx_check_slot(&cx, conn, cfg);
	obx_check_snapshot(&cx, conn, cfg);
	obx_check_failover(&cx, conn, cfg, &facts, in_recovery);
	if (standby != NULL)
		obx_check_standby(&cx, conn, cfg, standby);
	/* with several tables, the topics of each table's rows are not sampled */
	obx_check_kafka(&cx, conn, cfg, has_table && !obx_tables_several(cfg));
done:
	PQfinish(conn);
	printf("%d failed, %d warnings\n", cx.failures, cx.warnings);
	return cx.failures == 0 ? OBX_EXIT_OK : OBX_EXIT_FAILURE;
}
