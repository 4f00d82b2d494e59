/*
 * pg/setup.c - preparing the replication connection: connect, server checks,
 * IDENTIFY_SYSTEM, publication, slot and the slot guard (see pg/setup.h).
 *
 * A replication=database connection speaks only the simple query protocol,
 * so every literal and identifier in the SQL below goes through
 * PQescapeLiteral/PQescapeIdentifier.
 */
#include <poll.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/core/pgoutput.h"
#include "obx/pg/setup.h"
#include "obx/core/pgversion.h"
#include "obx/pg/util.h"
#include "obx/core/snapmark.h"

#define MARKER "outboxd-slot"

/*
 * A publication or slot created by a racing instance is read again; one
 * dropped again each time it was read is given up on after this many reads.
 */
#define SETUP_ATTEMPTS 3

static int failf(char *errbuf, size_t errlen, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
failf(char *errbuf, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
	return code;
}

/* Escaped pieces of SQL, freed together. */
struct sqlnames {
	char *pub_ident, *pub_lit, *slot_ident, *slot_lit, *schema_lit, *table_lit, *qualified;
};

static void
sqlnames_free(struct sqlnames *n)
{
	PQfreemem(n->pub_ident);
	PQfreemem(n->pub_lit);
	PQfreemem(n->slot_ident);
	PQfreemem(n->slot_lit);
	PQfreemem(n->schema_lit);
	PQfreemem(n->table_lit);
	free(n->qualified);
	memset(n, 0, sizeof(*n));
}

/* Returns 0, or OBX_ENOMEM with errbuf filled (n is then empty). */
static int
sqlnames_init(struct sqlnames *n, PGconn *c, const struct obx_config *cfg, char *errbuf,
    size_t errlen)
{
	char *si, *ti;

	memset(n, 0, sizeof(*n));
	n->pub_ident = PQescapeIdentifier(c, cfg->publication, strlen(cfg->publication));
	n->pub_lit = PQescapeLiteral(c, cfg->publication, strlen(cfg->publication));
	n->slot_ident = PQescapeIdentifier(c, cfg->slot, strlen(cfg->slot));
	n->slot_lit = PQescapeLiteral(c, cfg->slot, strlen(cfg->slot));
	n->schema_lit = PQescapeLiteral(c, cfg->table_schema, strlen(cfg->table_schema));
	n->table_lit = PQescapeLiteral(c, cfg->table_name, strlen(cfg->table_name));
	si = PQescapeIdentifier(c, cfg->table_schema, strlen(cfg->table_schema));
	ti = PQescapeIdentifier(c, cfg->table_name, strlen(cfg->table_name));
	if (si != NULL && ti != NULL && asprintf(&n->qualified, "%s.%s", si, ti) < 0)
		n->qualified = NULL;
	PQfreemem(si);
	PQfreemem(ti);
	if (!n->pub_ident || !n->pub_lit || !n->slot_ident || !n->slot_lit || !n->schema_lit ||
	    !n->table_lit || !n->qualified) {
		sqlnames_free(n);
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	}
	return 0;
}

/*
 * Runs sql expecting rows or a completed command.  Returns 0 with *out set
 * (the caller clears it), or OBX_EIO with the server's message in errbuf
 * and its SQLSTATE in sqlstate ("" when there is none; sqlstate may be NULL).
 */
static int
query(PGconn *c, const char *sql, PGresult **out, char sqlstate[6], char *errbuf, size_t errlen)
{
	PGresult *res = PQexec(c, sql);
	ExecStatusType st = PQresultStatus(res);
	const char *code;

	*out = NULL;
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
		*out = res;
		return 0;
	}
	code = PQresultErrorField(res, PG_DIAG_SQLSTATE); /* owned by res */
	if (sqlstate != NULL)
		strlcpy(sqlstate, code != NULL && strlen(code) == 5 ? code : "", 6);
	obx_pg_result_error_line(res, errbuf, errlen);
	if (errbuf[0] == '\0')
		obx_pg_error_line(c, errbuf, errlen);
	PQclear(res);
	return OBX_EIO;
}

/*
 * Runs sql like query() for a command that may wait on the server, ticking
 * ctx about every second meanwhile.  After timeout_ms (0: no limit), or
 * when the tick asks to stop, the command is cancelled.  Returns 0 with
 * *out set, OBX_EIO with the server's message in errbuf and sqlstate set,
 * OBX_EBUSY when the time ran out, or OBX_ESTATE when the tick stopped it.
 */
static int
query_waiting(PGconn *c, const char *sql, int timeout_ms, struct obx_pgsetup_ctx *ctx,
    PGresult **out, char sqlstate[6], char *errbuf, size_t errlen)
{
	int64_t start = obx_mono_ms(), next_tick = start + 1000;
	PGresult *res, *last = NULL;
	int gave_up = 0;
	ExecStatusType st;
	const char *code;

	*out = NULL;
	strlcpy(sqlstate, "", 6);
	if (PQsendQuery(c, sql) == 0) {
		obx_pg_error_line(c, errbuf, errlen);
		return OBX_EIO;
	}
	while (PQisBusy(c)) {
		struct pollfd p = { PQsocket(c), POLLIN, 0 };
		int64_t now = obx_mono_ms();

		if (timeout_ms > 0 && now - start >= timeout_ms)
			gave_up = OBX_EBUSY;
		if (now >= next_tick) {
			next_tick = now + 1000;
			if (ctx != NULL && ctx->tick != NULL && ctx->tick(ctx->tick_arg))
				gave_up = OBX_ESTATE;
		}
		if (gave_up != 0) {
			PGcancel *cn = PQgetCancel(c);
			char why[256];

			if (cn != NULL)
				PQcancel(cn, why, sizeof(why));
			PQfreeCancel(cn);
			break; /* the results below are the cancelled command's */
		}
		if (poll(&p, 1, 250) < 0) {
			if (errno == EINTR)
				continue; /* a signal: the tick above asks whether to stop */
			break;
		}
		if (PQconsumeInput(c) == 0)
			break;
	}
	while ((res = PQgetResult(c)) != NULL) {
		PQclear(last);
		last = res;
	}
	st = PQresultStatus(last);
	if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) {
		/* also when it finished before the cancel arrived: it is done */
		*out = last;
		return 0;
	}
	code = PQresultErrorField(last, PG_DIAG_SQLSTATE); /* owned by last */
	strlcpy(sqlstate, code != NULL && strlen(code) == 5 ? code : "", 6);
	obx_pg_result_error_line(last, errbuf, errlen);
	if (errbuf[0] == '\0')
		obx_pg_error_line(c, errbuf, errlen);
	PQclear(last);
	return gave_up != 0 ? gave_up : OBX_EIO;
}

/* ---- connection and server ------------------------------------------- */

/*
 * Connection failures that no retry can heal; everything else may be
 * transient.  A name that does not resolve (yet: a Service being created, a
 * DNS hiccup) and a TLS handshake cut short by a restarting server are
 * retried like a refused connection; a certificate that does not verify is
 * not.
 */
static int
classify_connect_error(const char *msg)
{
	/* specific refusals first: with several hosts libpq joins every host's message */
	static const char *const permanent[] = {
		"password authentication failed", "does not exist", "no pg_hba.conf entry",
		"must be superuser or replication role", "permission denied",
		"must have the REPLICATION", "certificate", "root certificate file",
		"server does not support SSL", "invalid connection option", "invalid sslmode",
	};
	/* then what a restart, a DNS hiccup or a Service not created yet look like */
	static const char *const transient[] = {
		"could not translate host name", "Temporary failure in name resolution",
		"SSL SYSCALL error", "SSL connection has been closed unexpectedly", "unexpected eof",
	};
	/* last, the broad ones: any other TLS failure or invalid value is configuration */
	static const char *const broad[] = { "SSL error", "invalid" };

	for (size_t i = 0; i < sizeof(permanent) / sizeof(permanent[0]); i++)
		if (strstr(msg, permanent[i]) != NULL)
			return OBX_ECONFIG;
	for (size_t i = 0; i < sizeof(transient) / sizeof(transient[0]); i++)
		if (strstr(msg, transient[i]) != NULL)
			return OBX_EIO;
	for (size_t i = 0; i < sizeof(broad) / sizeof(broad[0]); i++)
		if (strstr(msg, broad[i]) != NULL)
			return OBX_ECONFIG;
	return OBX_EIO;
}

