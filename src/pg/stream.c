/*
 * pg/stream.c - the replication stream: the setup (pg/setup.h,
 * pg/slot.h), then START_REPLICATION, CopyData in, standby status updates
 * out, and the end of COPY.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/core/err.h"
#include "obx/pg/coverage.h"
#include "obx/pg/setup.h"
#include "obx/pg/stream.h"
#include "obx/pg/util.h"
#include "obx/core/walmsg.h"

int64_t
obx_pg_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000 - OBX_PG_EPOCH_OFFSET_US;
}

/*
 * code (see pg/setup.h) as the caller of obx_pgstream_open() acts on it:
 * 0, OBX_EIO (retry), OBX_EBUSY (the slot is in use) or OBX_EFATAL.
 */
static int
fail_class(int code)
{
	switch (code) {
	case 0:
	case OBX_EIO:
	case OBX_EBUSY:
		return code;
	default:
		return OBX_EFATAL;
	}
}

/* The START_REPLICATION command for s; NULL when out of memory.  Caller frees. */
static char *
start_sql(const struct obx_pgstream *s, const struct obx_config *cfg)
{
	char *slot, *pub, *pubs = NULL, *sql = NULL;

	slot = PQescapeIdentifier(s->conn, cfg->slot, strlen(cfg->slot));
	pub = PQescapeIdentifier(s->conn, cfg->publication, strlen(cfg->publication));
	/* publication_names is a list of (quoted) identifiers, given as a literal */
	if (pub != NULL)
		pubs = PQescapeLiteral(s->conn, pub, strlen(pub));
	if (slot != NULL && pubs != NULL &&
	    asprintf(&sql, "START_REPLICATION SLOT %s LOGICAL 0/0 (proto_version '%d', publication_names %s%s%s)",
	        slot, s->proto_version, pubs, s->streaming ? ", streaming 'on'" : "",
	        cfg->messages ? ", messages 'true'" : "") < 0)
		sql = NULL;
	PQfreemem(pubs);
	PQfreemem(pub);
	PQfreemem(slot);
	return sql;
}

/*
 * Starts streaming from the slot (at its confirmed position) and makes the
 * connection non-blocking.  Returns 0, OBX_EBUSY (the slot is active
 * elsewhere), OBX_ECONFIG (refused for good), OBX_EIO or OBX_ENOMEM.
 */
static int
start_replication(struct obx_pgstream *s, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	char err[1024];
	const char *code;
	PGresult *res;
	char *sql;
	int r = 0;

	if ((sql = start_sql(s, cfg)) == NULL) {
		snprintf(errbuf, errlen, "out of memory");
		return OBX_ENOMEM;
	}
	res = PQexec(s->conn, sql);
	free(sql);
	if (PQresultStatus(res) != PGRES_COPY_BOTH) {
		code = PQresultErrorField(res, PG_DIAG_SQLSTATE); /* owned by res */
		if (code != NULL && strcmp(code, "55006") == 0)
			r = OBX_EBUSY;
		else if (code != NULL && (strncmp(code, "42", 2) == 0 || strcmp(code, "55000") == 0))
			/* undefined objects; a slot of another database, invalidated, or
			 * wal_level below logical: none heals by retrying */
			r = OBX_ECONFIG;
		else
			r = OBX_EIO;
		obx_pg_result_error_line(res, err, sizeof(err));
		if (err[0] == '\0')
			obx_pg_error_line(s->conn, err, sizeof(err));
		snprintf(errbuf, errlen, "could not start replication on slot %s: %s", cfg->slot, err);
	} else if (PQsetnonblocking(s->conn, 1) != 0) {
		snprintf(errbuf, errlen, "could not make the connection non-blocking");
		r = OBX_EIO;
	}
	PQclear(res);
	return r;
}

/*
 * Notices on the stream's connection.  A publication dropped and created
 * again behind the slot leaves a stretch of WAL that the server cannot
 * decode with it: up to 17 pgoutput stops with an error there, but 18 warns
 * "skipped loading publication" (SQLSTATE 55000, from LoadPublications) and
 * goes on without it, so the changes of that stretch are never sent and a
 * later keepalive would let outboxd confirm past them.  The warning is kept
 * for obx_pgstream_read(), which ends the stream before the next message
 * (libpq hands notices over in their place in the stream).  Every other
 * notice goes to libpq's own receiver, as before.
 */
