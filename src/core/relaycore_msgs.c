/*
 * relaycore_msgs.c - the relay core's events: an outbox row, or a logical
 * decoding message of ours ([source] messages) seen as one, becomes a
 * record, or goes to on_error when it cannot (relaycore.h, relaycore_int.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"
#include "obx/core/walmsg.h"

#define fail obx_core_fail

/* ---- rows and messages of a committed transaction ---- */

/* A row of the current transaction that cannot become an event (ticket registered): on_error. */
static void
poison_row(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *t, uint64_t ticket,
    const char *reason)
{
	char lsn[OBX_LSN_STRLEN], seq[16], xid[16], table[2 * 64 + 2];
	struct obx_header h[5];
	size_t nh = 4;
	struct obx_record rec;
	char *row;
	struct obx_logfields f = { .lsn = c->txn.commit_lsn, .xid = c->txn.xid };

	obx_lsn_format(c->txn.commit_lsn, lsn, sizeof(lsn));
	if (c->cfg->on_error == OBX_ON_ERROR_STOP) {
		obx_rc_fail_at(c, OBX_CORE_END_FATAL, &f,
		    "event id=? at lsn %s (xid %" PRIu32 ") cannot "
		    "be published: %s (on_error = stop: nothing after it is confirmed)",
		    lsn, c->txn.xid, reason);
		return;
	}
	snprintf(seq, sizeof(seq), "%" PRIu32, c->txn_events - 1);
	snprintf(xid, sizeof(xid), "%" PRIu32, c->txn.xid);
	h[0] = (struct obx_header){ "lsn", lsn, strlen(lsn) };
	h[1] = (struct obx_header){ "seq", seq, strlen(seq) };
	h[2] = (struct obx_header){ "xid", xid, strlen(xid) };
	h[3] = (struct obx_header){ "error", reason, strlen(reason) };
	if (c->eb.table_header && !rel->message) {
		/* several tables: the copy says its table, like the record it stands for */
		snprintf(table, sizeof(table), "%s.%s", rel->nspname, rel->relname);
		h[nh++] = (struct obx_header){ OBX_TABLE_HEADER, table, strlen(table) };
	}
	row = obx_event_row_json(rel, t);
	if (row == NULL) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	obx_rc_note(c, OBX_LOG_WARN, &f,
	    "event id=? at lsn %s cannot be published (%s): "
	    "dead-lettering the row to %s",
	    lsn, reason, c->cfg->dead_letter_topic);
	rec = (struct obx_record){ c->cfg->dead_letter_topic, NULL, 0, row, strlen(row),
		(c->txn.commit_time + OBX_PG_EPOCH_OFFSET_US) / 1000, h, nh };
	obx_rc_send_record(c, &rec, ticket, true);
	free(row);
}

/*
 * Publishes one outbox row of the current transaction (c->txn): registers
 * it with the ack tracker, builds the record and sends it, or follows
 * on_error when it cannot become one.  why_not, when set, says that the row
 * is already known to be unbuildable (a message that is not a JSON object).
 */
static void
publish_event(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *tuple, const char *why_not)
{
	struct obx_event ev;
	struct obx_record rec;
	char errbuf[512];
	uint64_t ticket;
	int rc;

	if (obx_ack_add_event(&c->ack, &ticket) != 0) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	c->txn_events++;
	if (c->eos_floor_set && obx_rc_floor_skip(c, ticket))
		return; /* a committed Kafka transaction holds it (exactly-once) */
	if (why_not != NULL) {
		poison_row(c, rel, tuple, ticket, why_not);
		return;
	}
	rc = obx_event_build(&c->eb, rel, tuple, &c->txn, c->txn_events - 1, &ev, errbuf, sizeof(errbuf));
	if (rc == OBX_ENOMEM) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	if (rc != 0) {
		poison_row(c, rel, tuple, ticket, errbuf);
		return;
	}
	rec = (struct obx_record){ ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, ev.headers,
		ev.nheaders };
	obx_rc_send_record(c, &rec, ticket, false);
}

void
obx_rc_publish_row(struct obx_core *c, const struct obx_rel *rel, const struct obx_pg_tuple *t)
{
	if (c->mt_rel != rel || c->mt_version != rel->version) {
		char name[sizeof(c->m->tables[0].name)];

		snprintf(name, sizeof(name), "%s.%s", rel->nspname, rel->relname);
		c->mt_slot = obx_metrics_table_slot(c->m, name);
		c->mt_rel = rel;
		c->mt_version = rel->version;
	}
	obx_metrics_table_event(c->m, c->mt_slot);
	publish_event(c, rel, t, NULL);
}

void
obx_rc_message_row_free(struct obx_core *c)
{
	struct obx_core_msgrow *mr = &c->mrow;

	for (size_t i = 0; i < mr->ndumps; i++)
		free(mr->dumps[i]);
	mr->ndumps = 0;
	json_decref(mr->json);
	mr->json = NULL;
}

/*
 * Turns the JSON object of a logical decoding message into a row of a
 * relation whose columns are the object's keys, so the outbox mapping
 * applies unchanged: strings are column text as they are, other values
 * their compact JSON, null a NULL.  A content that is not such an object
 * becomes a row with one column "content" (for the dead-letter record) and
 * errbuf says why.  Returns 0, OBX_EINVAL (errbuf filled) or OBX_ENOMEM.
 */