int
obx_pgsetup_connect(const char *conninfo, const char *password, PGconn **out, char *errbuf, size_t errlen)
{
	static const char *const kw[] = { "replication", NULL };
	static const char *const val[] = { "database", NULL };
	char err[1024];
	int r;

	PGresult *res;

	r = obx_pg_connect(conninfo, password, kw, val, "outboxd", out, err, sizeof(err));
	if (r == OBX_EIO)
		r = failf(errbuf, errlen, classify_connect_error(err),
		    "could not connect to PostgreSQL: %s", err);
	else if (r != 0)
		r = failf(errbuf, errlen, r, "%s", err);
	if (r != 0)
		return r;
	/* the stream's warnings must reach outboxd (PostgreSQL 18 warns, instead of failing,
	 * when it skips a publication: pg/stream.c), whatever the role's setting */
	if (query(*out, "SET client_min_messages TO warning", &res, NULL, err, sizeof(err)) != 0) {
		PQfinish(*out);
		*out = NULL;
		return failf(errbuf, errlen, OBX_EIO, "could not set client_min_messages: %s", err);
	}
	PQclear(res);
	return 0;
}

int
obx_pgsetup_protocol(int server_version, const struct obx_config *cfg, bool want_streaming,
    int *proto_version, bool *streaming, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f;
	char ver[32];
	int r;

	if ((r = obx_pgfacts_for(server_version, &f, errbuf, errlen)) != 0)
		return r;
	obx_pgversion_format(server_version, ver, sizeof(ver));
	*proto_version = f.proto;
	if (cfg->messages && !f.messages)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "[source] messages = on needs PostgreSQL 14 or later (server is %s)", ver);
	*streaming = want_streaming && f.streaming;
	if (want_streaming && !*streaming)
		obx_log_warn("[source] streaming = on needs PostgreSQL 14 or later (server is %s): "
		    "not streaming", ver);
	return 0;
}

int
obx_pgsetup_identify(PGconn *c, char *sysid, size_t sysidlen, int *timeline, obx_lsn *xlogpos,
    char *errbuf, size_t errlen)
{
	char err[1024];
	const char *bad = NULL;
	PGresult *res;
	long long tli = 0;
	int r;

	if (query(c, "IDENTIFY_SYSTEM", &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "IDENTIFY_SYSTEM failed: %s", err);
	if (PQntuples(res) != 1 || PQnfields(res) < 4 || PQgetisnull(res, 0, 3)) {
		r = failf(errbuf, errlen, OBX_EPROTO, "IDENTIFY_SYSTEM did not name a database: "
		    "the connection is not a logical replication connection");
	} else if ((tli = strtonum(PQgetvalue(res, 0, 1), 1, INT32_MAX, &bad)) == 0 || bad != NULL ||
	    obx_lsn_parse(PQgetvalue(res, 0, 2), xlogpos) != 0) {
		r = failf(errbuf, errlen, OBX_EPROTO, "IDENTIFY_SYSTEM answered timeline '%s' and xlogpos "
		    "'%s', out of form", PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2));
	} else {
		strlcpy(sysid, PQgetvalue(res, 0, 0), sysidlen);
		*timeline = (int)tli;
		r = 0;
	}
	PQclear(res);
	return r;
}

/* Reads setting name with SHOW into val.  Returns 0 or OBX_EIO (errbuf). */
static int
show(PGconn *c, const char *name, char *val, size_t vallen, char *errbuf, size_t errlen)
{
	char sql[128], err[1024];
	PGresult *res;

	snprintf(sql, sizeof(sql), "SHOW %s", name);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read %s: %s", name, err);
	strlcpy(val, PQntuples(res) > 0 ? PQgetvalue(res, 0, 0) : "", vallen);
	PQclear(res);
	return 0;
}

/* A duration setting as SHOW prints it ("60s", "0", "500ms") in milliseconds. */
static int
parse_guc_ms(const char *v, int *out)
{
	long long ms;

	if (strcmp(v, "0") == 0) {
		*out = 0;
		return 0;
	}
	if (obx_parse_duration_ms(v, 0, 1LL << 31, &ms) != 0 &&
	    obx_parse_int(v, 0, 1LL << 31, &ms) != 0)
		return OBX_EINVAL;
	*out = (int)ms;
	return 0;
}

int
obx_pgsetup_check_server(PGconn *c, const struct obx_config *cfg, int *wal_sender_timeout_ms,
    bool *in_recovery, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char v[256], err[1024], ver[32];
	PGresult *res;
	int r;

	(void)cfg;
	if (query(c, "SELECT pg_is_in_recovery()", &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not ask whether the server is in recovery: %s",
		    err);
	*in_recovery = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (*in_recovery && !f.standby_decoding)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "the server is a hot standby (in recovery) and PostgreSQL %s cannot decode there "
		    "(16 and later can): point [source] conninfo at the primary (with several hosts, "
		    "add target_session_attrs=read-write)", obx_pgversion_format(f.version, ver, sizeof(ver)));
	if ((r = show(c, "wal_level", v, sizeof(v), errbuf, errlen)) != 0)
		return r;
	if (strcmp(v, "logical") != 0)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "wal_level is '%s' but logical replication needs wal_level = logical "
		    "(set it in postgresql.conf and restart the server)", v);
	if ((r = show(c, "wal_sender_timeout", v, sizeof(v), errbuf, errlen)) != 0)
		return r;
	if (parse_guc_ms(v, wal_sender_timeout_ms) != 0)
		return failf(errbuf, errlen, OBX_EPROTO, "cannot parse wal_sender_timeout '%s'", v);
	/* a short wal_sender_timeout is no reason to refuse: the relay sends status updates
	 * at a third of it when that is sooner than [source] status_interval */
	return 0;
}

/* ---- publication ------------------------------------------------------ */

/*
 * The mapped columns (obx_config_mapped_columns), which a publication's
 * column list must keep, as SQL literals separated by commas for
 * ARRAY[...].  Returns 0 with *out set (the caller frees it) or OBX_ENOMEM.
 */
static int
mapped_columns_sql(PGconn *c, const struct obx_config *cfg, char **out)
{
	struct obx_names cols = { 0 };
	int r;

	*out = NULL;
	r = obx_config_mapped_columns(cfg, &cols);
	if (r == 0)
		r = obx_pg_literal_list(c, &cols, out);
	obx_names_reset(&cols);
	return r;
}

/*
 * Runs a CREATE PUBLICATION.  Two instances racing make the loser see
 * duplicate_object, or the catalog's unique index (unique_violation): the
 * publication exists either way, and *created says whether this call made
 * it.  Returns 0 or OBX_ECONFIG (errbuf).
 */
static int
create_publication(PGconn *c, const struct obx_config *cfg, const char *sql, bool *created,
    char *errbuf, size_t errlen)
{
	char err[1024], state[6];
	PGresult *res;

	*created = false;
	if (query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		*created = true;
		return 0;
	}
	if (strcmp(state, "42710") == 0 || strcmp(state, "23505") == 0) {
		obx_log_info("publication %s was created concurrently", cfg->publication);
		return 0;
	}
	return failf(errbuf, errlen, OBX_ECONFIG, "could not create publication %s: %s",
	    cfg->publication, err);
}

/*
 * [source] messages = on without an outbox table: events come from logical
 * decoding messages only, which pgoutput sends whatever the publication
 * holds; an empty publication is enough.
 */
static int
message_publication(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm,
    bool in_recovery, char *errbuf, size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *res;
	bool exists, created;
	int r;

	snprintf(sql, sizeof(sql), "SELECT 1 FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read publication %s: %s",
		    cfg->publication, err);
	exists = PQntuples(res) > 0;
	PQclear(res);
	if (!exists && in_recovery)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not exist and this server is a hot standby, where it cannot be "
		    "created: run CREATE PUBLICATION %s WITH (publish = 'insert') on the primary",
		    cfg->publication, nm->pub_ident);
	if (!exists && !cfg->create_publication)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not exist and create_publication = false "
		    "(with no outbox table, CREATE PUBLICATION %s is enough for messages)",
		    cfg->publication, cfg->publication);
	if (!exists) {
		snprintf(sql, sizeof(sql), "CREATE PUBLICATION %s WITH (publish = 'insert')", nm->pub_ident);
		if ((r = create_publication(c, cfg, sql, &created, errbuf, errlen)) != 0)
			return r;
	}
	obx_log_info("outbox table %s.%s does not exist: publishing logical decoding messages with "
	    "prefix '%s' only", cfg->table_schema, cfg->table_name, cfg->message_prefix);
	return 0;
}

