/*
 * liboutbox: the writer and the idempotent consumer of the outbox pattern.
 * See include/outbox.h for the contracts.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "outbox.h"

#define STR_(x) #x
#define STR(x) STR_(x)

struct outbox_writer {
	PGconn *conn;
	char *insert_sql;
	char *delete_sql;
	char stmt_insert[48];
	char stmt_delete[48];
	int prepared; /* the backend pid the statements were prepared on */
	int has_headers;
};

struct outbox_consumer {
	PGconn *conn;
	rd_kafka_t *rk;
	char *name;
	char *mark_sql;
};

const char *
outbox_version(void)
{
	return STR(OUTBOX_VERSION_MAJOR) "." STR(OUTBOX_VERSION_MINOR) "." STR(OUTBOX_VERSION_PATCH);
}

const char *
outbox_strerror(int result)
{
	switch (result) {
	case OUTBOX_OK:
		return "ok";
	case OUTBOX_DUPLICATE:
		return "duplicate: already processed";
	case OUTBOX_ERR_INVALID:
		return "invalid argument";
	case OUTBOX_ERR_NOT_IN_TRANSACTION:
		return "not inside a transaction block";
	case OUTBOX_ERR_DB:
		return "database error";
	case OUTBOX_ERR_HANDLER:
		return "handler failed";
	case OUTBOX_ERR_NO_ID:
		return "message has no id header";
	case OUTBOX_ERR_NOMEM:
		return "out of memory";
	case OUTBOX_ERR_KAFKA:
		return "kafka error";
	}
	return "unknown result";
}

static int fail(char *errbuf, size_t errlen, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int
fail(char *errbuf, size_t errlen, int code, const char *fmt, ...)
{
	va_list ap;

	if (errbuf != NULL && errlen > 0) {
		va_start(ap, fmt);
		vsnprintf(errbuf, errlen, fmt, ap);
		va_end(ap);
		/* one line: libpq messages end with a newline */
		for (char *p = errbuf; *p != '\0'; p++)
			if (*p == '\n')
				*p = p[1] ? ' ' : '\0';
	}
	return code;
}

void
outbox_writer_config_init(struct outbox_writer_config *cfg)
{
	cfg->schema = "public";
	cfg->table = "outbox";
	cfg->col_id = "id";
	cfg->col_aggregate_type = "aggregatetype";
	cfg->col_key = "aggregateid";
	cfg->col_type = "type";
	cfg->col_payload = "payload";
	cfg->col_headers = NULL;
}

static char *
ident(PGconn *c, const char *s)
{
	return s != NULL && s[0] != '\0' ? PQescapeIdentifier(c, s, strlen(s)) : NULL;
}

outbox_writer *
outbox_writer_new(PGconn *conn, const struct outbox_writer_config *cfg, char *errbuf, size_t errlen)
{
	struct outbox_writer *w;
	char *sc, *tb, *id, *at, *key, *ty, *pl, *hd;
	int ok;

	if (conn == NULL || cfg == NULL) {
		fail(errbuf, errlen, OUTBOX_ERR_INVALID, "outbox_writer_new: conn and cfg are required");
		return NULL;
	}
	w = calloc(1, sizeof(*w));
	if (w == NULL) {
		fail(errbuf, errlen, OUTBOX_ERR_NOMEM, "out of memory");
		return NULL;
	}
	w->conn = conn;
	sc = ident(conn, cfg->schema);
	tb = ident(conn, cfg->table);
	id = ident(conn, cfg->col_id);
	at = ident(conn, cfg->col_aggregate_type);
	key = ident(conn, cfg->col_key);
	ty = ident(conn, cfg->col_type);
	pl = ident(conn, cfg->col_payload);
	hd = ident(conn, cfg->col_headers);
	w->has_headers = hd != NULL;
	ok = sc && tb && id && at && key && ty && pl;
	if (ok && hd != NULL)
		ok = asprintf(&w->insert_sql,
		         "INSERT INTO %s.%s (%s, %s, %s, %s, %s) VALUES ($1, $2, $3, $4, $5) "
		         "RETURNING %s::text",
		         sc, tb, at, key, ty, pl, hd, id) > 0;
	else if (ok)
		ok = asprintf(&w->insert_sql,
		         "INSERT INTO %s.%s (%s, %s, %s, %s) VALUES ($1, $2, $3, $4) "
		         "RETURNING %s::text",
		         sc, tb, at, key, ty, pl, id) > 0;
	/*
	 * $1 compared with the bare column takes the column's own type at
	 * PREPARE (uuid, bigint, ...), so the primary key's index finds the
	 * row; a cast of the column (id::text) would scan the whole table.
	 */
	if (ok)
		ok = asprintf(&w->delete_sql, "DELETE FROM %s.%s WHERE %s = $1", sc, tb, id) > 0;
	PQfreemem(sc);
	PQfreemem(tb);
	PQfreemem(id);
	PQfreemem(at);
	PQfreemem(key);
	PQfreemem(ty);
	PQfreemem(pl);
	PQfreemem(hd);
	if (!ok) {
		fail(errbuf, errlen, OUTBOX_ERR_INVALID, "outbox_writer_new: a table or column name is missing");
		outbox_writer_free(w);
		return NULL;
	}
	snprintf(w->stmt_insert, sizeof(w->stmt_insert), "outbox_insert_%p", (void *)w);
	snprintf(w->stmt_delete, sizeof(w->stmt_delete), "outbox_delete_%p", (void *)w);
	return w;
}

void
outbox_writer_free(outbox_writer *w)
{
	if (w == NULL)
		return;
	free(w->insert_sql);
	free(w->delete_sql);
	free(w);
}

static int
prepare(outbox_writer *w, char *errbuf, size_t errlen)
{
	PGresult *r;

	/* prepared statements live per session: prepare again after a reconnect */
	if (w->prepared == PQbackendPID(w->conn))
		return OUTBOX_OK;
	r = PQprepare(w->conn, w->stmt_insert, w->insert_sql, 0, NULL);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		int rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "could not prepare the outbox insert: %s",
		    PQresultErrorMessage(r));

		PQclear(r);
		return rc;
	}
	PQclear(r);
	r = PQprepare(w->conn, w->stmt_delete, w->delete_sql, 0, NULL);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		int rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "could not prepare the outbox delete: %s",
		    PQresultErrorMessage(r));

		PQclear(r);
		return rc;
	}
	PQclear(r);
	w->prepared = PQbackendPID(w->conn);
	return OUTBOX_OK;
}