static void
on_notice(void *arg, const PGresult *res)
{
	struct obx_pgstream *s = arg;
	const char *code = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *fn = PQresultErrorField(res, PG_DIAG_SOURCE_FUNCTION);
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);

	if (code != NULL && strcmp(code, "55000") == 0 &&
	    ((fn != NULL && strcmp(fn, "LoadPublications") == 0) ||
	        (msg != NULL && strstr(msg, "skipped loading publication") != NULL))) {
		if (s->pub_skipped[0] == '\0')
			snprintf(s->pub_skipped, sizeof(s->pub_skipped),
			    "%s: the publication does not "
			    "exist at this point in the WAL",
			    msg != NULL ? msg : "skipped a publication");
		return;
	}
	if (s->prev_notice != NULL)
		s->prev_notice(NULL, res);
}

int
obx_pgstream_open(struct obx_pgstream *s, const struct obx_config *cfg, bool recreate_slot, bool streaming,
    struct obx_pgsetup_ctx *ctx, char *errbuf, size_t errlen)
{
	struct obx_pgsetup_slot_args sa = { .sysid = NULL };
	int r;

	memset(s, 0, sizeof(*s));
	if ((r = obx_pgsetup_connect(cfg->conninfo, cfg->password, &s->conn, errbuf, errlen)) != 0)
		goto out;
	s->prev_notice = PQsetNoticeReceiver(s->conn, on_notice, s);
	s->server_version = PQserverVersion(s->conn);
	if ((r = obx_pgsetup_protocol(s->server_version, cfg, streaming, &s->proto_version, &s->streaming, errbuf,
	         errlen)) != 0)
		goto out;
	if ((r = obx_pgsetup_identify(s->conn, s->sysid, sizeof(s->sysid), &s->timeline, &s->server_lsn, errbuf,
	         errlen)) != 0)
		goto out;
	if ((r = obx_pgsetup_check_server(s->conn, cfg, &s->wal_sender_timeout_ms, &s->in_recovery, errbuf,
	         errlen)) != 0)
		goto out;
	/* publication first: a slot created before its publication breaks decoding */
	if ((r = obx_pgsetup_publication(s->conn, cfg, s->in_recovery, errbuf, errlen)) != 0)
		goto out;
	/* what the publication holds now: the base later readings are judged against (core/coverage.h) */
	if ((r = obx_pg_coverage_read(s->conn, cfg, &s->cov_base, errbuf, errlen)) != 0)
		goto out;
	s->snap.enabled = cfg->snapshot;
	sa.sysid = s->sysid;
	sa.recreate = recreate_slot;
	sa.in_recovery = s->in_recovery;
	sa.confirmed = s->start_confirmed;
	r = obx_pgsetup_slot(s->conn, cfg, &sa, ctx, &s->snap, errbuf, errlen);
	s->start_confirmed = sa.confirmed;
	s->slot_made = sa.created;
	s->slot_created = sa.born;
	if (r != 0)
		goto out;
	if (s->snap.wanted) {
		/* the replication connection waits in command mode meanwhile: no idle_session_timeout
		 * (14+) may end it */
		PGresult *res = PQexec(s->conn,
		    "SELECT set_config('idle_session_timeout', '0', false) "
		    "WHERE current_setting('server_version_num')::int >= 140000");

		PQclear(res);
		return 0; /* the caller publishes the pending rows, then obx_pgstream_start() */
	}
	r = start_replication(s, cfg, errbuf, errlen);
out:
	return fail_class(r);
}

int
obx_pgstream_start(struct obx_pgstream *s, const struct obx_config *cfg, char *errbuf, size_t errlen)
{
	int r;

	/* the marker goes before the snapshot's transaction ends: whoever finds the marker then
	 * also finds the transaction's lock taken (snapshot.c) */
	r = s->snap.wanted ? obx_pgsetup_snapshot_done(s->conn, &s->snap, errbuf, errlen) : 0;
	PQfinish(s->snap.conn);
	s->snap.conn = NULL;
	if (r != 0)
		return fail_class(r);
	s->snap.wanted = false;
	return fail_class(start_replication(s, cfg, errbuf, errlen));
}

int
obx_pgstream_fd(const struct obx_pgstream *s)
{
	return PQsocket(s->conn);
}

int
obx_pgstream_consume(struct obx_pgstream *s, char *errbuf, size_t errlen)
{
	if (PQconsumeInput(s->conn) == 0) {
		obx_pg_error_line(s->conn, errbuf, errlen);
		return OBX_EIO;
	}
	return 0;
}

