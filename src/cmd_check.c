/*
 * cmd_check.c - "outboxd check" (preflight) and "outboxd status".
 * Both use an ordinary (non-replication) connection and only read.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "obx/cli.h"
#include "obx/pgutil.h"

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

/* Runs a one-row, one-column query with text parameters; returns a malloc'd value or NULL. */
static char *
query_value(PGconn *conn, const char *sql, int nparams, const char *const *params,
    char *err, size_t errlen)
{
	PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
	char *v = NULL;

	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		obx_pg_result_error_line(res, err, errlen);
	} else if (PQntuples(res) > 0 && !PQgetisnull(res, 0, 0)) {
		v = strdup(PQgetvalue(res, 0, 0));
	} else {
		err[0] = '\0';
	}
	PQclear(res);
	return v;
}

int
obx_cmd_check(const struct obx_config *cfg)
{
	struct check_ctx cx = { 0, 0 };
	const char *tparams[2] = { cfg->table_schema, cfg->table_name };
	const char *cols[] = { cfg->col_id, cfg->col_key, cfg->col_aggregate_type,
		cfg->col_type, cfg->col_payload, cfg->col_headers, cfg->col_timestamp };
	char err[1024], ver[32];
	PGconn *conn;
	char *v;

	conn = obx_pg_connect(cfg->conninfo, NULL, NULL, "outboxd check");
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK) {
		report(&cx, "FAIL", "server: could not connect: %s",
		    conn ? obx_pg_error_line(conn, err, sizeof(err)) : "out of memory");
		PQfinish(conn);
		return OBX_EXIT_FAILURE;
	}
	snprintf(ver, sizeof(ver), "%d", PQserverVersion(conn));
	report(&cx, PQserverVersion(conn) >= 100000 ? "ok" : "FAIL",
	    "server: reachable, version %s%s", ver,
	    PQserverVersion(conn) >= 100000 ? "" : " (pgoutput needs 10 or later)");

	v = query_value(conn, "SELECT current_setting('wal_level')", 0, NULL, err, sizeof(err));
	if (v != NULL && strcmp(v, "logical") == 0)
		report(&cx, "ok", "wal_level: logical");
	else
		report(&cx, "FAIL", "wal_level: %s (set wal_level = logical and restart the server)",
		    v ? v : err);
	free(v);

	v = query_value(conn, "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user",
	    0, NULL, err, sizeof(err));
	if (v != NULL && strcmp(v, "t") == 0)
		report(&cx, "ok", "role: may replicate");
	else
		report(&cx, "FAIL", "role: lacks REPLICATION (ALTER ROLE ... REPLICATION)");
	free(v);

	v = query_value(conn,
	    "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	    "WHERE n.nspname = $1 AND c.relname = $2", 2, tparams, err, sizeof(err));
	if (v == NULL) {
		report(&cx, "FAIL", "table: %s.%s does not exist", cfg->table_schema, cfg->table_name);
	} else {
		report(&cx, "ok", "table: %s.%s exists", cfg->table_schema, cfg->table_name);
		for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
			const char *p[3] = { cfg->table_schema, cfg->table_name, cols[i] };
			char *t;

			if (cols[i][0] == '\0')
				continue;
			t = query_value(conn,
			    "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
			    "WHERE a.attrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass "
			    "AND a.attname = $3 AND a.attnum > 0 AND NOT a.attisdropped",
			    3, p, err, sizeof(err));
			if (t == NULL)
				report(&cx, "FAIL", "column: %s is missing from the outbox table",
				    cols[i]);
			else
				report(&cx, "ok", "column: %s (%s)", cols[i], t);
			free(t);
		}
	}
	free(v);

	{
		const char *p[1] = { cfg->slot };

		v = query_value(conn, "SELECT coalesce(wal_status, 'unknown') FROM pg_replication_slots "
		    "WHERE slot_name = $1", 1, p, err, sizeof(err));
		if (v == NULL)
			report(&cx, cfg->create_slot ? "ok" : "FAIL",
			    "slot: %s does not exist%s", cfg->slot,
			    cfg->create_slot ? " (will be created)" : " and create_slot = false");
		else
			report(&cx, strcmp(v, "lost") == 0 ? "FAIL" : "ok",
			    "slot: %s, wal_status %s", cfg->slot, v);
		free(v);
	}

	PQfinish(conn);
	printf("%d failed, %d warnings\n", cx.failures, cx.warnings);
	return cx.failures == 0 ? OBX_EXIT_OK : OBX_EXIT_FAILURE;
}

int
obx_cmd_status(const struct obx_config *cfg, bool json)
{
	static const char *const names[] = { "slot", "active", "active_pid", "restart_lsn",
		"confirmed_flush_lsn", "wal_status", "server_wal_lsn", "lag_bytes" };
	const char *p[1] = { cfg->slot };
	char err[1024];
	PGconn *conn;
	PGresult *res;
	int rc = OBX_EXIT_FAILURE;

	conn = obx_pg_connect(cfg->conninfo, NULL, NULL, "outboxd status");
	if (conn == NULL || PQstatus(conn) != CONNECTION_OK) {
		fprintf(stderr, "outboxd: could not connect: %s\n",
		    conn ? obx_pg_error_line(conn, err, sizeof(err)) : "out of memory");
		PQfinish(conn);
		return OBX_EXIT_FAILURE;
	}
	res = PQexecParams(conn,
	    "SELECT slot_name, active, active_pid, restart_lsn, confirmed_flush_lsn, wal_status, "
	    "pg_current_wal_lsn(), pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
	    "FROM pg_replication_slots WHERE slot_name = $1", 1, NULL, p, NULL, NULL, 0);
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
			else if (i == 2 || i == 7)
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