static int
check_json(const char *what, const char *text, int want_object, char *errbuf, size_t errlen)
{
	json_error_t err;
	json_t *j = json_loads(text, JSON_DECODE_ANY, &err);
	int bad_kind;

	if (j == NULL)
		return fail(errbuf, errlen, OUTBOX_ERR_INVALID, "%s is not valid JSON: %s (line %d, column %d)",
		    what, err.text, err.line, err.column);
	bad_kind = want_object && !json_is_object(j);
	json_decref(j);
	if (bad_kind)
		return fail(errbuf, errlen, OUTBOX_ERR_INVALID, "%s must be a JSON object", what);
	return OUTBOX_OK;
}

int
outbox_write(outbox_writer *w, const struct outbox_event *ev, char *id_out, size_t idlen, char *errbuf,
    size_t errlen)
{
	const char *params[5];
	PGresult *r;
	int rc;

	if (w == NULL || ev == NULL || ev->aggregate_type == NULL || ev->aggregate_id == NULL || ev->type == NULL)
		return fail(errbuf, errlen, OUTBOX_ERR_INVALID,
		    "outbox_write: aggregate_type, aggregate_id and type are required");
	if (PQtransactionStatus(w->conn) != PQTRANS_INTRANS)
		return fail(errbuf, errlen, OUTBOX_ERR_NOT_IN_TRANSACTION,
		    "outbox_write: the connection is not inside a transaction block (BEGIN first): "
		    "the event must commit with the business change; nothing written");
	if (ev->payload != NULL && (rc = check_json("payload", ev->payload, 0, errbuf, errlen)) != 0)
		return rc;
	if (ev->headers != NULL) {
		if (!w->has_headers)
			return fail(errbuf, errlen, OUTBOX_ERR_INVALID,
			    "outbox_write: headers given but the writer has no headers column");
		if ((rc = check_json("headers", ev->headers, 1, errbuf, errlen)) != 0)
			return rc;
	}
	if ((rc = prepare(w, errbuf, errlen)) != 0)
		return rc;
	params[0] = ev->aggregate_type;
	params[1] = ev->aggregate_id;
	params[2] = ev->type;
	params[3] = ev->payload;
	params[4] = ev->headers;
	r = PQexecPrepared(w->conn, w->stmt_insert, w->has_headers ? 5 : 4, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
		rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "could not insert into the outbox: %s",
		    PQresultErrorMessage(r));
		PQclear(r);
		return rc;
	}
	if (id_out != NULL && idlen > 0)
		snprintf(id_out, idlen, "%s", PQgetvalue(r, 0, 0));
	if (ev->delete_after) {
		const char *id[1] = { PQgetvalue(r, 0, 0) };
		PGresult *d = PQexecPrepared(w->conn, w->stmt_delete, 1, id, NULL, NULL, 0);

		if (PQresultStatus(d) != PGRES_COMMAND_OK) {
			rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "could not delete the outbox row again: %s",
			    PQresultErrorMessage(d));
			PQclear(d);
			PQclear(r);
			return rc;
		}
		PQclear(d);
	}
	PQclear(r);
	return OUTBOX_OK;
}