static int
message_row(struct obx_core *c, const uint8_t *content, uint32_t len, struct obx_pg_tuple *t, char *errbuf,
    size_t errlen)
{
	struct obx_core_msgrow *mr = &c->mrow;
	json_error_t jerr;
	const char *k;
	json_t *v;
	uint16_t n = 0;

	obx_rc_message_row_free(c);
	mr->rel = (struct obx_rel){ .relid = 0,
		.nspname = c->cfg->table_schema,
		.relname = c->cfg->table_name,
		.cols = mr->cols,
		.version = ++mr->version,
		.message = true };
	obx_event_builder_forget(&c->eb);
	mr->json = json_loadb((const char *)content, len, 0, &jerr);
	if (mr->json == NULL || !json_is_object(mr->json) || json_object_size(mr->json) > OBX_CORE_MESSAGE_KEYS) {
		snprintf(errbuf, errlen,
		    mr->json == NULL              ? "message content is not JSON: %s" :
		        !json_is_object(mr->json) ? "message content is not a JSON object%s" :
		                                    "message content has more than 64 keys%s",
		    mr->json == NULL ? jerr.text : "");
		mr->cols[0] = (struct obx_relcol){ "content", 25 };
		mr->dat[0] = (struct obx_pg_datum){ 't', content, len };
		mr->rel.natts = 1;
		*t = (struct obx_pg_tuple){ 1, mr->dat };
		return OBX_EINVAL;
	}
	json_object_foreach(mr->json, k, v)
	{
		mr->cols[n] = (struct obx_relcol){ (char *)k, json_is_object(v) || json_is_array(v) ? 3802 : 25 };
		if (json_is_null(v)) {
			mr->dat[n] = (struct obx_pg_datum){ 'n', NULL, 0 };
		} else if (json_is_string(v)) {
			mr->dat[n] = (struct obx_pg_datum){ 't', (const uint8_t *)json_string_value(v),
				(uint32_t)json_string_length(v) };
		} else {
			char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

			if (d == NULL)
				return OBX_ENOMEM;
			mr->dumps[mr->ndumps++] = d;
			mr->dat[n] = (struct obx_pg_datum){ 't', (const uint8_t *)d, (uint32_t)strlen(d) };
		}
		n++;
	}
	mr->rel.natts = n;
	*t = (struct obx_pg_tuple){ n, mr->dat };
	return 0;
}

/* Publishes one of our transactional messages as an event of the current transaction. */
void
obx_rc_publish_message(struct obx_core *c, const uint8_t *content, uint32_t len)
{
	struct obx_pg_tuple t;
	char errbuf[512];
	int rc = message_row(c, content, len, &t, errbuf, sizeof(errbuf));

	if (rc == OBX_ENOMEM)
		fail(c, OBX_CORE_END_FATAL, "out of memory");
	else
		publish_event(c, &c->mrow.rel, &t, rc != 0 ? errbuf : NULL);
	obx_rc_message_row_free(c);
}

/* ---- the messages that carry them ---- */

void
obx_rc_insert(struct obx_core *c, const struct obx_pgmsg *m)
{
	const struct obx_rel *rel = obx_relcache_get(&c->rels, m->u.insert.relid);

	if (rel == NULL) {
		fail(c, OBX_CORE_END_FATAL,
		    "Insert for relation %" PRIu32 " that no Relation message "
		    "announced",
		    m->u.insert.relid);
		return;
	}
	if (!obx_event_is_outbox(&c->eb, rel))
		return;
	if (c->in_stream) {
		obx_rc_buffer_result(c,
		    obx_streambuf_add(&c->sbuf, c->stream_xid, m->xid, rel, &m->u.insert.tuple));
		return;
	}
	if (!c->in_txn) {
		fail(c, OBX_CORE_END_FATAL, "Insert outside of a transaction");
		return;
	}
	obx_rc_publish_row(c, rel, &m->u.insert.tuple);
}

/* A logical decoding message: with [source] messages = on, ours become events. */
void
obx_rc_message(struct obx_core *c, const struct obx_pgmsg *m)
{
	char a[OBX_LSN_STRLEN];

	if (!c->cfg->messages || strcmp(m->u.message.prefix, c->cfg->message_prefix) != 0)
		return;
	if (!(m->u.message.flags & 1)) {
		c->m->messages_refused++;
		obx_rc_note(c, OBX_LOG_WARN, &(struct obx_logfields){ .lsn = m->u.message.lsn },
		    "non-transactional message with prefix '%s' at lsn %s not published: "
		    "only pg_logical_emit_message(true, ...) is tied to a commit",
		    m->u.message.prefix, obx_lsn_format(m->u.message.lsn, a, sizeof(a)));
		return;
	}
	if (c->in_stream) {
		obx_rc_buffer_result(c,
		    obx_streambuf_add_message(&c->sbuf, c->stream_xid, m->xid, m->u.message.content,
		        m->u.message.len));
		return;
	}
	if (!c->in_txn) {
		fail(c, OBX_CORE_END_FATAL, "transactional message outside of a transaction at lsn %s",
		    obx_lsn_format(m->u.message.lsn, a, sizeof(a)));
		return;
	}
	obx_rc_publish_message(c, m->u.message.content, m->u.message.len);
}
