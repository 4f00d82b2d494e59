/*
 * pg/setup_query.c - what every step of the setup runs its commands with:
 * the escaped names of cfg's objects, a command, and a command that may
 * wait on the server (see pg/setup_int.h).
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/pg/setup_int.h"
#include "obx/pg/util.h"
#include "obx/sys/log.h"

int
obx_pgsetup_failf(char *errbuf, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
	return code;
}

void
obx_pgsetup_names_free(struct obx_pgsetup_names *n)
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

int
obx_pgsetup_names_init(struct obx_pgsetup_names *n, PGconn *c, const struct obx_config *cfg, char *errbuf,
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
	if (!n->pub_ident || !n->pub_lit || !n->slot_ident || !n->slot_lit || !n->schema_lit || !n->table_lit ||
	    !n->qualified) {
		obx_pgsetup_names_free(n);
		return obx_pgsetup_failf(errbuf, errlen, OBX_ENOMEM, "out of memory");
	}
	return 0;
}

int
obx_pgsetup_query(PGconn *c, const char *sql, PGresult **out, char sqlstate[6], char *errbuf, size_t errlen)
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

int
obx_pgsetup_query_waiting(PGconn *c, const char *sql, int timeout_ms, struct obx_pgsetup_ctx *ctx, PGresult **out,
    char sqlstate[6], char *errbuf, size_t errlen)
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
			char cerr[256];

			if (cn != NULL)
				PQcancel(cn, cerr, sizeof(cerr));
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