/* ---- consumer ------------------------------------------------------------ */

outbox_consumer *
outbox_consumer_new(PGconn *conn, rd_kafka_t *rk, const char *name, const char *inbox_table, char *errbuf,
    size_t errlen)
{
	struct outbox_consumer *c;
	char *tb;

	if (conn == NULL || name == NULL || name[0] == '\0') {
		fail(errbuf, errlen, OUTBOX_ERR_INVALID, "outbox_consumer_new: conn and name are required");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (c == NULL || (c->name = strdup(name)) == NULL) {
		free(c);
		fail(errbuf, errlen, OUTBOX_ERR_NOMEM, "out of memory");
		return NULL;
	}
	c->conn = conn;
	c->rk = rk;
	tb = ident(conn, inbox_table != NULL ? inbox_table : "inbox");
	if (tb == NULL ||
	    asprintf(&c->mark_sql,
	        "INSERT INTO %s (consumer, message_id) VALUES ($1, $2) "
	        "ON CONFLICT DO NOTHING",
	        tb) < 0) {
		PQfreemem(tb);
		outbox_consumer_free(c);
		fail(errbuf, errlen, OUTBOX_ERR_NOMEM, "out of memory");
		return NULL;
	}
	PQfreemem(tb);
	return c;
}

void
outbox_consumer_free(outbox_consumer *c)
{
	if (c == NULL)
		return;
	free(c->name);
	free(c->mark_sql);
	free(c);
}

static int
simple(PGconn *conn, const char *sql, char *errbuf, size_t errlen)
{
	PGresult *r = PQexec(conn, sql);
	int rc = OUTBOX_OK;

	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "%s failed: %s", sql, PQresultErrorMessage(r));
	PQclear(r);
	return rc;
}

/*
 * COMMIT, which PostgreSQL answers with the tag ROLLBACK (and the same
 * status) when the transaction was aborted: a statement of the handler
 * failed and the handler went on.  Then nothing was kept, the effect nor
 * the inbox mark.  Returns OUTBOX_OK only when the transaction committed.
 */
static int
commit(PGconn *conn, const char *id, char *errbuf, size_t errlen)
{
	PGresult *r;
	int rc = OUTBOX_OK;

	/* the handler ended the transaction itself (its own COMMIT or ROLLBACK): a COMMIT now
	 * would answer COMMIT with nothing to commit, and no one can tell what was kept */
	if (PQtransactionStatus(conn) == PQTRANS_IDLE)
		return fail(errbuf, errlen, OUTBOX_ERR_DB,
		    "the handler of message %s ended the transaction "
		    "itself (COMMIT or ROLLBACK): the inbox mark may be gone, it will be delivered again "
		    "(a handler must leave the transaction open)",
		    id);
	r = PQexec(conn, "COMMIT");

	if (PQresultStatus(r) != PGRES_COMMAND_OK)
		rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "COMMIT failed for message %s: %s", id,
		    PQresultErrorMessage(r));
	else if (strcmp(PQcmdStatus(r), "COMMIT") != 0)
		rc = fail(errbuf, errlen, OUTBOX_ERR_DB,
		    "the transaction of message %s was aborted: COMMIT "
		    "answered %s (a statement inside the handler failed although the handler returned 0); "
		    "nothing was kept, it will be delivered again",
		    id, PQcmdStatus(r));
	PQclear(r);
	return rc;
}

