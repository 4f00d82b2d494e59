/*
 * pg/connect.c - the replication connection and the server it reaches:
 * connect with replication=database, the pgoutput protocol the release
 * speaks, IDENTIFY_SYSTEM, wal_level, wal_sender_timeout and whether the
 * server is a hot standby (see pg/setup.h).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/pgversion.h"
#include "obx/pg/setup_int.h"
#include "obx/pg/util.h"
#include "obx/sys/log.h"

int
obx_pgsetup_connect(const char *conninfo, const char *password, PGconn **out, char *errbuf, size_t errlen)
{
	static const char *const kw[] = { "replication", NULL };
	static const char *const val[] = { "database", NULL };
	char err[1024];
	PGresult *res;
	int r;

	/* obx_pg_connect() tells a refusal that cannot heal (OBX_ECONFIG) from one that may */
	r = obx_pg_connect(conninfo, password, kw, val, "outboxd", out, err, sizeof(err));
	if (r == OBX_EIO || r == OBX_ECONFIG)
		r = obx_pgsetup_failf(errbuf, errlen, r, "could not connect to PostgreSQL: %s", err);
	else if (r != 0)
		r = obx_pgsetup_failf(errbuf, errlen, r, "%s", err);
	if (r != 0)
		return r;
	/* the stream's warnings must reach outboxd (PostgreSQL 18 warns, instead of failing,
	 * when it skips a publication: pg/stream.c), whatever the role's setting */
	if (obx_pgsetup_query(*out, "SET client_min_messages TO warning", &res, NULL, err, sizeof(err)) != 0) {
		PQfinish(*out);
		*out = NULL;
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not set client_min_messages: %s", err);
	}
	PQclear(res);
	return 0;
}

int
obx_pgsetup_protocol(int server_version, const struct obx_config *cfg, bool want_streaming, int *proto_version,
    bool *streaming, char *errbuf, size_t errlen)
{
	struct obx_pgfacts f;
	char ver[32];
	int r;

	if ((r = obx_pgfacts_for(server_version, &f, errbuf, errlen)) != 0)
		return r;
	obx_pgversion_format(server_version, ver, sizeof(ver));
	*proto_version = f.proto;
	if (cfg->messages && !f.messages)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "[source] messages = on needs PostgreSQL 14 or later (server is %s)", ver);
	*streaming = want_streaming && f.streaming;
	if (want_streaming && !*streaming)
		obx_log_warn("[source] streaming = on needs PostgreSQL 14 or later (server is %s): "
		             "not streaming",
		    ver);
	return 0;
}

int
obx_pgsetup_identify(PGconn *c, char *sysid, size_t sysidlen, int *timeline, obx_lsn *xlogpos, char *errbuf,
    size_t errlen)
{
	char err[1024];
	const char *bad = NULL;
	PGresult *res;
	long long tli = 0;
	int r;

	if (obx_pgsetup_query(c, "IDENTIFY_SYSTEM", &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "IDENTIFY_SYSTEM failed: %s", err);
	if (PQntuples(res) != 1 || PQnfields(res) < 4 || PQgetisnull(res, 0, 3)) {
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EPROTO,
		    "IDENTIFY_SYSTEM did not name a database: "
		    "the connection is not a logical replication connection");
	} else if ((tli = strtonum(PQgetvalue(res, 0, 1), 1, INT32_MAX, &bad)) == 0 || bad != NULL ||
	    obx_lsn_parse(PQgetvalue(res, 0, 2), xlogpos) != 0) {
		r = obx_pgsetup_failf(errbuf, errlen, OBX_EPROTO,
		    "IDENTIFY_SYSTEM answered timeline '%s' and xlogpos "
		    "'%s', out of form",
		    PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2));
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
	if (obx_pgsetup_query(c, sql, &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO, "could not read %s: %s", name, err);
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
	if (obx_parse_duration_ms(v, 0, 1LL << 31, &ms) != 0 && obx_parse_int(v, 0, 1LL << 31, &ms) != 0)
		return OBX_EINVAL;
	*out = (int)ms;
	return 0;
}

int
obx_pgsetup_check_server(PGconn *c, const struct obx_config *cfg, int *wal_sender_timeout_ms, bool *in_recovery,
    char *errbuf, size_t errlen)
{
	struct obx_pgfacts f = obx_pg_facts(c);
	char v[256], err[1024], ver[32];
	PGresult *res;
	int r;

	(void)cfg;
	if (obx_pgsetup_query(c, "SELECT pg_is_in_recovery()", &res, NULL, err, sizeof(err)) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EIO,
		    "could not ask whether the server is in recovery: %s", err);
	*in_recovery = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (*in_recovery && !f.standby_decoding)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "the server is a hot standby (in recovery) and PostgreSQL %s cannot decode there "
		    "(16 and later can): point [source] conninfo at the primary (with several hosts, "
		    "add target_session_attrs=read-write)",
		    obx_pgversion_format(f.version, ver, sizeof(ver)));
	if ((r = show(c, "wal_level", v, sizeof(v), errbuf, errlen)) != 0)
		return r;
	if (strcmp(v, "logical") != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_ECONFIG,
		    "wal_level is '%s' but logical replication needs wal_level = logical "
		    "(set it in postgresql.conf and restart the server)",
		    v);
	if ((r = show(c, "wal_sender_timeout", v, sizeof(v), errbuf, errlen)) != 0)
		return r;
	if (parse_guc_ms(v, wal_sender_timeout_ms) != 0)
		return obx_pgsetup_failf(errbuf, errlen, OBX_EPROTO, "cannot parse wal_sender_timeout '%s'", v);
	/* a short wal_sender_timeout is no reason to refuse: the relay sends status updates
	 * at a third of it when that is sooner than [source] status_interval */
	return 0;
}
