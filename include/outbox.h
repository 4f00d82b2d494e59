/*
 * outbox.h - liboutbox: both halves of the transactional outbox pattern for
 * C and C++ services, next to the outboxd relay.
 *
 *   Writer:   outbox_write() adds an event to the outbox table inside the
 *             caller's open transaction, so the event commits or rolls back
 *             with the business change.  outboxd publishes it to Kafka.
 *   Consumer: outbox_consume() runs the caller's handler and marks the
 *             message in the inbox table in ONE transaction, so a message
 *             delivered twice (Kafka delivers at least once) has its effect
 *             once; the Kafka offset is stored only after that commit.
 *
 * Errors: functions return OUTBOX_OK (0), a positive outcome (OUTBOX_DUPLICATE)
 * or a negative OUTBOX_ERR_*; outbox_strerror() names it, and functions that
 * take (errbuf, errlen) write one line with the detail there.
 *
 * Ownership: handles are created with *_new() and freed with *_free()
 * (NULL is a no-op).  They borrow the PGconn (and rd_kafka_t) given to them,
 * which must outlive them; liboutbox never closes a connection.
 *
 * Threads: a handle, like a PGconn, is used by one thread at a time;
 * different handles on different connections are independent.
 *
 * Version: OUTBOX_VERSION_* at build time, outbox_version() at run time; the
 * shared library's soname changes with the major version.
 */
#ifndef OUTBOX_H
#define OUTBOX_H

#include <stddef.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#ifdef __cplusplus
extern "C" {
#endif

#define OUTBOX_VERSION_MAJOR 0
#define OUTBOX_VERSION_MINOR 1
#define OUTBOX_VERSION_PATCH 0

enum outbox_result {
	OUTBOX_OK = 0,
	OUTBOX_DUPLICATE = 1,               /* the consumer already processed this message */
	OUTBOX_ERR_INVALID = -1,            /* an argument is missing or malformed (e.g. payload not JSON) */
	OUTBOX_ERR_NOT_IN_TRANSACTION = -2, /* outbox_write() outside BEGIN ... COMMIT: nothing written */
	OUTBOX_ERR_DB = -3,      /* PostgreSQL reported an error, or COMMIT rolled back (detail in errbuf) */
	OUTBOX_ERR_HANDLER = -4, /* the handler failed: rolled back, the message will come again */
	OUTBOX_ERR_NO_ID = -5,   /* the Kafka message has no "id" header */
	OUTBOX_ERR_NOMEM = -6,
	OUTBOX_ERR_KAFKA = -7, /* storing the offset or seeking back failed */
};

/* "0.1.0"; static. */
const char *outbox_version(void);

/* A static phrase for a result code; never NULL. */
const char *outbox_strerror(int result);

/* ---- writer -------------------------------------------------------------- */

/*
 * The outbox table and its columns; the same names as outboxd's [outbox]
 * section.  outbox_writer_config_init() fills Debezium's defaults
 * (table public.outbox; id, aggregatetype, aggregateid, type, payload; no
 * headers column).  Strings are borrowed until outbox_writer_new() returns.
 */
struct outbox_writer_config {
	const char *schema;
	const char *table;
	const char *col_id;
	const char *col_aggregate_type;
	const char *col_key;
	const char *col_type;
	const char *col_payload;
	const char *col_headers; /* NULL or "": no headers column */
};

void outbox_writer_config_init(struct outbox_writer_config *cfg);

typedef struct outbox_writer outbox_writer;

/*
 * Creates a writer on conn (borrowed).  The INSERT (and DELETE) are prepared
 * on first use.  Returns the writer, or NULL with errbuf filled.
 */
outbox_writer *outbox_writer_new(PGconn *conn, const struct outbox_writer_config *cfg, char *errbuf,
    size_t errlen);
void outbox_writer_free(outbox_writer *w);

struct outbox_event {
	const char *aggregate_type; /* required */
	const char *aggregate_id;   /* required: the Kafka key */
	const char *type;           /* required */
	const char *payload;        /* JSON text, validated; NULL: a tombstone */
	const char *headers;        /* NULL, or a JSON object (needs a headers column) */
	int delete_after;           /* delete the row again in the same transaction */
};

/*
 * Adds ev to the outbox inside the connection's open transaction.  Writes
 * the new event's id (the table's generated id, as text) into id_out when
 * it is not NULL (idlen >= 37 holds a UUID).
 * Returns OUTBOX_OK; OUTBOX_ERR_NOT_IN_TRANSACTION (nothing written);
 * OUTBOX_ERR_INVALID (bad JSON, missing field: nothing written);
 * OUTBOX_ERR_DB (the transaction is now aborted: roll it back).
 */
int outbox_write(outbox_writer *w, const struct outbox_event *ev, char *id_out, size_t idlen, char *errbuf,
    size_t errlen);

/* ---- consumer ------------------------------------------------------------ */

typedef struct outbox_consumer outbox_consumer;

/*
 * The handler runs inside the inbox transaction on conn: do the effect with
 * conn and return 0, leaving the transaction open (no COMMIT or ROLLBACK of
 * its own); any other return rolls the effect and the inbox mark back.  msg may be NULL when called through outbox_consume_id().
 */
typedef int (*outbox_handler)(PGconn *conn, const rd_kafka_message_t *msg, void *arg);

/*
 * Creates a consumer named name (the inbox's first key column) on conn
 * (borrowed), marking messages in inbox_table ("inbox" when NULL; see
 * sql/007_inbox.sql).  rk (borrowed, may be NULL) is the Kafka consumer whose
 * offsets outbox_consume() stores; it should run with
 * enable.auto.offset.store=false.  Returns NULL with errbuf filled.
 */
outbox_consumer *outbox_consumer_new(PGconn *conn, rd_kafka_t *rk, const char *name, const char *inbox_table,
    char *errbuf, size_t errlen);
void outbox_consumer_free(outbox_consumer *c);

/*
 * Processes one delivered message exactly once in effect: BEGIN; insert
 * (name, id header) into the inbox ON CONFLICT DO NOTHING; if it was there,
 * ROLLBACK and return OUTBOX_DUPLICATE; else run the handler and COMMIT.
 * A handler that returns 0 after a statement of its own failed (error
 * swallowed) leaves an aborted transaction, which COMMIT rolls back: that
 * returns OUTBOX_ERR_DB, with neither the effect nor the inbox mark kept;
 * so does a handler that ended the transaction itself.
 * Only after the commit (or a duplicate) is the message's offset stored; on
 * OUTBOX_ERR_HANDLER or OUTBOX_ERR_DB the partition is sought back to the
 * message, so it is delivered again.  The connection must not be inside a
 * transaction.
 */
int outbox_consume(outbox_consumer *c, const rd_kafka_message_t *msg, outbox_handler handler, void *arg,
    char *errbuf, size_t errlen);

/* The same with a message id only (no offsets involved). */
int outbox_consume_id(outbox_consumer *c, const char *message_id, outbox_handler handler, void *arg, char *errbuf,
    size_t errlen);

/*
 * Copies the first value of header name ("id", "type", "lsn", "seq", ...)
 * into buf as a NUL-terminated string.  outboxd writes its own headers
 * first and refuses user headers of those names, so this is outboxd's, as
 * its restart de-duplication reads it.  Returns buf, or NULL when the
 * header is missing, null or does not fit.
 */
char *outbox_header(const rd_kafka_message_t *msg, const char *name, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
