/*
 * cmd/status.c - "outboxd status": the slot as the server sees it (or, in
 * polling mode, the pending rows), as text or one JSON object.  Uses an
 * ordinary (non-replication) connection and only reads.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <math.h>

#include "obx/cmd/cli.h"
#include "obx/core/err.h"
#include "obx/core/tables.h"
#include "obx/pg/tables.h"
#include "obx/pg/util.h"
#include "obx/run/poll.h"

/*
 * The number in row, col of res as JSON: an integer, or a real unless
 * integer; null when it is not one (these queries print numbers).
 */
static json_t *
json_number(const PGresult *res, int row, int col, bool integer)
{
	int64_t n;
	double d;

	if (integer)
		return obx_pg_int64(res, row, col, &n) == 0 ? json_integer(n) : json_null();
	return obx_pg_double(res, row, col, &d) == 0 ? json_real(d) : json_null();
}

/* The four figures of the polling statistics of cfg's table into v (a number, or NAN).  Returns 0 or -1. */
static int
table_stats(PGconn *conn, const struct obx_config *cfg, double v[4])
{
	struct obx_poll_sql sql;
	char err[1024];
	PGresult *res;
	int rc = -1;

	if (obx_poll_sql_build(&sql, cfg) != 0) {
		fprintf(stderr, "outboxd: out of memory\n");
		return -1;
	}
	res = PQexec(conn, sql.stats);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
		fprintf(stderr, "outboxd: could not read the pending rows of %s.%s: %s\n", cfg->table_schema,
		    cfg->table_name, obx_pg_result_error_line(res, err, sizeof(err)));
	} else {
		for (int i = 0; i < 4; i++)
			if (obx_pg_double(res, 0, i, &v[i]) != 0)
				v[i] = NAN;
		rc = 0;
	}
	PQclear(res);
	obx_poll_sql_reset(&sql);
	return rc;
}

static json_t *
json_figure(double v, bool integer)
{
	if (isnan(v))
		return json_null();
	return integer ? json_integer((json_int_t)v) : json_real(v);
}

static void
print_figure(const char *name, double v, bool integer)
{
	if (isnan(v))
		printf("%-27s\n", name);
	else if (integer)
		printf("%-27s %.0f\n", name, v);
	else
		printf("%-27s %.3f\n", name, v);
}

/*
 * "outboxd status" in polling mode: the pending rows; with several tables their sums (the
 * oldest age and the most attempts: maxima) and each table's.
 */
static int
poll_status(PGconn *conn, const struct obx_config *cfg, bool json)
{
	static const char *const names[] = { "pending_rows", "oldest_pending_age_seconds", "retrying_rows",
		"max_attempts" };
	double all[4] = { 0, 0, 0, 0 }, (*each)[4] = NULL;
	struct obx_pg_tables tl = { 0 };
	char err[1024];
	size_t n = 1;
	int rc = OBX_EXIT_FAILURE;

	if (obx_tables_several(cfg)) {
		if (obx_pg_tables_read(conn, cfg, &tl, err, sizeof(err)) != 0) {
			fprintf(stderr, "outboxd: could not read the outbox tables: %s\n", err);
			goto out;
		}
		n = tl.n;
	}
	if ((each = calloc(n ? n : 1, sizeof(*each))) == NULL) {
		fprintf(stderr, "outboxd: out of memory\n");
		goto out;
	}
	for (size_t t = 0; t < n; t++) {
		struct obx_config view;

		if (obx_tables_several(cfg))
			obx_tables_view(cfg, tl.t[t].mapping, tl.t[t].schema, tl.t[t].name, &view);
		else
			view = *cfg;
		if (table_stats(conn, &view, each[t]) != 0) {
			/* a table a pattern matches may be half set up or just dropped: the others
			 * still count (as the relay does); one named in [source] table fails status */
			if (!obx_tables_may_leave_out(cfg, view.table_schema, view.table_name))
				goto out;
			for (int i = 0; i < 4; i++)
				each[t][i] = NAN;
			continue;
		}
		for (int i = 0; i < 4; i++)
			all[i] = isnan(each[t][i]) ? all[i] :
			    i % 2 == 0             ? all[i] + each[t][i] :
			                             (each[t][i] > all[i] ? each[t][i] : all[i]);
	}
	if (json) {
		json_t *o = json_object(), *ts = json_array();
		char *s;

		json_object_set_new(o, "mode", json_string("poll"));
		for (int i = 0; i < 4; i++)
			json_object_set_new(o, names[i], json_figure(all[i], i != 1));
		for (size_t t = 0; t < n && obx_tables_several(cfg); t++) {
			json_t *e = json_object();
			char name[2 * 64 + 2];

			snprintf(name, sizeof(name), "%s.%s", tl.t[t].schema, tl.t[t].name);
			json_object_set_new(e, "table", json_string(name));
			for (int i = 0; i < 4; i++)
				json_object_set_new(e, names[i], json_figure(each[t][i], i != 1));
			json_array_append_new(ts, e);
		}
		if (obx_tables_several(cfg))
			json_object_set_new(o, "tables", ts);
		else
			json_decref(ts);
		s = json_dumps(o, JSON_COMPACT);
		if (s != NULL)
			printf("%s\n", s);
		free(s);
		json_decref(o);
	} else {
		printf("%-27s %s\n", "mode", "poll");
		for (int i = 0; i < 4; i++)
			print_figure(names[i], all[i], i != 1);
		for (size_t t = 0; t < n && obx_tables_several(cfg); t++)
			printf("%-27s %s.%s: %.0f pending, %.0f retrying\n", "table", tl.t[t].schema, tl.t[t].name,
			    isnan(each[t][0]) ? 0 : each[t][0], isnan(each[t][2]) ? 0 : each[t][2]);
	}
	rc = OBX_EXIT_OK;
out:
	free(each);
	obx_pg_tables_reset(&tl);
	return rc;
}

int
obx_cmd_status(const struct obx_config *cfg, bool json)
{
	static const char *const names[] = { "slot", "active", "active_pid", "restart_lsn", "confirmed_flush_lsn",
		"wal_status", "safe_wal_size", "server_wal_lsn", "lag_bytes" };
	const char *p[1] = { cfg->slot };
	char err[1024];
	PGconn *conn;
	PGresult *res;
	int rc = OBX_EXIT_FAILURE;

	if (obx_pg_connect(cfg->conninfo, cfg->password, NULL, NULL, "outboxd status", &conn, err, sizeof(err)) !=
	    0) {
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
	    "WHERE slot_name = $1",
	    1, NULL, p, NULL, NULL, 0);
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
				val = json_number(res, 0, i, true);
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