/* Sets *relkind of the outbox table.  Returns 0, OBX_ENOENT (no such table), OBX_EIO. */
static int
table_relkind(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm, char *relkind,
    char *errbuf, size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *res;
	int r = OBX_ENOENT;

	snprintf(sql, sizeof(sql),
	    "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
	    "WHERE n.nspname = %s AND c.relname = %s", nm->schema_lit, nm->table_lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not look up table %s.%s: %s",
		    cfg->table_schema, cfg->table_name, err);
	if (PQntuples(res) > 0) {
		*relkind = PQgetvalue(res, 0, 0)[0];
		r = 0;
	}
	PQclear(res);
	return r;
}

/*
 * Makes sure the publication exists, creating it for a table of relkind
 * when cfg allows, and publishes inserts; sets *viaroot.  Returns 0,
 * OBX_EIO or OBX_ECONFIG.
 */
static int
ensure_publication(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm,
    char relkind, bool in_recovery, bool *viaroot, char *errbuf, size_t errlen)
{
	char sql[2048], err[1024];
	PGresult *res;
	bool exists, inserts, created;
	int r;

	for (int attempt = 0; attempt < SETUP_ATTEMPTS; attempt++) {
		snprintf(sql, sizeof(sql),
		    "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = %s", nm->pub_lit);
		if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
			return failf(errbuf, errlen, OBX_EIO, "could not read publication %s: %s",
			    cfg->publication, err);
		exists = PQntuples(res) > 0;
		inserts = exists && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		*viaroot = exists && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
		PQclear(res);
		if (exists && !inserts)
			return failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not publish inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
			    cfg->publication, cfg->publication);
		if (exists)
			return 0;
		if (in_recovery)
			return failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not exist and this server is a hot standby, where it cannot "
			    "be created: run CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s) "
			    "on the primary", cfg->publication, nm->pub_ident, nm->qualified,
			    relkind == 'p' ? ", publish_via_partition_root = true" : "");
		if (!cfg->create_publication)
			return failf(errbuf, errlen, OBX_ECONFIG,
			    "publication %s does not exist and create_publication = false "
			    "(create it FOR TABLE %s.%s WITH (publish = 'insert'), see sql/)",
			    cfg->publication, cfg->table_schema, cfg->table_name);
		snprintf(sql, sizeof(sql), "CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert'%s)",
		    nm->pub_ident, nm->qualified,
		    relkind == 'p' ? ", publish_via_partition_root = true" : "");
		if ((r = create_publication(c, cfg, sql, &created, errbuf, errlen)) != 0)
			return r;
		if (created)
			obx_log_info("created publication %s for table %s.%s (inserts only)",
			    cfg->publication, cfg->table_schema, cfg->table_name);
	}
	return failf(errbuf, errlen, OBX_EIO, "publication %s was dropped each time it was created",
	    cfg->publication);
}

/*
 * Refuses a publication that would let events be confirmed unpublished: one
 * without the table, with a row filter, or with a column list hiding a
 * mapped column.  A mapped column the table lacks now (renamed, dropped) is
 * only logged: its rows follow on_error.  Returns 0, OBX_EIO, OBX_ECONFIG
 * or OBX_ENOMEM.
 */
static int
check_publication_columns(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm,
    char *errbuf, size_t errlen)
{
	char err[1024], state[6];
	char *cols = NULL, *sql = NULL;
	PGresult *res;
	/* row filters and column lists (pg_publication_tables.rowfilter, attnames) arrive in 15 */
	bool filters = obx_pg_facts(c).publication_filters;
	int r;

	if (mapped_columns_sql(c, cfg, &cols) != 0 ||
	    asprintf(&sql,
	    "WITH t AS (SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(quote_ident(%s) || '.' || quote_ident(%s)) "
	    "AND attnum > 0 AND NOT attisdropped) "
	    "SELECT %s, (SELECT string_agg(m, ', ') FROM unnest(ARRAY[%s]::name[]) m "
	    "WHERE %s AND m IN (SELECT attname FROM t)), "
	    "(SELECT string_agg(m, ', ') FROM unnest(ARRAY[%s]::name[]) m WHERE m NOT IN (SELECT attname FROM t)) "
	    "FROM pg_publication_tables WHERE pubname = %s AND schemaname = %s AND tablename = %s",
	    nm->schema_lit, nm->table_lit, filters ? "rowfilter IS NOT NULL" : "false", cols,
	    filters ? "attnames IS NOT NULL AND NOT m = ANY(attnames)" : "false", cols, nm->pub_lit,
	    nm->schema_lit, nm->table_lit) < 0) {
		free(cols);
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	}
	free(cols);
	r = query(c, sql, &res, state, err, sizeof(err));
	free(sql);
	if (r != 0)
		/* a catalog this server lacks (SQLSTATE class 42) heals with no retry */
		return failf(errbuf, errlen, strncmp(state, "42", 2) == 0 ? OBX_ECONFIG : OBX_EIO,
		    "could not read publication %s: %s", cfg->publication, err);
	if (PQntuples(res) == 0)
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s does not publish table %s.%s (ALTER PUBLICATION %s ADD TABLE ...)",
		    cfg->publication, cfg->table_schema, cfg->table_name, cfg->publication);
	else if (strcmp(PQgetvalue(res, 0, 0), "t") == 0)
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s has a row filter on %s.%s: filtered events would be confirmed without being published",
		    cfg->publication, cfg->table_schema, cfg->table_name);
	else if (!PQgetisnull(res, 0, 1))
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "publication %s has a column list without the mapped column(s) %s",
		    cfg->publication, PQgetvalue(res, 0, 1));
	else if (!PQgetisnull(res, 0, 2))
		obx_log_warn("outbox table %s.%s has no column(s) %s now: rows without them cannot become "
		    "events and follow on_error (%s)", cfg->table_schema, cfg->table_name,
		    PQgetvalue(res, 0, 2), cfg->on_error == OBX_ON_ERROR_STOP ? "stop" : "dead_letter");
	PQclear(res);
	return r;
}

int
obx_pgsetup_publication(PGconn *c, const struct obx_config *cfg, bool in_recovery, char *errbuf,
    size_t errlen)
{
	struct sqlnames nm;
	char relkind = 'r';
	bool viaroot = false;
	int r;

	if ((r = sqlnames_init(&nm, c, cfg, errbuf, errlen)) != 0)
		return r;
	r = table_relkind(c, cfg, &nm, &relkind, errbuf, errlen);
	if (r == OBX_ENOENT && cfg->messages) {
		r = message_publication(c, cfg, &nm, in_recovery, errbuf, errlen);
		goto out;
	}
	if (r == OBX_ENOENT)
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "outbox table %s.%s does not exist (create it, see sql/, or set [source] table)",
		    cfg->table_schema, cfg->table_name);
	if (r != 0)
		goto out;
	if ((r = ensure_publication(c, cfg, &nm, relkind, in_recovery, &viaroot, errbuf, errlen)) != 0)
		goto out;
	if (relkind == 'p' && !viaroot) {
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "outbox %s.%s is partitioned but publication %s lacks publish_via_partition_root = true: "
		    "events would arrive under partition names (ALTER PUBLICATION %s SET (publish_via_partition_root = true))",
		    cfg->table_schema, cfg->table_name, cfg->publication, cfg->publication);
		goto out;
	}
	r = check_publication_columns(c, cfg, &nm, errbuf, errlen);
out:
	sqlnames_free(&nm);
	return r;
}

/* ---- the slot guard --------------------------------------------------- */

