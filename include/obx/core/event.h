/*
 * event.h - the event builder (pure): one outbox row inserted by a committed
 * transaction -> one Kafka record (topic from the template, key, value,
 * headers, timestamp).
 *
 * Record views point into the tuple (the CopyData buffer) or into the
 * builder's scratch space; both stay valid until the next build or reset,
 * so the caller hands the record to the producer (which copies) before
 * building the next one.
 */
#ifndef OBX_EVENT_H
#define OBX_EVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "obx/core/config.h"
#include "obx/core/lsn.h"
#include "obx/core/pgoutput.h"
#include "obx/core/relcache.h"
#include "obx/core/template.h"

struct obx_txninfo {
	obx_lsn commit_lsn; /* Begin's final_lsn */
	uint32_t xid;
	int64_t commit_time; /* microseconds since 2000-01-01 */
};

struct obx_header {
	const char *name;
	const void *value; /* NULL: a null header value */
	size_t len;
};

struct obx_event {
	const char *topic;
	const void *key;
	size_t keylen;
	const void *value; /* NULL: tombstone (NULL payload) */
	size_t len;
	int64_t timestamp_ms;
	const char *id; /* the event id as text, for logs */
	const struct obx_header *headers;
	size_t nheaders;
};

struct obx_dbuf {
	char *p;
	size_t len;
	size_t cap;
};

/* One mapping of the configuration: [outbox], or [outbox] under an [outbox.<schema>.<table>] section. */
struct obx_event_map {
	struct obx_config view;  /* obx_tables_view(): borrowed from the builder's configuration */
	struct obx_template tpl; /* view.topic, parsed */
};

struct obx_event_builder {
	const struct obx_config *base; /* borrowed; outlives the builder */
	struct obx_event_map *maps;    /* [outbox], then each override of base */
	size_t nmaps;
	bool table_header; /* several tables: each event says its table (header table) */
	/* column indexes resolved for one relation version, in the mapping of its table */
	const struct obx_config *cfg;   /* that mapping's configuration (maps[i].view) */
	const struct obx_template *tpl; /* and its topic template */
	const struct obx_rel *rel;
	unsigned rel_version;
	char table[2 * 64 + 2]; /* "schema.table" of rel, for the table header */
	int i_id, i_key, i_type, i_payload, i_headers, i_timestamp;
	int *i_tpl;   /* per template part (-2 for literals) */
	int *i_extra; /* per [outbox] header.<name> */
	/* scratch */
	struct obx_dbuf topic, id, value;
	char lsn[OBX_LSN_STRLEN], seq[24], xid[16], commit_ts[40];
	struct obx_txninfo txn_fmt; /* the transaction lsn, xid and commit_ts were formatted for */
	bool txn_fmt_valid;
	struct obx_header *headers;
	size_t header_cap;
	json_t *hdr_json;
	char **hdr_dumps;
	size_t n_dumps;
};

/*
 * Prepares a builder for cfg (borrowed).  Returns 0, OBX_ENOMEM, or
 * OBX_EINVAL when cfg->topic is not a template (obx_config_set() refuses
 * those, so a checked configuration never meets it).
 */
int obx_event_builder_init(struct obx_event_builder *b, const struct obx_config *cfg);
void obx_event_builder_reset(struct obx_event_builder *b);

/*
 * Forgets the column resolution cached for the last relation, which is
 * keyed by its address and version: call it when relations may be freed
 * and others allocated at the same address (a new session, dropped copies).
 */
void obx_event_builder_forget(struct obx_event_builder *b);

/* True when rel is an outbox table: an entry of [source] table matches it (core/tables.h). */
bool obx_event_is_outbox(const struct obx_event_builder *b, const struct obx_rel *rel);

/*
 * Builds the record for an inserted outbox row; seq is the event's ordinal
 * inside its transaction.  Returns 0; OBX_EINVAL when the row cannot become
 * an event (a mapped column missing or NULL, a bad topic, a reserved header
 * name in the headers column): why then names the column or the reason, for
 * the on_error policy; OBX_ENOMEM.
 */
int obx_event_build(struct obx_event_builder *b, const struct obx_rel *rel, const struct obx_pg_tuple *tuple,
    const struct obx_txninfo *txn, uint32_t seq, struct obx_event *out, char *errbuf, size_t errlen);

/*
 * Every column of a row that cannot become an event as one JSON object of
 * text values (NULL and unchanged TOAST as null), the value of its
 * dead-letter record in every source.  A string the caller frees, or NULL
 * when out of memory.
 */
char *obx_event_row_json(const struct obx_rel *rel, const struct obx_pg_tuple *t);

/*
 * The header names outboxd writes itself: id, type, lsn, seq, xid and
 * commit_ts on every event (here; OBX_TABLE_HEADER too with several
 * tables), txn in exactly-once mode (kafka/producer.c) and
 * snapshot on the records of a slot's snapshot (snapshot.c).  A user
 * header of one of these names would shadow outboxd's own (consumers and
 * restart de-duplication read them), so [outbox] header.<name> refuses
 * them and a headers column that holds one makes the row unbuildable.
 * OBX_RESERVED_HEADERS is the same list as text, for messages.
 */
#define OBX_RESERVED_HEADERS "id, type, lsn, seq, xid, commit_ts, txn, snapshot"
/* The header naming an event's table, written (and reserved) only with several tables (core/tables.h). */
#define OBX_TABLE_HEADER "table"
extern const char *const obx_reserved_headers[]; /* NULL-terminated */

/* True when name is one of obx_reserved_headers (compared exactly, as Kafka does). */
bool obx_header_is_reserved(const char *name);

/* Formats a PostgreSQL-epoch microsecond time as ISO-8601 UTC ("...T...Z"). */
void obx_format_pg_time(int64_t pg_us, char *buf, size_t len);

/* Parses timestamp[tz] text output (ISO DateStyle) into Unix ms. Returns 0 or OBX_EINVAL. */
int obx_parse_pg_timestamp(const char *s, size_t len, int64_t *out_ms);

#endif