int
obx_pgstream_read(struct obx_pgstream *s, const uint8_t **buf, size_t *len, char *errbuf, size_t errlen)
{
	char *copybuf = NULL;
	int n;

	if (s->copybuf != NULL) {
		PQfreemem(s->copybuf);
		s->copybuf = NULL;
	}
	n = PQgetCopyData(s->conn, &copybuf, 1);
	if (s->pub_skipped[0] != '\0') {
		/* nothing after the warning is used: the stretch it skipped is not in it */
		if (copybuf != NULL)
			PQfreemem(copybuf);
		snprintf(errbuf, errlen, "%s", s->pub_skipped);
		return OBX_ENOENT;
	}
	if (n > 0) {
		s->copybuf = (uint8_t *)copybuf;
		*buf = s->copybuf;
		*len = (size_t)n;
		return 1;
	}
	if (n == 0)
		return 0;
	if (n == -1) {
		PGresult *r = PQgetResult(s->conn);
		const char *code = r != NULL ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
		const char *primary = r != NULL ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : NULL;
		const char *fn = r != NULL ? PQresultErrorField(r, PG_DIAG_SOURCE_FUNCTION) : NULL;
		/* pgoutput: 'publication "%s" does not exist' (undefined_object) while decoding, raised by
		 * GetPublicationByName(): the function's name is never translated, the message may be */
		bool no_pub = code != NULL && strcmp(code, "42704") == 0 &&
		    ((fn != NULL && strcmp(fn, "GetPublicationByName") == 0) ||
		        (primary != NULL && strncmp(primary, "publication \"", 13) == 0));

		if (r != NULL && PQresultStatus(r) != PGRES_COMMAND_OK)
			obx_pg_result_error_line(r, errbuf, errlen);
		else
			snprintf(errbuf, errlen, "the server ended the replication stream");
		PQclear(r);
		return no_pub ? OBX_ENOENT : OBX_EIO;
	}
	obx_pg_error_line(s->conn, errbuf, errlen);
	return OBX_EIO;
}

int
obx_pgstream_send_status(struct obx_pgstream *s, obx_lsn write, obx_lsn flush, bool reply, char *errbuf,
    size_t errlen)
{
	uint8_t msg[OBX_STATUS_UPDATE_LEN];

	/* never report a position below what the slot had already confirmed */
	if (flush < s->start_confirmed)
		flush = s->start_confirmed;
	if (write < flush)
		write = flush;
	obx_walmsg_status(msg, write, flush, flush, obx_pg_now(), reply);
	if (PQputCopyData(s->conn, (const char *)msg, sizeof(msg)) <= 0) {
		obx_pg_error_line(s->conn, errbuf, errlen);
		return OBX_EIO;
	}
	return 0;
}

int
obx_pgstream_flush(struct obx_pgstream *s)
{
	int r = PQflush(s->conn);

	return r < 0 ? OBX_EIO : r;
}

void
obx_pgstream_close(struct obx_pgstream *s)
{
	PQfinish(s->snap.conn);
	s->snap.conn = NULL;
	if (s->copybuf != NULL)
		PQfreemem(s->copybuf);
	s->copybuf = NULL;
	if (s->conn != NULL && PQstatus(s->conn) == CONNECTION_OK && PQputCopyEnd(s->conn, NULL) == 1) {
		int64_t deadline = obx_pg_now() + 2000000;

		/* drain until the server ends COPY too (so a last error is not missed); bounded */
		while (obx_pg_now() < deadline) {
			struct pollfd p = { PQsocket(s->conn), POLLIN, 0 };
			char *buf = NULL;
			int n;

			if (PQflush(s->conn) == 1)
				p.events |= POLLOUT;
			n = PQgetCopyData(s->conn, &buf, 1);
			if (buf != NULL)
				PQfreemem(buf);
			if (n < 0)
				break;
			if (n == 0 && (poll(&p, 1, 100) < 0 || PQconsumeInput(s->conn) == 0))
				break;
		}
		for (int i = 0; i < 4; i++) {
			PGresult *r;

			if (PQisBusy(s->conn))
				break;
			if ((r = PQgetResult(s->conn)) == NULL)
				break;
			PQclear(r);
		}
	}
	if (s->conn != NULL)
		PQfinish(s->conn);
	s->conn = NULL;
	obx_cov_reset(&s->cov_base);
}