/* Finds "outboxd-slot SLOT SYSID LSN" in the publication comment; returns true when present. */
static bool
find_marker(const char *comment, const char *slot, char *sysid, size_t sl, char *lsn, size_t ll)
{
	const char *p = comment;

	while (p != NULL && *p != '\0') {
		char s[128], id[32], l[32];

		if (sscanf(p, MARKER " %127s %31s %31s", s, id, l) == 3 && strcmp(s, slot) == 0) {
			strlcpy(sysid, id, sl);
			strlcpy(lsn, l, ll);
			return true;
		}
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	return false;
}

/*
 * Reads the guard's record of the slot from the publication comment:
 * *comment is the whole comment (the caller frees it), *marked says whether
 * it records the slot, and then msysid and mlsn hold the record.  Returns
 * 0, OBX_EIO or OBX_ENOMEM.
 */
static int
read_guard(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm, char **comment,
    bool *marked, char *msysid, size_t msysidlen, char *mlsn, size_t mlsnlen, char *errbuf,
    size_t errlen)
{
	char sql[1024], err[1024];
	PGresult *res;

	snprintf(sql, sizeof(sql), "SELECT coalesce(obj_description(oid, 'pg_publication'), '') "
	    "FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read publication comment: %s", err);
	*comment = strdup(PQntuples(res) > 0 ? PQgetvalue(res, 0, 0) : "");
	PQclear(res);
	if (*comment == NULL)
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	*marked = find_marker(*comment, cfg->slot, msysid, msysidlen, mlsn, mlsnlen);
	return 0;
}

/*
 * Adds (or replaces) the guard's record of the slot in the publication
 * comment.  Returns true when written; on failure only logs, at debug when
 * quiet (a standby adopting a slot tries every second).
 */
static bool
record_marker(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm,
    const char *comment, const char *sysid, const char *lsn, bool quiet)
{
	char *text = NULL, *lit, *sql = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&text, &len);
	char err[1024];
	PGresult *res;
	bool done = false;

	if (fp == NULL)
		return false;
	/* keep the other lines (other slots, a human's note), replace ours */
	for (const char *p = comment; p != NULL && *p != '\0';) {
		const char *nl = strchr(p, '\n');
		size_t n = nl ? (size_t)(nl - p) : strlen(p);
		char prefix[160];

		snprintf(prefix, sizeof(prefix), MARKER " %s ", cfg->slot);
		if (strncmp(p, prefix, strlen(prefix)) != 0 && n > 0)
			fprintf(fp, "%.*s\n", (int)n, p);
		p = nl ? nl + 1 : NULL;
	}
	fprintf(fp, MARKER " %s %s %s", cfg->slot, sysid, lsn);
	fclose(fp);
	lit = PQescapeLiteral(c, text, strlen(text));
	if (lit != NULL && asprintf(&sql, "COMMENT ON PUBLICATION %s IS %s", nm->pub_ident, lit) > 0) {
		if (query(c, sql, &res, NULL, err, sizeof(err)) == 0) {
			PQclear(res);
			done = true;
		} else {
			obx_log(quiet ? OBX_LOG_DEBUG : OBX_LOG_WARN, "could not record the creation of slot %s "
			    "on publication %s: %s; a later loss of the slot will not be detected (make the "
			    "outboxd role own the publication)", cfg->slot, cfg->publication, err);
		}
	}
	free(sql);
	PQfreemem(lit);
	free(text);
	return done;
}

/* ---- slot ------------------------------------------------------------- */

/* ALTER_REPLICATION_SLOT waits for a slot another instance holds; this long at most. */
#define ALTER_WAIT_MS 5000

/* What pg_replication_slots says about the slot (columns the server lacks read false). */
struct slotrow {
	obx_lsn confirmed;
	bool active;   /* a walsender streams from it */
	bool failover; /* synchronized to standbys that run slot synchronization (17) */
	bool synced;   /* made by slot synchronization from a primary (17) */
};

/*
 * Reads the slot.  Returns 0 with *row set when it exists and can be used,
 * OBX_ENOENT when there is none, else OBX_EIO (also: synchronized from the
 * primary while this server is in recovery, which heals on promotion),
 * OBX_EBUSY (being created), OBX_ECONFIG (not pgoutput, of another
 * database, invalidated) or OBX_EPROTO.
 */
static int
read_slot(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm, bool in_recovery,
    struct slotrow *row, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char sql[1024], err[1024];
	const char *since;
	PGresult *res;
	int r = 0;

	memset(row, 0, sizeof(*row));
	snprintf(sql, sizeof(sql),
	    "SELECT confirmed_flush_lsn, plugin, slot_type, database, coalesce(wal_status, ''), "
	    "database = current_database(), current_database(), active, %s, %s, %s "
	    "FROM pg_replication_slots WHERE slot_name = %s",
	    f.standby_decoding ? "coalesce(conflicting, false)" : "false",
	    f.failover_slots ? "failover" : "false", f.failover_slots ? "synced" : "false", nm->slot_lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", cfg->slot, err);
	if (PQntuples(res) == 0) {
		PQclear(res);
		return OBX_ENOENT;
	}
	since = PQgetisnull(res, 0, 0) ? "its last position" : PQgetvalue(res, 0, 0);
	row->active = strcmp(PQgetvalue(res, 0, 7), "t") == 0;
	row->failover = strcmp(PQgetvalue(res, 0, 9), "t") == 0;
	row->synced = strcmp(PQgetvalue(res, 0, 10), "t") == 0;
	if (strcmp(PQgetvalue(res, 0, 2), "logical") != 0 ||
	    strcmp(PQgetvalue(res, 0, 1), "pgoutput") != 0)
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s exists but is not a logical pgoutput slot (plugin %s)", cfg->slot,
		    PQgetvalue(res, 0, 1));
	else if (strcmp(PQgetvalue(res, 0, 5), "t") != 0)
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s belongs to database %s, not %s: a logical slot decodes only its own "
		    "database; name another [source] slot or connect to %s", cfg->slot,
		    PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 6), PQgetvalue(res, 0, 3));
	else if (strcmp(PQgetvalue(res, 0, 8), "t") == 0)
		/* invalidated (16+: conflicting; on 16 also set when WAL was removed, so the
		 * line names both causes) */
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s is invalidated: %s; events committed after %s may have been lost; drop and "
		    "recreate the slot, then reconcile from the business tables", cfg->slot,
		    strcmp(PQgetvalue(res, 0, 4), "lost") == 0 ? "the server removed WAL it still needed "
		    "(wal_status = lost; see max_slot_wal_keep_size) or, on a standby, catalog rows it "
		    "needed (a conflict with recovery: give the standby a physical slot, primary_slot_name, "
		    "and hot_standby_feedback = on)" : "a conflict with recovery: the primary removed "
		    "catalog rows it needed (give the standby a physical slot, primary_slot_name, and "
		    "hot_standby_feedback = on)", since);
	else if (strcmp(PQgetvalue(res, 0, 4), "lost") == 0)
		r = failf(errbuf, errlen, OBX_ECONFIG,
		    "slot %s is invalidated (wal_status = lost): the server removed WAL it still needed, "
		    "events committed after %s may have been lost; drop and recreate the slot, then "
		    "reconcile from the business tables", cfg->slot, since);
	else if (in_recovery && row->synced)
		/* START_REPLICATION would fail with SQLSTATE 55000 until the promotion */
		r = failf(errbuf, errlen, OBX_EIO,
		    "slot %s on this server is synchronized from the primary and cannot be used while "
		    "the server is in recovery: waiting for its promotion (to follow the primary "
		    "instead, list both hosts in [source] conninfo with target_session_attrs=read-write)",
		    cfg->slot);
	else if (PQgetisnull(res, 0, 0))
		/* another instance is creating it right now: wait for it like for a slot in use */
		r = failf(errbuf, errlen, OBX_EBUSY, "slot %s is being created by another instance",
		    cfg->slot);
	else if (obx_lsn_parse(PQgetvalue(res, 0, 0), &row->confirmed) != 0)
		r = failf(errbuf, errlen, OBX_EPROTO, "slot %s has a malformed confirmed position",
		    cfg->slot);
	PQclear(res);
	return r;
}

/* ---- the marker of an unfinished snapshot ([source] snapshot = pending) ---- */

/*
 * Whether the marker slot exists.  Returns 0 with *exists set, OBX_EIO, or
 * OBX_ECONFIG when a slot of that name is not a marker (not physical).
 */