static int
run_once(outbox_consumer *c, const char *id, const rd_kafka_message_t *msg, outbox_handler handler, void *arg,
    char *errbuf, size_t errlen)
{
	const char *params[2] = { c->name, id };
	PGresult *r;
	int rc;

	if (PQtransactionStatus(c->conn) != PQTRANS_IDLE)
		return fail(errbuf, errlen, OUTBOX_ERR_INVALID,
		    "outbox_consume: the connection is already inside a transaction");
	if ((rc = simple(c->conn, "BEGIN", errbuf, errlen)) != 0)
		return rc;
	r = PQexecParams(c->conn, c->mark_sql, 2, NULL, params, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		rc = fail(errbuf, errlen, OUTBOX_ERR_DB, "could not mark message %s in the inbox: %s", id,
		    PQresultErrorMessage(r));
		PQclear(r);
		simple(c->conn, "ROLLBACK", NULL, 0);
		return rc;
	}
	if (strcmp(PQcmdTuples(r), "0") == 0) {
		PQclear(r);
		simple(c->conn, "ROLLBACK", NULL, 0);
		return OUTBOX_DUPLICATE;
	}
	PQclear(r);
	if (handler(c->conn, msg, arg) != 0) {
		simple(c->conn, "ROLLBACK", NULL, 0);
		return fail(errbuf, errlen, OUTBOX_ERR_HANDLER,
		    "handler failed for message %s: rolled back, it will be delivered again", id);
	}
	return commit(c->conn, id, errbuf, errlen);
}

int
outbox_consume_id(outbox_consumer *c, const char *message_id, outbox_handler handler, void *arg, char *errbuf,
    size_t errlen)
{
	if (c == NULL || message_id == NULL || handler == NULL)
		return fail(errbuf, errlen, OUTBOX_ERR_INVALID, "outbox_consume_id: missing argument");
	return run_once(c, message_id, NULL, handler, arg, errbuf, errlen);
}

int
outbox_consume(outbox_consumer *c, const rd_kafka_message_t *msg, outbox_handler handler, void *arg, char *errbuf,
    size_t errlen)
{
	char id[256];
	int rc;

	if (c == NULL || msg == NULL || handler == NULL)
		return fail(errbuf, errlen, OUTBOX_ERR_INVALID, "outbox_consume: missing argument");
	if (outbox_header(msg, "id", id, sizeof(id)) == NULL)
		return fail(errbuf, errlen, OUTBOX_ERR_NO_ID, "message at %s [%d] offset %lld has no id header",
		    rd_kafka_topic_name(msg->rkt), (int)msg->partition, (long long)msg->offset);
	rc = run_once(c, id, msg, handler, arg, errbuf, errlen);
	if (c->rk == NULL)
		return rc;
	if (rc == OUTBOX_OK || rc == OUTBOX_DUPLICATE) {
		/* only now is the message done: a crash before this line redelivers it */
		rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
		rd_kafka_resp_err_t e;

		rd_kafka_topic_partition_list_add(l, rd_kafka_topic_name(msg->rkt), msg->partition)->offset =
		    msg->offset + 1;
		e = rd_kafka_offsets_store(c->rk, l);
		rd_kafka_topic_partition_list_destroy(l);
		if (e != RD_KAFKA_RESP_ERR_NO_ERROR)
			return fail(errbuf, errlen, OUTBOX_ERR_KAFKA, "could not store the offset: %s",
			    rd_kafka_err2str(e));
	} else {
		/* not done: go back so the same message is delivered again */
		rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
		rd_kafka_error_t *e;

		rd_kafka_topic_partition_list_add(l, rd_kafka_topic_name(msg->rkt), msg->partition)->offset =
		    msg->offset;
		e = rd_kafka_seek_partitions(c->rk, l, 5000);
		rd_kafka_topic_partition_list_destroy(l);
		if (e != NULL)
			rd_kafka_error_destroy(e);
	}
	return rc;
}

/* The first occurrence: outboxd writes its own headers before any user header. */
char *
outbox_header(const rd_kafka_message_t *msg, const char *name, char *buf, size_t len)
{
	rd_kafka_headers_t *h = NULL;
	const void *v;
	size_t sz;

	if (msg == NULL || name == NULL || buf == NULL || len == 0 ||
	    rd_kafka_message_headers(msg, &h) != RD_KAFKA_RESP_ERR_NO_ERROR ||
	    rd_kafka_header_get(h, 0, name, &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR || v == NULL || sz >= len)
		return NULL;
	memcpy(buf, v, sz);
	buf[sz] = '\0';
	return buf;
}