static int
read_snapmark(PGconn *c, const char *slot, const char *marker, bool *exists, char *errbuf,
    size_t errlen)
{
	char sql[512], err[1024], *lit;
	PGresult *res;
	int r = 0;

	*exists = false;
	if ((lit = PQescapeLiteral(c, marker, strlen(marker))) == NULL)
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "SELECT slot_type FROM pg_replication_slots WHERE slot_name = %s", lit);
	PQfreemem(lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", marker, err);
	if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "physical") != 0)
		r = failf(errbuf, errlen, OBX_ECONFIG, "slot %s exists and is %s: outboxd keeps a physical "
		    "slot of that name while the rows pending at slot %s's creation are published; drop "
		    "it or rename [source] slot", marker, PQgetvalue(res, 0, 0), slot);
	else
		*exists = PQntuples(res) == 1;
	PQclear(res);
	return r;
}

/* Creates the marker slot (no WAL reserved: it pins nothing).  Returns 0 or OBX_EIO/OBX_ECONFIG. */
static int
create_snapmark(PGconn *c, const char *slot, const char *marker, char *errbuf, size_t errlen)
{
	char sql[256], err[1024], state[6] = "";
	PGresult *res;
	char *ident = PQescapeIdentifier(c, marker, strlen(marker));

	if (ident == NULL)
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s PHYSICAL", ident);
	PQfreemem(ident);
	if (query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		return 0;
	}
	if (strcmp(state, "42710") == 0) /* left by a run that died before creating the slot */
		return 0;
	return failf(errbuf, errlen, PQstatus(c) != CONNECTION_OK || strcmp(state, "53400") != 0 ?
	    OBX_EIO : OBX_ECONFIG, "could not create slot %s, which marks the snapshot of slot %s as "
	    "unfinished: %s", marker, slot, err);
}

/* the advisory lock class of a snapshot ("obxs"), keyed by hashtext(slot) */
#define SNAPSHOT_LOCK_CLASS "1868724339"

/*
 * The marker an earlier version made for a slot named over 54 characters,
 * named with the slot's first 54 (snap->legacy, obx_snapmark_legacy_name):
 * sets *exists when a physical slot of that name is there, and *ours when it
 * can be this slot's only: no other slot's name begins with those 54
 * characters and no other slot's snapshot is under way (an earlier version
 * takes that lock before it makes the marker, and makes the marker before
 * its slot).  Both false for a shorter name.  Returns 0, OBX_EIO or
 * OBX_ENOMEM.
 */
static int
read_legacy_mark(PGconn *c, const char *slot, const char *legacy, bool *exists, bool *ours,
    char *errbuf, size_t errlen)
{
	char sql[1024], err[1024], prefix[OBX_SNAPMARK_KEEP + 1];
	char *lslot, *llegacy, *lprefix;
	PGresult *res;
	int r = 0;

	*exists = *ours = false;
	if (legacy[0] == '\0')
		return 0;
	snprintf(prefix, sizeof(prefix), "%s", slot);
	lslot = PQescapeLiteral(c, slot, strlen(slot));
	llegacy = PQescapeLiteral(c, legacy, strlen(legacy));
	lprefix = PQescapeLiteral(c, prefix, strlen(prefix));
	if (lslot != NULL && llegacy != NULL && lprefix != NULL)
		snprintf(sql, sizeof(sql), "SELECT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = %s "
		    "AND slot_type = 'physical'), NOT EXISTS (SELECT FROM pg_replication_slots WHERE "
		    "slot_name NOT IN (%s, %s) AND left(slot_name::text, %d) = %s) AND NOT EXISTS (SELECT "
		    "FROM pg_locks WHERE locktype = 'advisory' AND classid = " SNAPSHOT_LOCK_CLASS " AND "
		    "objsubid = 2 AND objid::bigint <> (hashtext(%s)::bigint & 4294967295))", llegacy, lslot,
		    llegacy, OBX_SNAPMARK_KEEP, lprefix, lslot);
	else
		r = failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	PQfreemem(lslot);
	PQfreemem(llegacy);
	PQfreemem(lprefix);
	if (r != 0)
		return r;
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read slot %s: %s", legacy, err);
	*exists = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	*ours = *exists && strcmp(PQgetvalue(res, 0, 1), "t") == 0;
	PQclear(res);
	return 0;
}

/* Drops slot name, gone already or not.  Returns 0 or OBX_EIO. */
static int
drop_snapmark(PGconn *c, const char *name, char *errbuf, size_t errlen)
{
	char sql[256], err[1024], state[6] = "";
	PGresult *res;
	char *ident = PQescapeIdentifier(c, name, strlen(name));

	if (ident == NULL)
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "DROP_REPLICATION_SLOT %s", ident);
	PQfreemem(ident);
	if (query(c, sql, &res, state, err, sizeof(err)) == 0) {
		PQclear(res);
		return 0;
	}
	if (strcmp(state, "42704") == 0)
		return 0;
	return failf(errbuf, errlen, OBX_EIO, "could not drop slot %s after the snapshot: %s", name, err);
}

/*
 * Opens snap->conn: an ordinary connection to the server c is connected to
 * (not to another host of a multi-host conninfo), without the timeouts a
 * role may set that would end a long snapshot half-way, holding the
 * session-level advisory lock of the slot's snapshot.  Returns 0, OBX_EBUSY
 * (another instance holds the lock: it is publishing the pending rows),
 * OBX_EIO or OBX_ENOMEM.
 */
static int
snapshot_open(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_snapshot *snap,
    char *errbuf, size_t errlen)
{
	const char *kw[4], *val[4], *params[2] = { SNAPSHOT_LOCK_CLASS, cfg->slot };
	const char *host = PQhost(c), *addr = PQhostaddr(c), *port = PQport(c);
	char err[1024];
	PGresult *res;
	int n = 0, r;

	if (snap->conn != NULL)
		return 0;
	if (host != NULL && host[0] != '\0') {
		kw[n] = "host";
		val[n++] = host;
	}
	if (addr != NULL && addr[0] != '\0') {
		kw[n] = "hostaddr";
		val[n++] = addr;
	}
	if (port != NULL && port[0] != '\0') {
		kw[n] = "port";
		val[n++] = port;
	}
	kw[n] = val[n] = NULL;
	if (obx_pg_connect(cfg->conninfo, cfg->password, kw, val, "outboxd snapshot", &snap->conn, err,
	    sizeof(err)) != 0) {
		snap->conn = NULL;
		return failf(errbuf, errlen, OBX_EIO, "could not open the connection that reads the rows "
		    "pending at slot %s's creation: %s", cfg->slot, err);
	}
	/* its transaction stays open while the broker acknowledges (or is down) */
	res = PQexec(snap->conn, "SELECT set_config('idle_in_transaction_session_timeout', '0', false), "
	    "set_config('statement_timeout', '0', false); "
	    "SELECT set_config('idle_session_timeout', '0', false) "
	    "WHERE current_setting('server_version_num')::int >= 140000; "
	    "SELECT set_config('transaction_timeout', '0', false) "
	    "WHERE current_setting('server_version_num')::int >= 170000");
	PQclear(res);
	res = PQexecParams(snap->conn, "SELECT pg_try_advisory_lock($1::int, hashtext($2))", 2, NULL,
	    params, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		r = failf(errbuf, errlen, OBX_EIO, "could not take the lock of slot %s's snapshot: %s",
		    cfg->slot, obx_pg_result_error_line(res, err, sizeof(err)));
	else if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		r = failf(errbuf, errlen, OBX_EBUSY, "another instance is publishing the rows pending at "
		    "the creation of slot %s", cfg->slot);
	else
		r = 0;
	PQclear(res);
	if (r != 0) {
		PQfinish(snap->conn);
		snap->conn = NULL;
	}
	return r;
}

/*
 * With [source] snapshot = none, a marker says another instance may be
 * publishing the pending rows right now: streaming meanwhile would put
 * newer events before them.  Returns 0 (nobody holds the lock), OBX_EBUSY
 * or OBX_EIO.
 */
static int
snapshot_lock_free(PGconn *c, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	char sql[512], err[1024], *lit = PQescapeLiteral(c, cfg->slot, strlen(cfg->slot));
	PGresult *res;
	int r;

	if (lit == NULL)
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	/* taken and released within the statement: it only tells whether another session holds it */
	snprintf(sql, sizeof(sql), "SELECT pg_try_advisory_xact_lock(" SNAPSHOT_LOCK_CLASS
	    ", hashtext(%s))", lit);
	PQfreemem(lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not read the lock of slot %s's snapshot: %s",
		    cfg->slot, err);
	r = strcmp(PQgetvalue(res, 0, 0), "t") == 0 ? 0 : failf(errbuf, errlen, OBX_EBUSY,
	    "another instance is publishing the rows pending at the creation of slot %s", cfg->slot);
	PQclear(res);
	return r;
}

int
obx_pgsetup_snapshot_done(PGconn *c, const struct obx_pgsetup_snapshot *snap, char *errbuf,
    size_t errlen)
{
	bool exists, ours;
	int r;

	if ((r = drop_snapmark(c, snap->marker, errbuf, errlen)) != 0 || snap->legacy[0] == '\0')
		return r;
	/* an earlier version's marker goes too, unless another slot may have come to need it since */
	if ((r = read_legacy_mark(c, snap->slot, snap->legacy, &exists, &ours, errbuf, errlen)) != 0 ||
	    !ours)
		return r;
	return drop_snapmark(c, snap->legacy, errbuf, errlen);
}

/*
 * Opens a read-only repeatable-read transaction on importer in the snapshot
 * the slot's creation exported.  Returns 0 or OBX_EIO (the marker makes the
 * next session publish the pending rows from a fresh snapshot).
 */
static int
import_snapshot(PGconn *importer, const struct obx_config *cfg, const char *name, char *errbuf,
    size_t errlen)
{
	char sql[256], err[1024];
	PGresult *res;
	char *lit;

	if (name[0] == '\0')
		return failf(errbuf, errlen, OBX_EPROTO, "slot %s was created without the snapshot asked for",
		    cfg->slot);
	if (query(importer, "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY", &res, NULL, err,
	    sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not begin the snapshot of slot %s: %s",
		    cfg->slot, err);
	PQclear(res);
	if ((lit = PQescapeLiteral(importer, name, strlen(name))) == NULL)
		return failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	snprintf(sql, sizeof(sql), "SET TRANSACTION SNAPSHOT %s", lit);
	PQfreemem(lit);
	if (query(importer, sql, &res, NULL, err, sizeof(err)) != 0)
		return failf(errbuf, errlen, OBX_EIO, "could not use the snapshot slot %s exported: %s",
		    cfg->slot, err);
	PQclear(res);
	return 0;
}

/*
 * Creates the slot (without a snapshot, or exporting one that importer
 * takes over at once), with failover when [source] failover
 * asks for it and the server can (17, not on a standby).  On a hot standby
 * the server waits for the primary's next running-transactions record; the
 * wait ticks ctx.  Returns 0 with *confirmed and point (its consistent point
 * as text) set, or with *raced set when another instance created it first;
 * OBX_EIO (the connection failed, or the wait was given up on a stop
 * signal), OBX_ECONFIG or OBX_EPROTO (errbuf).
 */
static int
create_slot(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm, bool in_recovery,
    struct obx_pgsetup_ctx *ctx, PGconn *importer, obx_lsn *confirmed, char *point, size_t pointlen,
    bool *raced, bool *made, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char sql[1024], err[1024], state[6] = "";
	PGresult *res;
	int r = 0;

	*raced = *made = false;
	if (f.slot_options)
		snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput (SNAPSHOT '%s'%s)",
		    nm->slot_ident, importer != NULL ? "export" : "nothing",
		    f.failover_slots && cfg->failover && !in_recovery ? ", FAILOVER" : "");
	else
		snprintf(sql, sizeof(sql), "CREATE_REPLICATION_SLOT %s LOGICAL pgoutput %s",
		    nm->slot_ident, importer != NULL ? "EXPORT_SNAPSHOT" : "NOEXPORT_SNAPSHOT");
	if (in_recovery) {
		obx_log(ctx->said_standby_create ? OBX_LOG_DEBUG : OBX_LOG_INFO,
		    "creating slot %s on a hot standby: waiting for the primary's next running-transactions "
		    "record (SELECT pg_log_standby_snapshot() on the primary writes one at once)", cfg->slot);
		ctx->said_standby_create = true;
		r = query_waiting(c, sql, 0, ctx, &res, state, err, sizeof(err));
		if (r == OBX_ESTATE)
			return failf(errbuf, errlen, OBX_EIO, "stopped while creating slot %s on the hot standby",
			    cfg->slot);
	} else {
		/* waits for the transactions running now to end: a long or prepared one delays
		 * it; the wait keeps /healthz fresh and ends on SIGTERM */
		r = query_waiting(c, sql, 0, ctx, &res, state, err, sizeof(err));
		if (r == OBX_ESTATE)
			return failf(errbuf, errlen, OBX_EIO, "stopped while creating slot %s (it waits for "
			    "the transactions running when it started to end)", cfg->slot);
	}
	if (r != 0) {
		if (PQstatus(c) != CONNECTION_OK)
			return failf(errbuf, errlen, OBX_EIO, "could not create slot %s: %s", cfg->slot, err);
		/* cancelled, a serialization or lock conflict, an object in use: may heal */
		if (strncmp(state, "40", 2) == 0 || strcmp(state, "57014") == 0 ||
		    strcmp(state, "55P03") == 0 || strcmp(state, "55006") == 0)
			return failf(errbuf, errlen, OBX_EIO, "could not create slot %s: %s", cfg->slot, err);
		if (strcmp(state, "42710") != 0)
			return failf(errbuf, errlen, OBX_ECONFIG, "could not create slot %s: %s",
			    cfg->slot, err);
		*raced = true;
		return 0;
	}
	*made = true;
	if (PQntuples(res) < 1 || PQnfields(res) < 3 ||
	    obx_lsn_parse(PQgetvalue(res, 0, 1), confirmed) != 0)
		r = failf(errbuf, errlen, OBX_EPROTO, "slot %s: unexpected consistent point", cfg->slot);
	else
		strlcpy(point, PQgetvalue(res, 0, 1), pointlen);
	/* the export lasts until c runs its next command: imported before anything else */
	if (r == 0 && importer != NULL)
		r = import_snapshot(importer, cfg, PQgetisnull(res, 0, 2) ? "" : PQgetvalue(res, 0, 2),
		    errbuf, errlen);
	PQclear(res);
	return r;
}

/* Says once that a hot standby's own slot goes without failover until a promotion. */
static void
note_standby_failover(const struct obx_config *cfg, struct obx_pgsetup_ctx *ctx)
{
	if (ctx->said_standby_failover)
		return;
	ctx->said_standby_failover = true;
	obx_log_info("slot %s is on a hot standby, where failover cannot be enabled (only a primary's "
	    "slots are synchronized to standbys): outboxd enables it when it connects after this "
	    "server's promotion", cfg->slot);
}

/*
 * Makes the slot's failover flag [source] failover (PostgreSQL 17+).  A hot
 * standby's own slot cannot have failover (only a primary's slots are
 * synchronized): said once, and enabled by the first session after the
 * promotion.  A slot another instance streams from is left alone:
 * ALTER_REPLICATION_SLOT would wait until that instance lets go.  Returns 0
 * (also when the server refused the change, which is only logged),
 * OBX_EBUSY (another instance took the slot meanwhile) or OBX_EIO (the
 * connection failed, or a stop signal came while waiting).
 */
static int
match_failover(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm,
    const struct slotrow *row, bool in_recovery, struct obx_pgsetup_ctx *ctx, char *errbuf,
    size_t errlen)
{
	char sql[512], err[1024], state[6];
	PGresult *res;
	int r;

	if (row->failover == cfg->failover)
		return 0;
	if (in_recovery && cfg->failover) {
		note_standby_failover(cfg, ctx);
		return 0;
	}
	if (row->active) {
		obx_log_debug("slot %s is in use: its failover flag is left as it is", cfg->slot);
		return 0;
	}
	snprintf(sql, sizeof(sql), "ALTER_REPLICATION_SLOT %s (FAILOVER %s)", nm->slot_ident,
	    cfg->failover ? "true" : "false");
	r = query_waiting(c, sql, ALTER_WAIT_MS, ctx, &res, state, err, sizeof(err));
	if (r == 0) {
		PQclear(res);
		if (cfg->failover)
			obx_log_info("enabled failover on slot %s: standbys that run sync_replication_slots = on "
			    "keep a copy of it for a failover", cfg->slot);
		else
			obx_log_info("disabled failover on slot %s ([source] failover = off): a failover to a "
			    "standby loses the slot", cfg->slot);
		return 0;
	}
	if (r == OBX_EBUSY)
		return failf(errbuf, errlen, OBX_EBUSY, "slot %s is in use by another instance", cfg->slot);
	if (r == OBX_ESTATE || PQstatus(c) != CONNECTION_OK)
		return failf(errbuf, errlen, OBX_EIO, "could not set failover on slot %s: %s", cfg->slot,
		    r == OBX_ESTATE ? "stopped while waiting" : err);
	obx_log_warn("could not set failover = %s on slot %s: %s; streaming without the change",
	    cfg->failover ? "on" : "off", cfg->slot, err);
	return 0;
}

/* A new slot starts at its creation point: says how many rows that leaves behind. */
static void
warn_unpublished_rows(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm)
{
	char sql[1024], err[1024];
	PGresult *res;

	snprintf(sql, sizeof(sql), "SELECT count(*) FROM (SELECT 1 FROM %s LIMIT 1000001) x", nm->qualified);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return;
	if (strcmp(PQgetvalue(res, 0, 0), "0") != 0)
		obx_log_warn("%s row(s) already in %s.%s will not be published: a new slot starts "
		    "at its creation point ([source] snapshot = none; with pending, a new slot publishes "
		    "them first)", PQgetvalue(res, 0, 0), cfg->table_schema, cfg->table_name);
	PQclear(res);
}

/*
 * A hot standby is read-only: the guard cannot record the slot there.  Says
 * so once, with the line that protects the slot when added to the
 * publication's comment on the primary (it reaches the standby through the
 * WAL like any other change).
 */
static void
note_standby_guard(const struct obx_config *cfg, const char *sysid, const char *lsn,
    struct obx_pgsetup_ctx *ctx)
{
	if (ctx->said_standby_guard)
		return;
	ctx->said_standby_guard = true;
	obx_log_warn("this hot standby is read-only: the slot guard cannot record slot %s on "
	    "publication %s here, so a loss of the slot would not be detected; to protect it, add the "
	    "line '" MARKER " %s %s %s' to the publication's comment on the primary", cfg->slot,
	    cfg->publication, cfg->slot, sysid, lsn);
}

/*
 * The slot exists but the publication holds no record of it: a slot made
 * outside outboxd (or by an earlier version), recorded now so that a later
 * loss is detected.  A publication dropped and created again behind the
 * slot also loses the record; the server then cannot decode the slot's
 * backlog ("publication ... does not exist"), which ends the run with the
 * recovery steps (relay.c).  Only warns, and only once per process, when
 * the record cannot be written; on a hot standby, which cannot write it,
 * says once what to add on the primary.
 */
static void
adopt_slot(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm, const char *sysid,
    obx_lsn confirmed, bool in_recovery, struct obx_pgsetup_ctx *ctx, obx_lsn *born)
{
	char sql[1024], err[1024], msysid[32], mlsn[32], at[OBX_LSN_STRLEN];
	PGresult *res;

	*born = 0;
	snprintf(sql, sizeof(sql), "SELECT coalesce(obj_description(oid, 'pg_publication'), '') "
	    "FROM pg_publication WHERE pubname = %s", nm->pub_lit);
	if (query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return;
	if (PQntuples(res) == 1 && find_marker(PQgetvalue(res, 0, 0), cfg->slot, msysid, sizeof(msysid),
	    mlsn, sizeof(mlsn))) {
		if (obx_lsn_parse(mlsn, born) != 0)
			*born = 0;
	} else if (PQntuples(res) == 1) {
		obx_lsn_format(confirmed, at, sizeof(at));
		if (in_recovery)
			note_standby_guard(cfg, sysid, at, ctx);
		else if (record_marker(c, cfg, nm, PQgetvalue(res, 0, 0), sysid, at, true)) {
			obx_log_info("slot %s has no record on publication %s (made outside outboxd?): "
			    "recorded it at %s", cfg->slot, cfg->publication, at);
			*born = confirmed;
		}
	}
	PQclear(res);
}

/*
 * Decides with the slot guard whether a missing slot may be created: not
 * when it existed before (unless recreate), nor when cfg forbids it.
 * Returns 0 or OBX_ECONFIG.
 */
static int
may_create_slot(const struct obx_config *cfg, bool marked, bool recreate, const char *msysid,
    const char *mlsn, char *errbuf, size_t errlen)
{
	if (marked && !recreate)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "replication slot %s is missing but existed before (created at %s on system %s): "
		    "after a failover, a drop or a restore, events committed since its last position may "
		    "not be published; reconcile, then start once with --recreate-slot",
		    cfg->slot, mlsn, msysid);
	if (!marked && !cfg->create_slot)
		return failf(errbuf, errlen, OBX_ECONFIG,
		    "replication slot %s does not exist and create_slot = false", cfg->slot);
	return 0;
}

/* Says what was created; a recreated slot skipped what its predecessor had not confirmed. */
static void
log_created(const struct obx_config *cfg, bool marked, const char *mlsn, const char *point,
    const char *how)
{
	if (marked)
		obx_log_warn("recreated slot %s at %s%s (--recreate-slot); the previous slot was created at "
		    "%s: events committed between its last confirmed position and %s are not published",
		    cfg->slot, point, how, mlsn, point);
	else
		obx_log_info("created slot %s at %s%s", cfg->slot, point, how);
}

/*
 * A slot synchronized to a standby (17, failover) that was then promoted:
 * the same slot, at the position last copied from the former primary,
 * which may be behind what outboxd confirmed there.  Said once.
 */
static void
note_synced(const struct obx_config *cfg, obx_lsn confirmed, struct obx_pgsetup_ctx *ctx)
{
	char at[OBX_LSN_STRLEN];

	if (ctx->said_synced)
		return;
	ctx->said_synced = true;
	obx_log_info("slot %s was synchronized from the former primary before this server's "
	    "promotion: resuming at %s; events confirmed there after the last synchronization are "
	    "published again", cfg->slot, obx_lsn_format(confirmed, at, sizeof(at)));
}

/*
 * The slot exists: its pending rows are still wanted when its marker is
 * there (checked again under the snapshot's lock: the instance that held it
 * drops the marker first).  A slot synchronized from a former primary (17+)
 * comes without the marker, which is not synchronized: when it still sits
 * at the creation point the guard recorded, the snapshot may not have
 * finished there, so the rows are published again (duplicates, never a
 * loss).  Without [source] snapshot = pending a leftover marker is logged
 * (once), and waited on while another instance holds its lock.
 */
static int
snapshot_wanted(PGconn *c, const struct obx_config *cfg, const struct sqlnames *nm,
    const struct slotrow *row, bool in_recovery, struct obx_pgsetup_snapshot *snap,
    struct obx_pgsetup_ctx *ctx, char *errbuf, size_t errlen)
{
	char msysid[32], mlsn[32], legacy[64], *comment = NULL;
	bool exists = false, old = false, ours = false, marked = false;
	obx_lsn point;
	int r;

	if (in_recovery) /* a standby's slots are its own: no marker was made there */
		return 0;
	(void)obx_snapmark_legacy_name(cfg->slot, legacy, sizeof(legacy));
	if ((r = read_snapmark(c, cfg->slot, snap->marker, &exists, errbuf, errlen)) != 0 ||
	    (!exists && (r = read_legacy_mark(c, cfg->slot, legacy, &old, &ours, errbuf, errlen)) != 0))
		return r;
	if (!snap->enabled) {
		/* an earlier version's marker that may be another slot's says nothing of this one */
		if (!exists && !ours)
			return 0;
		if ((r = snapshot_lock_free(c, cfg, errbuf, errlen)) != 0)
			return r;
		if (!ctx->said_marker) {
			const char *m = exists ? snap->marker : legacy;

			ctx->said_marker = true;
			obx_log_warn("slot %s exists, so does %s: the rows pending when slot %s was created were "
			    "not all published; with [source] snapshot = pending they are published before "
			    "streaming, with none they are not (drop slot %s to stop this warning)",
			    cfg->slot, m, cfg->slot, m);
		}
		return 0;
	}
	if (!exists && !old && row->synced) {
		r = read_guard(c, cfg, nm, &comment, &marked, msysid, sizeof(msysid), mlsn, sizeof(mlsn),
		    errbuf, errlen);
		free(comment);
		if (r != 0)
			return r;
		if (!marked || obx_lsn_parse(mlsn, &point) != 0 || point != row->confirmed)
			return 0;
		obx_log_warn("slot %s was synchronized from the former primary and is still at its creation "
		    "point %s: its snapshot may not have finished there (its marker is not synchronized); "
		    "publishing the pending rows again (rows already published there are sent twice)",
		    cfg->slot, mlsn);
		if ((r = snapshot_open(c, cfg, snap, errbuf, errlen)) != 0 ||
		    (r = create_snapmark(c, cfg->slot, snap->marker, errbuf, errlen)) != 0)
			return r;
		snap->wanted = true;
		return 0;
	}
	if (!exists && !old)
		return 0;
	if ((r = snapshot_open(c, cfg, snap, errbuf, errlen)) != 0 ||
	    (r = read_snapmark(c, cfg->slot, snap->marker, &exists, errbuf, errlen)) != 0 ||
	    (r = read_legacy_mark(c, cfg->slot, legacy, &old, &ours, errbuf, errlen)) != 0)
		return r;
	snap->wanted = exists || old;
	if (ours)
		snprintf(snap->legacy, sizeof(snap->legacy), "%s", legacy);
	else if (old)
		/* it may be this slot's: its rows are published (again), and it stays */
		obx_log_warn("slot %s, the marker an earlier version made for a slot whose name begins "
		    "with %.*s, may be slot %s's or another's (another such slot exists, or another "
		    "slot's snapshot is under way): publishing the rows pending at slot %s's creation "
		    "again, and leaving it; drop it once no slot sharing that beginning has a snapshot "
		    "left unfinished by an earlier version", legacy, OBX_SNAPMARK_KEEP, cfg->slot,
		    cfg->slot, cfg->slot);
	return 0;
}

/*
 * A slot just created with its snapshot: a marker an earlier version left
 * under the old name, when it can only have been this slot's (a slot of
 * the same name dropped since), goes with the new one after the snapshot,
 * else the next start would publish the pending rows again.  A failure to
 * read it leaves it, to the same effect.
 */
static void
adopt_legacy_mark(PGconn *c, const struct obx_config *cfg, struct obx_pgsetup_snapshot *snap)
{
	char legacy[64], err[256];
	bool old, ours;

	if (obx_snapmark_legacy_name(cfg->slot, legacy, sizeof(legacy)) &&
	    read_legacy_mark(c, cfg->slot, legacy, &old, &ours, err, sizeof(err)) == 0 && ours)
		snprintf(snap->legacy, sizeof(snap->legacy), "%s", legacy);
}

int
obx_pgsetup_slot(PGconn *c, const struct obx_config *cfg, const char *sysid, bool recreate,
    bool in_recovery, struct obx_pgsetup_ctx *ctx, struct obx_pgsetup_snapshot *snap,
    obx_lsn *confirmed, bool *created, obx_lsn *born, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char msysid[32], mlsn[32], point[32], ver[32], how[64];
	char *comment = NULL;
	struct sqlnames nm;
	struct slotrow row;
	bool marked = false, raced = false, made_mark = false, slot_made = false;
	int r;

	*created = false;
	*born = 0;
	snap->wanted = snap->imported = false;
	obx_snapmark_name(cfg->slot, snap->marker, sizeof(snap->marker));
	snprintf(snap->slot, sizeof(snap->slot), "%s", cfg->slot);
	snap->legacy[0] = '\0';
	if (cfg->failover && cfg->failover_set && !f.failover_slots && !ctx->said_failover_ignored) {
		obx_log_info("[source] failover = on is ignored: PostgreSQL %s cannot synchronize slots to "
		    "standbys (17 and later can); after a failover the slot guard refuses to go on without "
		    "the slot", obx_pgversion_format(f.version, ver, sizeof(ver)));
		ctx->said_failover_ignored = true;
	}
	if ((r = sqlnames_init(&nm, c, cfg, errbuf, errlen)) != 0)
		return r;
	for (int attempt = 0; attempt < SETUP_ATTEMPTS; attempt++) {
		r = read_slot(c, cfg, &nm, in_recovery, &row, errbuf, errlen);
		if (r == 0) {
			*confirmed = row.confirmed;
			adopt_slot(c, cfg, &nm, sysid, row.confirmed, in_recovery, ctx, born);
			if (row.synced && !in_recovery)
				note_synced(cfg, row.confirmed, ctx);
			if (f.failover_slots)
				r = match_failover(c, cfg, &nm, &row, in_recovery, ctx, errbuf, errlen);
			if (r == 0)
				r = snapshot_wanted(c, cfg, &nm, &row, in_recovery, snap, ctx, errbuf, errlen);
		}
		if (r != OBX_ENOENT)
			goto out;
		free(comment);
		comment = NULL;
		r = read_guard(c, cfg, &nm, &comment, &marked, msysid, sizeof(msysid), mlsn,
		    sizeof(mlsn), errbuf, errlen);
		if (r == 0)
			r = may_create_slot(cfg, marked, recreate, msysid, mlsn, errbuf, errlen);
		if (r == 0 && snap->enabled && in_recovery)
			r = failf(errbuf, errlen, OBX_ECONFIG, "[source] snapshot = pending: slot %s would be "
			    "created on a hot standby, which cannot export the snapshot of the pending rows; "
			    "start outboxd against the primary once, or set snapshot = none", cfg->slot);
		/* the lock, then the marker: a crash after the slot's creation must find the marker */
		if (r == 0 && snap->enabled && (r = snapshot_open(c, cfg, snap, errbuf, errlen)) == 0 &&
		    (r = create_snapmark(c, cfg->slot, snap->marker, errbuf, errlen)) == 0)
			made_mark = true;
		if (r == 0)
			r = create_slot(c, cfg, &nm, in_recovery, ctx, snap->conn, confirmed, point,
			    sizeof(point), &raced, &slot_made, errbuf, errlen);
		if (r != 0 && made_mark && !slot_made && PQstatus(c) == CONNECTION_OK) {
			/* the server refused the slot (none free, say): the marker must not stay behind */
			char e2[256];

			(void)obx_pgsetup_snapshot_done(c, snap, e2, sizeof(e2));
		}
		if (r != 0)
			goto out;
		if (!raced) {
			*created = true;
			if (obx_lsn_parse(point, born) != 0)
				*born = 0;
			snap->wanted = snap->imported = snap->enabled;
			snprintf(how, sizeof(how), "%s%s", f.failover_slots && cfg->failover && !in_recovery ?
			    " with failover" : in_recovery ? " on a hot standby" : "",
			    snap->wanted ? ", exporting its snapshot" : "");
			log_created(cfg, marked, mlsn, point, how);
			if (in_recovery && f.failover_slots && cfg->failover)
				note_standby_failover(cfg, ctx);
			if (in_recovery)
				note_standby_guard(cfg, sysid, point, ctx);
			else
				record_marker(c, cfg, &nm, comment, sysid, point, false);
			if (!snap->wanted)
				warn_unpublished_rows(c, cfg, &nm);
			else
				adopt_legacy_mark(c, cfg, snap);
			goto out;
		}
		/* another instance created it a moment ago: use it */
		obx_log_info("slot %s was created concurrently", cfg->slot);
	}
	r = failf(errbuf, errlen, OBX_EIO, "slot %s was dropped each time another instance created it",
	    cfg->slot);
out:
	if (!snap->wanted || r != 0) {
		/* nothing to publish first: the lock goes with the connection */
		PQfinish(snap->conn);
		snap->conn = NULL;
		if (r != 0)
			snap->wanted = false;
	}
	free(comment);
	sqlnames_free(&nm);
	return r;
}
