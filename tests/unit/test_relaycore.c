/*
 * The relay core on its own: decoded messages, produce results, delivery
 * reports and ticks in; records, notes, status positions and session ends
 * out.  A fake producer records every produce call and answers what the
 * test scripted.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"

#define RELID 16384
#define MAXREC 256

struct rec {
	char topic[64];
	char id[64];
	char key[64];
	char value[512];
	bool has_value;
	uint64_t opaque;
	char original_topic[64];
	char error[128];
	char lsn[24], seq[16];
};

struct fake {
	struct rec recs[MAXREC];
	size_t n;                           /* records produced (accepted) */
	size_t calls;                       /* produce calls, refused ones too */
	enum obx_produce_result script[32]; /* answers for the next calls; OK once used up */
	size_t nscript, next;
	char notes[4096];
	struct obx_logfields_kept note_f; /* the fields of the last note that had some */
	size_t nnote_f;
};

static struct obx_config cfg;
static struct obx_metrics met;
static struct fake fk;
static struct obx_core core;

static void
hdr(const struct obx_record *r, const char *name, char *out, size_t len)
{
	out[0] = '\0';
	for (size_t i = 0; i < r->nheaders; i++)
		if (strcmp(r->headers[i].name, name) == 0 && r->headers[i].value != NULL)
			snprintf(out, len, "%.*s", (int)r->headers[i].len, (const char *)r->headers[i].value);
}

static enum obx_produce_result
fake_produce(void *ctx, const struct obx_record *r, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct fake *f = ctx;
	enum obx_produce_result res = f->next < f->nscript ? f->script[f->next++] : OBX_PRODUCE_OK;
	struct rec *o;

	f->calls++;
	if (res != OBX_PRODUCE_OK) {
		snprintf(errbuf, errlen, "scripted refusal %d", (int)res);
		return res;
	}
	assert_true(f->n < MAXREC);
	o = &f->recs[f->n++];
	memset(o, 0, sizeof(*o));
	snprintf(o->topic, sizeof(o->topic), "%s", r->topic);
	hdr(r, "id", o->id, sizeof(o->id));
	hdr(r, "original_topic", o->original_topic, sizeof(o->original_topic));
	hdr(r, "error", o->error, sizeof(o->error));
	hdr(r, "lsn", o->lsn, sizeof(o->lsn));
	hdr(r, "seq", o->seq, sizeof(o->seq));
	if (r->key != NULL)
		snprintf(o->key, sizeof(o->key), "%.*s", (int)r->keylen, (const char *)r->key);
	o->has_value = r->value != NULL;
	if (r->value != NULL)
		snprintf(o->value, sizeof(o->value), "%.*s", (int)r->len, (const char *)r->value);
	o->opaque = opaque;
	return OBX_PRODUCE_OK;
}

static void
fake_note(void *ctx, enum obx_log_level level, const struct obx_logfields *lf, const char *line)
{
	struct fake *f = ctx;

	(void)level;
	if (lf != NULL) {
		obx_logfields_keep(&f->note_f, lf);
		f->nnote_f++;
	}
	strlcat(f->notes, line, sizeof(f->notes));
	strlcat(f->notes, "\n", sizeof(f->notes));
}

static const struct obx_core_ops ops = { fake_produce, fake_note, NULL };

/* Read-backs asked for (restart de-duplication); answered by the test with obx_core_lookup_done(). */
static struct {
	char topic[8][64];
	struct obx_dd_mark floor[8];
	uint32_t gen[8];
	size_t n;
	bool refuse;
} lk;

static bool
fake_lookup(void *ctx, const char *topic, const struct obx_dd_mark *floor, uint32_t gen)
{
	(void)ctx;
	if (lk.refuse)
		return false;
	assert_true(lk.n < 8);
	snprintf(lk.topic[lk.n], sizeof(lk.topic[0]), "%s", topic);
	lk.floor[lk.n] = *floor;
	lk.gen[lk.n++] = gen;
	return true;
}

static const struct obx_core_ops dd_ops = { fake_produce, fake_note, fake_lookup };

static void
set(const char *section, const char *key, const char *value)
{
	char err[256];

	assert_int_equal(obx_config_set(&cfg, section, key, value, "test", false, err, sizeof(err)), 0);
}

static void
start(obx_lsn at)
{
	assert_int_equal(obx_core_init(&core, &cfg, &ops, &fk, &met), 0);
	assert_int_equal(obx_core_session_start(&core, at, 2, 10000, 0), 0);
}

/* A core whose read-backs go to fake_lookup. */
static void
start_dd(obx_lsn at)
{
	assert_int_equal(obx_core_init(&core, &cfg, &dd_ops, &fk, &met), 0);
	assert_int_equal(obx_core_session_start(&core, at, 2, 10000, 0), 0);
}

static int
setup(void **state)
{
	(void)state;
	memset(&fk, 0, sizeof(fk));
	memset(&lk, 0, sizeof(lk));
	memset(&met, 0, sizeof(met));
	obx_config_init(&cfg);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	obx_core_reset(&core);
	obx_config_reset(&cfg);
	return 0;
}

/* ---- messages as the decoder would hand them over ---- */

static const struct obx_pg_relcol relcols[] = {
	{ 1, "id", 25, -1 },
	{ 0, "aggregatetype", 25, -1 },
	{ 0, "aggregateid", 25, -1 },
	{ 0, "type", 25, -1 },
	{ 0, "payload", 3802, -1 },
};

static void
relation(void)
{
	struct obx_pgmsg m = { .type = 'R' };

	m.u.relation.relid = RELID;
	m.u.relation.nspname = "public";
	m.u.relation.relname = "outbox";
	m.u.relation.natts = 5;
	m.u.relation.cols = relcols;
	obx_core_pgmsg(&core, &m, 0);
}

static void
begin_at(obx_lsn final, uint32_t xid, int64_t commit_time)
{
	struct obx_pgmsg m = { .type = 'B' };

	m.u.begin.final_lsn = final;
	m.u.begin.xid = xid;
	m.u.begin.commit_time = commit_time;
	obx_core_pgmsg(&core, &m, final);
}

static void
begin(obx_lsn final, uint32_t xid)
{
	begin_at(final, xid, 1000);
}

static void
commit(obx_lsn at, obx_lsn end)
{
	struct obx_pgmsg m = { .type = 'C' };

	m.u.commit.commit_lsn = at;
	m.u.commit.end_lsn = end;
	obx_core_pgmsg(&core, &m, 0);
}

/* An outbox row; a NULL key makes it unbuildable. */
static void
insert_x(uint32_t xid, const char *id, const char *key)
{
	struct obx_pgmsg m = { .type = 'I', .xid = xid };
	struct obx_pg_datum d[5] = {
		{ 't', (const uint8_t *)id, (uint32_t)strlen(id) },
		{ 't', (const uint8_t *)"order", 5 },
		{ key ? 't' : 'n', (const uint8_t *)key, key ? (uint32_t)strlen(key) : 0 },
		{ 't', (const uint8_t *)"Created", 7 },
		{ 't', (const uint8_t *)"{}", 2 },
	};

	m.u.insert.relid = RELID;
	m.u.insert.tuple = (struct obx_pg_tuple){ 5, d };
	obx_core_pgmsg(&core, &m, 0);
}

static void
insert(const char *id, const char *key)
{
	insert_x(0, id, key);
}

static void
message_x(uint32_t xid, bool transactional, const char *content)
{
	struct obx_pgmsg m = { .type = 'M', .xid = xid };

	m.u.message.flags = transactional ? 1 : 0;
	m.u.message.lsn = 0x500;
	m.u.message.prefix = "outboxd";
	m.u.message.content = (const uint8_t *)content;
	m.u.message.len = (uint32_t)strlen(content);
	obx_core_pgmsg(&core, &m, 0);
}

static void
stream_start(uint32_t xid)
{
	struct obx_pgmsg m = { .type = 'S' };

	m.u.stream_start.xid = xid;
	obx_core_pgmsg(&core, &m, 0);
}

static void
stream_stop(void)
{
	struct obx_pgmsg m = { .type = 'E' };

	obx_core_pgmsg(&core, &m, 0);
}

static void
stream_commit(uint32_t xid, obx_lsn at, obx_lsn end)
{
	struct obx_pgmsg m = { .type = 'c' };

	m.u.stream_commit.xid = xid;
	m.u.stream_commit.commit_lsn = at;
	m.u.stream_commit.end_lsn = end;
	obx_core_pgmsg(&core, &m, 0);
}

static void
stream_abort(uint32_t xid, uint32_t subxid)
{
	struct obx_pgmsg m = { .type = 'A' };

	m.u.stream_abort.xid = xid;
	m.u.stream_abort.subxid = subxid;
	obx_core_pgmsg(&core, &m, 0);
}

/* A delivery report for produced record i. */
static void
report(size_t i, enum obx_report_status st)
{
	struct obx_header h[2] = { { "id", fk.recs[i].id, strlen(fk.recs[i].id) }, { "lsn", "0/100", 5 } };
	struct obx_report r = { .opaque = fk.recs[i].opaque,
		.status = st,
		.error = "broker says no",
		.error_name = "TOPIC_AUTHORIZATION_FAILED",
		.now_us = 2000 };

	r.record = (struct obx_record){ fk.recs[i].topic, fk.recs[i].key[0] ? fk.recs[i].key : NULL,
		strlen(fk.recs[i].key), fk.recs[i].has_value ? fk.recs[i].value : NULL, strlen(fk.recs[i].value),
		0, h, 2 };
	obx_core_report(&core, &r);
}

static void report_marked(size_t i, enum obx_report_status st);

/* A delivery report for produced record i refused the way a broker refuses a whole request. */
static void
report_whole(size_t i)
{
	/* the record's own identifying headers, as a report carries them (a remembered refusal matches
	 * its replay by them) */
	struct obx_header h[3] = { { "id", fk.recs[i].id, strlen(fk.recs[i].id) },
		{ "lsn", fk.recs[i].lsn, strlen(fk.recs[i].lsn) },
		{ "seq", fk.recs[i].seq, strlen(fk.recs[i].seq) } };
	struct obx_report r = { .opaque = fk.recs[i].opaque,
		.status = OBX_REPORT_PERMANENT,
		.error = "Broker: Message size too large",
		.error_name = "MSG_SIZE_TOO_LARGE",
		.whole_request = true,
		.now_us = 2000 };

	r.record = (struct obx_record){ fk.recs[i].topic, fk.recs[i].key[0] ? fk.recs[i].key : NULL,
		strlen(fk.recs[i].key), fk.recs[i].has_value ? fk.recs[i].value : NULL, strlen(fk.recs[i].value),
		0, h, 3 };
	obx_core_report(&core, &r);
}

static obx_lsn
flush_now(void)
{
	obx_lsn w, f;
	bool reply;

	(void)obx_core_status_due(&core, 1000000, &w, &f, &reply);
	return f;
}

static enum obx_core_end
ended(void)
{
	return obx_core_ended(&core, NULL);
}

static const char *
reason(void)
{
	const char *r;

	(void)obx_core_ended(&core, &r);
	return r;
}

/* ---- tests ---- */

static void
test_commit_order_and_ack_before_confirm(void **state)
{
	(void)state;
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k1");
	assert_int_equal(fk.n, 2);
	assert_string_equal(fk.recs[0].id, "e1");
	assert_string_equal(fk.recs[1].id, "e2");
	assert_string_equal(fk.recs[0].topic, "outbox.event.order");
	assert_string_equal(fk.recs[0].key, "k1");
	commit(0x200, 0x210);
	begin(0x300, 8);
	insert("e3", "k2");
	commit(0x300, 0x310);
	assert_int_equal(flush_now(), 0x100);
	report(1, OBX_REPORT_OK);
	report(2, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x100); /* e1 of the first transaction still out */
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x310);
	assert_int_equal(core.published, 3);
	assert_int_equal(met.transactions, 2);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
}

/* What the loop reads (obx_core_stats() and the accessors) is the core's state. */
static void
test_stats_mirror_the_state(void **state)
{
	struct obx_core_stats s;
	struct obx_core *heap;

	(void)state;
	start(0x100);
	relation();
	begin_at(0x200, 7, 1234);
	insert("e1", "k1");
	insert("e2", "k1");
	s = obx_core_stats(&core);
	assert_int_equal(s.received, 0x200);
	assert_int_equal(s.sent_flush, 0x100);
	assert_int_equal(s.status_interval_ms, 10000);
	assert_int_equal(s.inflight_events, 2);
	assert_int_equal(s.inflight_events, core.dlv.inflight);
	assert_int_equal(s.inflight_bytes, core.dlv.inflight_bytes);
	assert_true(s.has_oldest);
	assert_int_equal(s.oldest_time, 1234);
	assert_false(s.draining);
	assert_int_equal(s.backpressured, obx_core_backpressured(&core));
	commit(0x200, 0x210);
	report(0, OBX_REPORT_OK);
	report(1, OBX_REPORT_OK);
	obx_core_keepalive(&core, 0x400, false);
	obx_core_signal(&core, 0);
	s = obx_core_stats(&core);
	assert_int_equal(s.received, 0x210);
	assert_int_equal(s.server_wal_end, 0x400);
	assert_int_equal(s.published, 2);
	assert_int_equal(s.published, core.published);
	assert_false(s.has_oldest);
	assert_true(s.draining);
	assert_int_equal(s.txn_records, 0);
	assert_int_equal(s.txn_committed, 0);
	assert_int_equal(s.txn_aborted, 0);
	obx_core_status_sent(&core, 0x210, 5);
	assert_int_equal(obx_core_stats(&core).sent_flush, 0x210);
	assert_true(obx_core_topic_waits(&core) == &core.waits);
	assert_int_equal(obx_core_generation(&core), core.gen);
	assert_true(obx_core_reason_fields(&core) == &core.reason_fields);
	obx_core_pump(&core, 10);
	assert_int_equal(ended(), OBX_CORE_END_STOP);
	assert_false(obx_core_stats(&core).end_kafka);

	/* the loop's core, on the heap */
	assert_int_equal(obx_core_new(&heap, &cfg, &ops, &fk, &met), 0);
	assert_non_null(heap);
	assert_int_equal(obx_core_session_start(heap, 0x500, 2, 3000, 0), 0);
	s = obx_core_stats(heap);
	assert_int_equal(s.received, 0x500);
	assert_int_equal(s.sent_flush, 0x500);
	assert_int_equal(s.status_interval_ms, 3000);
	assert_int_equal(s.published, 0);
	obx_core_free(heap);
	obx_core_free(NULL);
}

static void
test_keepalive_advances_only_when_idle(void **state)
{
	(void)state;
	start(0x100);
	relation();
	obx_core_keepalive(&core, 0x150, false);
	assert_int_equal(flush_now(), 0x150); /* idle: follows the WAL end */
	begin(0x200, 7);
	obx_core_keepalive(&core, 0x400, false);
	assert_int_equal(flush_now(), 0x150); /* a transaction is open */
	insert("e1", "k");
	commit(0x200, 0x210);
	obx_core_keepalive(&core, 0x400, false);
	assert_int_equal(flush_now(), 0x150); /* an event is in flight */
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
	stream_start(20);
	stream_stop();
	obx_core_keepalive(&core, 0x500, true);
	assert_int_equal(flush_now(), 0x210); /* a streamed transaction is in progress */
	stream_abort(20, 20);
	obx_core_keepalive(&core, 0x600, false);
	assert_int_equal(flush_now(), 0x600);
}

/*
 * Coverage (core/coverage.h): the flush position never passes the WAL position of the last
 * catalog reading found consistent with the session's base; a reading that shows the outbox
 * table re-created ends the session FATAL, naming the last position verified.
 */
static void
test_coverage_holds_the_flush_position(void **state)
{
	struct obx_cov_table bt[1] = { { .relid = 16384, .rel_row = 500 } }, nt[1];
	struct obx_cov base = { .read = true, .pubid = 100, .pub_insert = true, .n = 1, .t = bt };
	struct obx_cov now = base;

	(void)state;
	now.t = nt;
	nt[0] = bt[0];
	start(0x100);
	assert_int_equal(obx_core_coverage_start(&core, &base), 0);
	relation();
	obx_core_keepalive(&core, 0x150, false);
	assert_int_equal(flush_now(), 0x100); /* nothing verified yet */
	obx_core_coverage(&core, &now, 0x140);
	assert_int_equal(flush_now(), 0x140);
	obx_core_coverage(&core, &now, 0x300);
	assert_int_equal(flush_now(), 0x150); /* and never past what the stream allows */
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
	obx_core_keepalive(&core, 0x400, false);
	assert_int_equal(flush_now(), 0x300);
	/* an older reading never moves it back */
	obx_core_coverage(&core, &now, 0x250);
	assert_int_equal(flush_now(), 0x300);
	/* the table dropped and created again, not in the publication: stop, nothing past 0/300 */
	nt[0] = (struct obx_cov_table){ .relid = 16400 };
	obx_core_coverage(&core, &now, 0x500);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "outbox table public.outbox was dropped and created again"));
	assert_non_null(strstr(reason(), "after 0/300, the last position verified"));
	assert_int_equal(flush_now(), 0x300);
	/* a new session starts without a hold until it is given a base */
	assert_int_equal(obx_core_session_start(&core, 0x300, 2, 10000, 0), 0);
	obx_core_keepalive(&core, 0x600, false);
	assert_int_equal(flush_now(), 0x600);
}

/*
 * A table re-created between two sessions of one process (a reconnect) is a
 * gap as well: the next session's base is judged against the last reading.
 * Not when the slot was confirmed beyond that reading meanwhile (another
 * instance streamed and judged its own readings).
 */
static void
test_coverage_across_sessions(void **state)
{
	struct obx_cov_table bt[1] = { { .relid = 16384, .rel_row = 500 } };
	struct obx_cov_table nt[1] = { { .relid = 16400, .rel_row = 510 } }; /* added after its creation */
	struct obx_cov base = { .read = true, .pubid = 100, .pub_insert = true, .n = 1, .t = bt };
	struct obx_cov next = base;

	(void)state;
	next.t = nt;
	start(0x100);
	assert_int_equal(obx_core_coverage_start(&core, &base), 0);
	relation();
	obx_core_keepalive(&core, 0x300, false);
	obx_core_coverage(&core, &base, 0x300);
	assert_int_equal(flush_now(), 0x300);
	obx_core_session_end(&core);
	/* resumed at 0/250 from a slot confirmed no further than this process verified */
	assert_int_equal(obx_core_session_start(&core, 0x250, 2, 10000, 0), 0);
	assert_int_equal(obx_core_coverage_start(&core, &next), 0);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "outbox table public.outbox was dropped and created again"));
	assert_non_null(strstr(reason(), "after 0/250, the last position verified"));
	obx_core_session_end(&core);
	/* resumed beyond it: someone else's readings covered the way there */
	assert_int_equal(obx_core_session_start(&core, 0x400, 2, 10000, 0), 0);
	assert_int_equal(obx_core_coverage_start(&core, &next), 0);
	assert_int_not_equal(ended(), OBX_CORE_END_FATAL);
	/* and the base it was given is what the next reading is judged against */
	relation();
	obx_core_keepalive(&core, 0x500, false);
	obx_core_coverage(&core, &next, 0x500);
	assert_int_equal(flush_now(), 0x500);
}

/* No reading for long while the hold keeps the flush position back: said once, at warn. */
static void
test_coverage_quiet_is_said(void **state)
{
	struct obx_cov_table bt[1] = { { .relid = 16384, .rel_row = 500 } };
	struct obx_cov base = { .read = true, .pubid = 100, .pub_insert = true, .n = 1, .t = bt };

	(void)state;
	start(0x100);
	assert_int_equal(obx_core_coverage_start(&core, &base), 0);
	relation();
	obx_core_keepalive(&core, 0x150, false);
	obx_core_pump(&core, 29000);
	assert_null(strstr(fk.notes, "confirmed position held"));
	obx_core_pump(&core, 31000);
	assert_non_null(strstr(fk.notes, "confirmed position held at 0/100"));
	obx_core_coverage(&core, &base, 0x150);
	assert_non_null(strstr(fk.notes, "confirming resumes"));
	assert_int_equal(flush_now(), 0x150);
}

static void
test_status_timing(void **state)
{
	obx_lsn w, f;
	bool reply;

	(void)state;
	start(0x100);
	assert_false(obx_core_status_due(&core, 50, &w, &f, &reply));
	assert_true(obx_core_status_due(&core, 10000, &w, &f, &reply));
	assert_true(reply); /* idle at the interval: ask for a keepalive */
	obx_core_status_sent(&core, f, 10000);
	obx_core_keepalive(&core, 0x200, true);
	assert_true(obx_core_status_due(&core, 10001, &w, &f, &reply)); /* the server asked */
	assert_false(reply);
	assert_int_equal(f, 0x200);
	obx_core_status_sent(&core, f, 10001);
	assert_int_equal(obx_core_wait_ms(&core, 10001), 10000);
	obx_core_keepalive(&core, 0x300, false);
	/* the flush position moved: at most every 100 ms */
	assert_false(obx_core_status_due(&core, 10050, &w, &f, &reply));
	assert_int_equal(obx_core_wait_ms(&core, 10050), 51);
	assert_true(obx_core_status_due(&core, 10101, &w, &f, &reply));
}

static void
test_streamed_savepoint_rows(void **state)
{
	(void)state;
	start(0x100);
	relation();
	stream_start(30);
	insert_x(30, "s1", "k");
	insert_x(31, "sp", "k"); /* savepoint 31 */
	insert_x(30, "s2", "k");
	stream_stop();
	begin(0x200, 9); /* a small transaction commits meanwhile */
	insert("p1", "q");
	commit(0x200, 0x210);
	stream_start(30);
	stream_abort(30, 31);
	insert_x(30, "s3", "k");
	stream_stop();
	stream_start(40); /* another streamed transaction, rolled back whole */
	insert_x(40, "x1", "k");
	stream_stop();
	stream_abort(40, 40);
	assert_int_equal(fk.n, 1);
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210); /* confirmed while the stream is open */
	stream_commit(30, 0x300, 0x310);
	assert_int_equal(fk.n, 4);
	assert_string_equal(fk.recs[1].id, "s1");
	assert_string_equal(fk.recs[2].id, "s2");
	assert_string_equal(fk.recs[3].id, "s3");
	assert_int_equal(met.stream_aborted_events, 2);
	for (size_t i = 1; i < 4; i++)
		report(i, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x310);
}

/* pgoutput tags a streamed message with the top-level xid: a savepoint abort cannot place it. */
static void
test_streamed_savepoint_messages_fall_back(void **state)
{
	(void)state;
	set("source", "messages", "on");
	set("source", "streaming", "on");
	start(0x100);
	assert_true(obx_core_streaming_allowed(&core));
	relation();
	stream_start(50);
	message_x(50, true,
	    "{\"id\":\"m1\",\"aggregatetype\":\"a\",\"aggregateid\":\"k\",\"type\":\"t\",\"payload\":{}}");
	message_x(50, true,
	    "{\"id\":\"m2\",\"aggregatetype\":\"a\",\"aggregateid\":\"k\",\"type\":\"t\",\"payload\":{}}");
	stream_stop();
	stream_start(50);
	stream_abort(50, 51);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(reason(), "reconnecting with streaming off"));
	assert_false(obx_core_streaming_allowed(&core));
	stream_commit(50, 0x300, 0x310); /* nothing after the end counts */
	assert_int_equal(fk.n, 0);
	/* the next session (streaming off) gets the transaction whole, without the savepoint */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 0), 0);
	relation();
	begin(0x300, 50);
	message_x(0, true,
	    "{\"id\":\"m1\",\"aggregatetype\":\"a\",\"aggregateid\":\"k\",\"type\":\"t\",\"payload\":{}}");
	commit(0x300, 0x310);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].id, "m1");
}

/* Without messages, a savepoint's abort in a streamed transaction is exact: no fallback. */
static void
test_streamed_whole_abort_with_messages(void **state)
{
	(void)state;
	set("source", "messages", "on");
	set("source", "streaming", "on");
	start(0x100);
	stream_start(60);
	message_x(60, true,
	    "{\"id\":\"m1\",\"aggregatetype\":\"a\",\"aggregateid\":\"k\",\"type\":\"t\",\"payload\":{}}");
	stream_stop();
	stream_abort(60, 60); /* the whole transaction: exact */
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_true(obx_core_streaming_allowed(&core));
	stream_start(61);
	message_x(61, true,
	    "{\"id\":\"m2\",\"aggregatetype\":\"a\",\"aggregateid\":\"k\",\"type\":\"t\",\"payload\":{}}");
	message_x(61, true, "not json");
	stream_stop();
	stream_commit(61, 0x300, 0x310);
	/* the bad one goes to on_error = stop */
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "message content is not JSON"));
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].id, "m2");
}

static void
test_messages(void **state)
{
	(void)state;
	set("source", "messages", "on");
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	begin(0x200, 7);
	message_x(0, false, "{\"id\":\"n1\"}");
	message_x(0, true,
	    "{\"id\":\"m1\",\"aggregatetype\":\"a\",\"aggregateid\":\"k\",\"type\":\"t\",\"payload\":{\"x\":[1]}}");
	message_x(0, true, "[1,2]");
	commit(0x200, 0x210);
	assert_int_equal(met.messages_refused, 1);
	assert_int_equal(fk.n, 2);
	assert_string_equal(fk.recs[0].id, "m1");
	assert_string_equal(fk.recs[0].value, "{\"x\":[1]}");
	assert_string_equal(fk.recs[1].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[1].error, "message content is not a JSON object");
	assert_string_equal(fk.recs[1].value, "{\"content\":\"[1,2]\"}");
	report(0, OBX_REPORT_OK);
	report(1, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(met.events_dead_lettered, 1);
}

static void
test_unbuildable_row_stop(void **state)
{
	(void)state;
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", NULL);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "key column 'aggregateid' is NULL"));
	assert_non_null(strstr(reason(), "(xid 7)"));
	assert_int_equal(fk.n, 0);
}

static void
test_unbuildable_row_dead_letter(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", NULL);
	insert("e2", "k");
	commit(0x200, 0x210);
	assert_int_equal(fk.n, 2);
	assert_string_equal(fk.recs[0].topic, "outbox.dead_letter");
	assert_non_null(strstr(fk.recs[0].value, "\"aggregateid\":null"));
	assert_string_equal(fk.recs[1].id, "e2");
	report(1, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x100);
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
}

/* The producer refuses a record for good: its copy, then the headers alone, then stop. */
static void
test_refused_at_once(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	fk.script[0] = OBX_PRODUCE_PERMANENT; /* the event */
	fk.script[1] = OBX_PRODUCE_PERMANENT; /* its dead-letter copy */
	fk.nscript = 2;
	begin(0x200, 7);
	insert("big", "k");
	commit(0x200, 0x210);
	assert_int_equal(fk.calls, 3);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[0].id, "big");
	assert_string_equal(fk.recs[0].original_topic, "outbox.event.order");
	assert_false(fk.recs[0].has_value);
	assert_string_equal(fk.recs[0].key, "");
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);

	/* all three refused: the run stops without confirming past it */
	fk.next = fk.nscript = 0;
	for (int i = 0; i < 3; i++)
		fk.script[fk.nscript++] = OBX_PRODUCE_PERMANENT;
	begin(0x300, 8);
	insert("big2", "k");
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "could not dead-letter event id=big2"));
	assert_int_equal(flush_now(), 0x210);
}

static void
test_refused_at_once_stop(void **state)
{
	(void)state;
	start(0x100);
	relation();
	fk.script[0] = OBX_PRODUCE_PERMANENT;
	fk.nscript = 1;
	begin(0x200, 7);
	insert("big", "k");
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "event id=big at lsn 0/200 (xid 7) cannot be published"));
}

/*
 * The lines about a record name it: the on_error note and the end reasons
 * carry its lsn, xid, event id and topic (the original topic, for a
 * dead-letter copy); a missing topic's reason carries the topic.
 */
static void
test_lines_carry_fields(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	fk.script[0] = OBX_PRODUCE_PERMANENT;
	fk.nscript = 1;
	begin(0x200, 7);
	insert("big", "k");
	assert_non_null(strstr(fk.notes, "event id=big at lsn 0/200 cannot be published"));
	assert_int_equal(fk.nnote_f, 1);
	assert_int_equal(fk.note_f.lsn, 0x200);
	assert_int_equal(fk.note_f.xid, 7);
	assert_string_equal(fk.note_f.event_id, "big");
	assert_string_equal(fk.note_f.topic, "outbox.event.order");
	commit(0x200, 0x210);

	/* the broker rejects the next one: its note too (the report's headers hold no xid) */
	begin(0x300, 8);
	insert("e2", "k");
	commit(0x300, 0x310);
	report(1, OBX_REPORT_PERMANENT);
	assert_non_null(strstr(fk.notes, "event id=e2 lsn=0/100 rejected by the broker"));
	assert_int_equal(fk.nnote_f, 2);
	assert_int_equal(fk.note_f.lsn, 0x100);
	assert_int_equal(fk.note_f.xid, 0);
	assert_string_equal(fk.note_f.event_id, "e2");
	assert_string_equal(fk.note_f.topic, "outbox.event.order");

	/* its dead-letter copy refused as well, headers and all: the end reason names the event */
	fk.next = fk.nscript = 0;
	for (int i = 0; i < 3; i++)
		fk.script[fk.nscript++] = OBX_PRODUCE_PERMANENT;
	begin(0x400, 9);
	insert("big3", "k");
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "could not dead-letter event id=big3"));
	assert_int_equal(core.reason_fields.lsn, 0x400);
	assert_int_equal(core.reason_fields.xid, 9);
	assert_string_equal(core.reason_fields.event_id, "big3");
	assert_string_equal(core.reason_fields.topic, "outbox.event.order");
}

/* A missing topic's reason carries the topic alone. */
static void
test_missing_topic_fields(void **state)
{
	(void)state;
	set("delivery", "missing_topic_timeout", "60s");
	start(0x100);
	relation();
	fk.script[0] = OBX_PRODUCE_MISSING_TOPIC;
	fk.nscript = 1;
	begin(0x200, 7);
	insert("e1", "k");
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(reason(), "topic outbox.event.order does not exist (yet)"));
	assert_string_equal(core.reason_fields.topic, "outbox.event.order");
	assert_string_equal(core.reason_fields.event_id, "");
	assert_int_equal(core.reason_fields.lsn, 0);
	/* the next session starts with none */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 0), 0);
	assert_string_equal(core.reason_fields.topic, "");
}

static void
test_report_failures(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	insert("e2", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_PERMANENT);
	assert_int_equal(fk.n, 3);
	assert_string_equal(fk.recs[2].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[2].id, "e1");
	assert_string_equal(fk.recs[2].original_topic, "outbox.event.order");
	assert_string_equal(fk.recs[2].error, "broker says no");
	assert_int_equal(met.kafka_errors[obx_metrics_kafka_error(&met, "TOPIC_AUTHORIZATION_FAILED")], 2);
	report(1, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x100);
	report(2, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(met.events_dead_lettered, 1);
	assert_int_equal(core.published, 1);

	/* a transient failure rewinds: the session ends for a retry */
	begin(0x300, 8);
	insert("e3", "k");
	commit(0x300, 0x310);
	report(3, OBX_REPORT_TRANSIENT);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_true(core.end_kafka);
	assert_int_equal(flush_now(), 0x210);
}

/*
 * A broker refuses a whole produce request for one record's sake (a record
 * over max.message.bytes): the refusal of a record sent beside others is
 * not on_error but a rewind, and the next sessions send one record at a
 * time up to where the first one had read.  The gap-less producer stops at
 * the record refused alone, so its dead-letter copy goes out in the session
 * after; then the stream goes at full rate again.  The transaction began
 * below the slot's position (its Begin and rows read from under it), as a
 * bulk load that commits after a restart does.
 */
static void
test_refused_with_its_request_found_alone(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x300);
	obx_core_set_gapless(&core, true);
	relation();
	begin(0x100, 7);
	insert("e1", "k");
	insert("e2", "k");
	insert("e3", "k");
	assert_int_equal(fk.n, 3);
	report_whole(0);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(reason(), "event id=e1 refused by the broker"));
	assert_non_null(strstr(reason(), "with the records sent beside it"));
	report_whole(1);
	/* the first reason stands: a later report of the same request names another record */
	assert_non_null(strstr(reason(), "event id=e1 refused"));
	assert_int_equal(fk.n, 3); /* no dead-letter copy */
	assert_int_equal(met.events_dead_lettered, 0);

	/* the replay: one record in flight at a time */
	for (int session = 0; session < 2; session++) {
		assert_int_equal(obx_core_session_start(&core, 0x300, 2, 10000, 0), 0);
		obx_core_set_gapless(&core, true);
		relation();
		begin(0x100, 7);
		insert("e1", "k");
		assert_false(obx_core_can_read(&core));
		report(fk.n - 1, OBX_REPORT_OK);
		assert_true(obx_core_can_read(&core));
		insert("e2", "k");
		if (session == 0) {
			/* refused alone: its own refusal, with its size; the stopped producer cannot take
			 * its copy, the next session's does */
			assert_false(obx_core_can_read(&core));
			report_whole(fk.n - 1);
			assert_int_equal(ended(), OBX_CORE_END_RETRY);
			assert_non_null(strstr(reason(), "event id=e2 rejected"));
			assert_non_null(strstr(reason(), "refused alone"));
			assert_non_null(strstr(reason(), "bytes"));
			continue;
		}
		/* remembered: its dead-letter copy goes instead of it */
		assert_string_equal(fk.recs[fk.n - 1].topic, "outbox.dead_letter");
		assert_string_equal(fk.recs[fk.n - 1].id, "e2");
		assert_non_null(strstr(fk.recs[fk.n - 1].error, "refused alone"));
		report(fk.n - 1, OBX_REPORT_OK);
		insert("e3", "k");
		report(fk.n - 1, OBX_REPORT_OK);
		commit(0x100, 0x410);
		assert_int_equal(flush_now(), 0x410);
	}
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_int_equal(met.events_dead_lettered, 1);
	/* past what was read when the refusal came: several in flight again */
	begin(0x500, 8);
	insert("e4", "k");
	insert("e5", "k");
	assert_true(obx_core_can_read(&core));
}

/*
 * A gap-less producer stops at the record it refuses, so its dead-letter
 * copy waits for the next session: the record is remembered and on_error
 * applies to it at the replay.
 */
static void
test_gapless_dead_letter_at_the_replay(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	obx_core_set_gapless(&core, true);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	report_marked(0, OBX_REPORT_PERMANENT);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(reason(), "on_error applies at the replay"));
	assert_int_equal(fk.n, 1);
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 0), 0);
	obx_core_set_gapless(&core, true);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	/* not produced: its dead-letter copy goes instead */
	assert_int_equal(fk.n, 2);
	assert_string_equal(fk.recs[1].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[1].id, "e1");
	report(1, OBX_REPORT_OK);
	commit(0x200, 0x210);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(met.events_dead_lettered, 1);
}

static void
test_report_failures_stop_and_dead_letter_fails(void **state)
{
	(void)state;
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_PERMANENT);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "on_error = stop"));
	obx_core_reset(&core);

	memset(&fk, 0, sizeof(fk));
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_PERMANENT);
	assert_int_equal(fk.n, 2);
	report(1, OBX_REPORT_PERMANENT); /* the broker rejects the copy too: the headers alone */
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_int_equal(fk.n, 3);
	assert_string_equal(fk.recs[2].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[2].id, "e1");
	assert_false(fk.recs[2].has_value);
	assert_string_equal(fk.recs[2].key, "");
	report(2, OBX_REPORT_PERMANENT); /* and those: stop */
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "could not dead-letter event id=e1"));
	assert_int_equal(flush_now(), 0x100);
	obx_core_reset(&core);

	/* a dead-letter copy that times out rewinds like any event */
	memset(&fk, 0, sizeof(fk));
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_PERMANENT);
	report(1, OBX_REPORT_TRANSIENT);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_int_equal(flush_now(), 0x100);
}


/*
 * Two events of a missing topic in one transaction, past the timeout with
 * on_error = dead_letter: each is dead-lettered once and the session goes
 * on (a fresh wait for the second ended every session again, for ever).
 */
static void
test_missing_topic_two_events(void **state)
{
	(void)state;
	set("delivery", "missing_topic_timeout", "5s");
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	obx_core_pump(&core, 1000);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	insert("e2", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_MISSING_TOPIC); /* the wait begins: rewind */
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	obx_core_session_end(&core);

	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 7000), 0);
	obx_core_pump(&core, 7000);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	insert("e2", "k");
	commit(0x200, 0x210);
	assert_int_equal(fk.n, 4);
	report(2, OBX_REPORT_MISSING_TOPIC);
	report(3, OBX_REPORT_MISSING_TOPIC);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_int_equal(fk.n, 6); /* one dead-letter copy each */
	assert_string_equal(fk.recs[4].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[5].topic, "outbox.dead_letter");
	report(4, OBX_REPORT_OK);
	report(5, OBX_REPORT_OK);
	obx_core_pump(&core, 7100);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(met.events_dead_lettered, 2);
}

/* A topic the cluster does not have (yet) is waited for, then on_error applies. */
static void
test_missing_topic(void **state)
{
	(void)state;
	set("delivery", "missing_topic_timeout", "60s");
	start(0x100);
	obx_core_pump(&core, 1000);
	relation();
	fk.script[0] = OBX_PRODUCE_MISSING_TOPIC;
	fk.nscript = 1;
	begin(0x200, 7);
	insert("e1", "k");
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(reason(), "topic outbox.event.order does not exist (yet)"));
	assert_string_equal(met.missing_topic, "outbox.event.order");
	assert_int_equal(flush_now(), 0x100);

	/* the next session: the broker reports it missing (still within the minute) */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 30000), 0);
	obx_core_pump(&core, 30000);
	assert_true(met.missing_topic_seconds >= 29.0);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_MISSING_TOPIC);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_true(core.end_kafka);

	/* the topic appears: acknowledged, the wait is over */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 40000), 0);
	obx_core_pump(&core, 40000);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(1, OBX_REPORT_OK);
	assert_string_equal(met.missing_topic, "");
	assert_int_equal(flush_now(), 0x210);

	/* missing again, for longer than the timeout: on_error = stop */
	begin(0x300, 8);
	insert("e2", "k");
	commit(0x300, 0x310);
	report(2, OBX_REPORT_MISSING_TOPIC);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_int_equal(obx_core_session_start(&core, 0x210, 2, 10000, 101000), 0);
	obx_core_pump(&core, 101000);
	relation();
	fk.next = fk.nscript = 0;
	fk.script[fk.nscript++] = OBX_PRODUCE_MISSING_TOPIC;
	begin(0x300, 8);
	insert("e2", "k");
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "event id=e2"));
	/* on_error took it; the topic is still missing and the gauge says so until one is acknowledged */
	assert_string_equal(met.missing_topic, "outbox.event.order");
	obx_core_reset(&core);

	/* a missing dead-letter topic is never waited for: on_error decided already */
	memset(&fk, 0, sizeof(fk));
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	obx_core_pump(&core, 1000);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_PERMANENT);
	assert_int_equal(fk.n, 2);
	report(1, OBX_REPORT_MISSING_TOPIC); /* the copy: its topic is missing, so would its headers' be */
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_int_equal(fk.n, 2);
	assert_non_null(strstr(reason(), "the dead-letter topic outbox.dead_letter does not exist: event id=e1"));
}

/* Reports served while a Stream Commit waits on the caps: the loop must not sleep. */
static void
test_replay_wakes_the_loop(void **state)
{
	(void)state;
	set("delivery", "max_inflight", "2");
	start(0x100);
	relation();
	stream_start(70);
	for (int i = 0; i < 5; i++)
		insert_x(70, "s", "k");
	stream_stop();
	stream_commit(70, 0x300, 0x310);
	assert_int_equal(fk.n, 2);
	assert_true(obx_core_wait_ms(&core, 1) > 0); /* held by the caps: reports will wake it */
	report(0, OBX_REPORT_OK);
	report(1, OBX_REPORT_OK);
	assert_int_equal(obx_core_wait_ms(&core, 1), 0);
	obx_core_pump(&core, 1);
	assert_int_equal(fk.n, 4);
	/* input while the rows are still being published is a caller's defect */
	begin(0x400, 9);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "while a Stream Commit is being published"));
}

/* A full producer queue is a wait, in order, never an error; dead-letter copies too. */
static void
test_queue_full(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	fk.script[0] = OBX_PRODUCE_QUEUE_FULL;
	fk.script[1] = OBX_PRODUCE_QUEUE_FULL;
	fk.nscript = 2;
	begin(0x200, 7);
	insert("e1", "k");
	assert_false(obx_core_can_read(&core));
	assert_int_equal(obx_core_wait_ms(&core, 0), 50);
	assert_int_equal(fk.n, 0);
	obx_core_pump(&core, 10); /* refused again */
	assert_int_equal(fk.n, 0);
	obx_core_pump(&core, 20);
	assert_int_equal(fk.n, 1);
	assert_true(obx_core_can_read(&core));
	insert("e2", "k");
	commit(0x200, 0x210);
	assert_string_equal(fk.recs[1].id, "e2");

	/* the dead-letter copy meets a full queue: waits, then goes */
	fk.next = fk.nscript = 0;
	fk.script[fk.nscript++] = OBX_PRODUCE_QUEUE_FULL;
	report(0, OBX_REPORT_PERMANENT);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_int_equal(fk.n, 2);
	obx_core_pump(&core, 30);
	assert_int_equal(fk.n, 3);
	assert_string_equal(fk.recs[2].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[2].id, "e1");
	report(1, OBX_REPORT_OK);
	report(2, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
}

static void
test_backpressure_and_stream_commit_resumes(void **state)
{
	(void)state;
	set("delivery", "max_inflight", "2");
	start(0x100);
	relation();
	stream_start(70);
	for (int i = 0; i < 5; i++) {
		char id[8];

		snprintf(id, sizeof(id), "s%d", i);
		insert_x(70, id, "k");
	}
	stream_stop();
	stream_commit(70, 0x300, 0x310);
	assert_int_equal(fk.n, 2); /* the caps stop the replay */
	assert_false(obx_core_can_read(&core));
	assert_true(obx_core_backpressured(&core));
	report(0, OBX_REPORT_OK);
	obx_core_pump(&core, 0);
	assert_int_equal(fk.n, 3);
	assert_false(obx_core_can_read(&core));
	report(1, OBX_REPORT_OK);
	report(2, OBX_REPORT_OK);
	obx_core_pump(&core, 0);
	assert_int_equal(fk.n, 5);
	for (size_t i = 0; i < 5; i++) {
		char id[8];

		snprintf(id, sizeof(id), "s%zu", i);
		assert_string_equal(fk.recs[i].id, id);
	}
	assert_int_equal(flush_now(), 0x100); /* s3, s4 out */
	report(3, OBX_REPORT_OK);
	report(4, OBX_REPORT_OK);
	obx_core_pump(&core, 0);
	assert_true(obx_core_can_read(&core));
	assert_int_equal(flush_now(), 0x310);
	assert_non_null(strstr(fk.notes, "pausing the replication stream"));
	assert_non_null(strstr(fk.notes, "resuming the replication stream"));
}

/* One stalled partition must not let acknowledged transactions pile up behind it. */
static void
test_ack_queue_bounded(void **state)
{
	(void)state;
	set("delivery", "max_inflight", "4");
	start(0x100);
	relation();
	begin(0x200, 1);
	insert("stalled", "k");
	commit(0x200, 0x210);
	for (uint32_t i = 1; obx_core_can_read(&core) && i < 100; i++) {
		begin(0x200 + i * 0x100, i + 1);
		insert("fine", "other");
		commit(0x200 + i * 0x100, 0x210 + i * 0x100);
		report(i, OBX_REPORT_OK);
		obx_core_pump(&core, 0);
	}
	assert_false(obx_core_can_read(&core));
	assert_int_equal(core.dlv.inflight, 1);
	assert_true(core.ack.count <= 4);
	report(0, OBX_REPORT_OK);
	obx_core_pump(&core, 0);
	assert_true(obx_core_can_read(&core));
	assert_int_equal(core.ack.count, 0);
}

/* A report of an earlier generation, or one served while the producer closes, counts for nothing. */
static void
test_stale_reports(void **state)
{
	struct obx_header h = { "id", "e1", 2 };
	struct obx_report r = { .status = OBX_REPORT_OK, .now_us = 1 };

	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	/* forged: the same ticket, the previous generation */
	r.opaque = obx_core_opaque(core.gen - 1, fk.recs[0].opaque & ((1ULL << 44) - 1), false);
	r.record = (struct obx_record){ "outbox.event.order", "k", 1, "{}", 2, 0, &h, 1 };
	obx_core_report(&core, &r);
	assert_int_equal(flush_now(), 0x100);
	assert_int_equal(core.dlv.inflight, 1);
	assert_int_equal(ended(), OBX_CORE_RUNNING);

	/* the session ends; the closing producer reports the event as rejected: no dead-letter copy */
	obx_core_fail(&core, OBX_CORE_END_RETRY, "connection lost");
	obx_core_session_end(&core);
	report(0, OBX_REPORT_PERMANENT);
	report(0, OBX_REPORT_OK);
	assert_int_equal(fk.n, 1);
	assert_int_equal(met.events_dead_lettered, 0);
	assert_int_equal(core.published, 0);

	/* a new session reuses ticket numbers: the old report still does not count */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 0), 0);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x100);
	report(1, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
}

static void
test_drain(void **state)
{
	(void)state;
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	obx_core_signal(&core, 1000);
	assert_true(obx_core_can_read(&core)); /* read on to the end of the open transaction */
	insert("e2", "k");
	commit(0x200, 0x210);
	assert_false(obx_core_can_read(&core));
	obx_core_pump(&core, 1100);
	assert_int_equal(ended(), OBX_CORE_RUNNING); /* waiting for acks */
	report(0, OBX_REPORT_OK);
	report(1, OBX_REPORT_OK);
	obx_core_pump(&core, 1200);
	assert_int_equal(ended(), OBX_CORE_END_STOP);
	assert_int_equal(flush_now(), 0x210);
	obx_core_reset(&core);

	/* the deadline passes with an event unacknowledged */
	start(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k");
	commit(0x200, 0x210);
	obx_core_signal(&core, 1000);
	obx_core_pump(&core, 1000 + OBX_CORE_DRAIN_TIMEOUT_MS - 1);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	obx_core_pump(&core, 1000 + OBX_CORE_DRAIN_TIMEOUT_MS);
	assert_int_equal(ended(), OBX_CORE_END_STOP);
	assert_non_null(strstr(fk.notes, "1 event(s) unacknowledged"));
	assert_int_equal(flush_now(), 0x100);
	obx_core_reset(&core);

	/* a second signal stops at once */
	start(0x100);
	obx_core_signal(&core, 1);
	obx_core_signal(&core, 2);
	assert_int_equal(ended(), OBX_CORE_END_STOP);
	assert_non_null(strstr(reason(), "second signal"));
}

static void
test_protocol_errors(void **state)
{
	static const uint8_t bad[] = { 'w', 0, 0 };
	static const uint8_t bad_payload[] = { 'w', 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
		0, 0, 0, 'B', 1 };

	(void)state;
	start(0x100);
	obx_core_copydata(&core, bad, sizeof(bad));
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "malformed CopyData message"));
	obx_core_reset(&core);
	start(0x100);
	obx_core_copydata(&core, bad_payload, sizeof(bad_payload));
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "could not decode pgoutput Begin message"));
	obx_core_reset(&core);
	start(0x100);
	insert("e1", "k");
	assert_int_equal(ended(), OBX_CORE_END_FATAL); /* no Relation announced it */
	obx_core_reset(&core);
	start(0x100);
	relation();
	begin(0x200, 1);
	begin(0x300, 2);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_non_null(strstr(reason(), "Begin inside an open transaction"));
}

/* ---- restart de-duplication ---- */

/* A read-back of topic (nparts partitions) that found the given events (id, commit lsn, seq, key). */
struct found {
	const char *id;
	obx_lsn lsn;
	uint32_t seq;
	const char *key;
};

static struct obx_dd_scan *
read_back(const char *topic, const struct obx_dd_mark *floor, int32_t nparts, const struct found *f, size_t n)
{
	struct obx_dd_scan *s = obx_dd_scan_new(topic, floor);
	struct obx_dd_window w;

	assert_int_equal(obx_dd_scan_partitions(s, nparts), 0);
	for (int32_t p = 0; p < nparts; p++) {
		obx_dd_scan_bounds(s, p, 0, (int64_t)n); /* offsets 0..n-1, as in the loop below */
		if (n > 0)
			assert_true(obx_dd_scan_want(s, p, &w));
	}
	for (size_t i = 0; i < n; i++) {
		char lsn[OBX_LSN_STRLEN], seq[16];
		struct obx_header h[3] = { { "id", f[i].id, strlen(f[i].id) }, { "lsn", lsn, 0 },
			{ "seq", seq, 0 } };

		h[1].len = strlen(obx_lsn_format(f[i].lsn, lsn, sizeof(lsn)));
		h[2].len = (size_t)snprintf(seq, sizeof(seq), "%u", f[i].seq);
		obx_dd_scan_record(s, obx_dd_partition(f[i].key, strlen(f[i].key), nparts), (int64_t)i, f[i].key,
		    strlen(f[i].key), 2, h, 3);
	}
	for (int32_t p = 0; p < nparts; p++)
		obx_dd_scan_window_done(s, p);
	obx_dd_scan_finish(s, "unfinished");
	return s;
}

/*
 * The first event of a topic asks for its read-back and waits (the stream
 * with it); found events are skipped and acknowledged at the next pump, as
 * a delivery report would; the first one not found is published, and every
 * later one of its partition without asking.
 */
static void
test_dedupe_skips_what_kafka_has(void **state)
{
	static const struct found f[] = { { "e1", 0x200, 0, "k1" } };

	(void)state;
	start_dd(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k1");
	commit(0x200, 0x210);
	assert_int_equal(lk.n, 1);
	assert_string_equal(lk.topic[0], "outbox.event.order");
	assert_true(lk.floor[0].lsn == 0x200 && lk.floor[0].seq == 0);
	assert_int_equal(fk.n, 0);              /* both wait, in order */
	assert_false(obx_core_can_read(&core)); /* and the stream with them */
	obx_core_pump(&core, 10);
	assert_int_equal(fk.n, 0);
	/* an answer of an earlier session is freed unused */
	obx_core_lookup_done(&core, lk.gen[0] - 1, lk.topic[0], read_back(lk.topic[0], &lk.floor[0], 4, f, 1));
	obx_core_pump(&core, 20);
	assert_int_equal(fk.n, 0);
	obx_core_lookup_done(&core, lk.gen[0], lk.topic[0], read_back(lk.topic[0], &lk.floor[0], 4, f, 1));
	assert_int_equal(fk.n, 0); /* nothing moves from inside the answer */
	obx_core_pump(&core, 30);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].id, "e2");
	/* e1's acknowledgement waits for the next pump, which is due at once */
	assert_int_equal(met.dedupe_skipped, 0);
	assert_int_equal(obx_core_wait_ms(&core, 30), 0);
	obx_core_pump(&core, 40);
	assert_int_equal(met.dedupe_skipped, 1);
	assert_int_equal(flush_now(), 0x100); /* e2 is out */
	report(0, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(core.published, 1);
	/* caught up: later events go out at once, without another read-back */
	assert_true(obx_core_can_read(&core));
	begin(0x300, 8);
	insert("e3", "k1");
	insert("e4", "k2");
	commit(0x300, 0x310);
	assert_int_equal(fk.n, 3);
	assert_int_equal(lk.n, 1);
	assert_int_equal(met.dedupe_fallbacks, 0);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
}

/* Every event of a transaction found: the skips alone confirm it. */
static void
test_dedupe_skips_confirm(void **state)
{
	static const struct found f[] = { { "e1", 0x200, 0, "k1" }, { "e2", 0x200, 1, "k2" } };

	(void)state;
	start_dd(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k2");
	commit(0x200, 0x210);
	obx_core_lookup_done(&core, lk.gen[0], lk.topic[0], read_back(lk.topic[0], &lk.floor[0], 4, f, 2));
	obx_core_pump(&core, 10);
	assert_int_equal(flush_now(), 0x100); /* found, not yet acknowledged */
	obx_core_pump(&core, 20);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(fk.n, 0);
	assert_int_equal(met.dedupe_skipped, 2);
	assert_int_equal(core.published, 0);
	assert_non_null(strstr(fk.notes, "2 event(s) of topic outbox.event.order were in Kafka already"));
}

/* A read-back that cannot start, or that fell back: published, counted, said. */
static void
test_dedupe_fallbacks(void **state)
{
	struct obx_dd_scan *s;

	(void)state;
	lk.refuse = true;
	start_dd(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	assert_int_equal(fk.n, 1);
	assert_int_equal(met.dedupe_fallbacks, 1);
	assert_non_null(strstr(fk.notes,
	    "de-duplication: topic outbox.event.order: could not start reading "
	    "it back; publishing its events from the slot's position (at-least-once)"));
	commit(0x200, 0x210);
	obx_core_reset(&core);

	/* a new session asks again; this time the read-back times out */
	lk.refuse = false;
	fk.notes[0] = '\0';
	start_dd(0x210);
	relation();
	begin(0x300, 8);
	insert("e2", "k1");
	assert_int_equal(lk.n, 1);
	s = obx_dd_scan_new(lk.topic[0], &lk.floor[0]);
	obx_dd_scan_finish(s, "its read-back did not finish within 5000 ms");
	obx_core_lookup_done(&core, lk.gen[0], lk.topic[0], s);
	obx_core_pump(&core, 10);
	assert_int_equal(fk.n, 2);
	assert_int_equal(met.dedupe_fallbacks, 2);
	assert_non_null(strstr(fk.notes,
	    "topic outbox.event.order: its read-back did not finish within "
	    "5000 ms; publishing its events from the slot's position (at-least-once)"));
	insert("e3", "k1");
	assert_int_equal(fk.n, 3);
	commit(0x300, 0x310);
	obx_core_reset(&core);

	/* a read-back that ran out of memory: the same */
	fk.notes[0] = '\0';
	start_dd(0x310);
	relation();
	begin(0x400, 9);
	insert("e4", "k1");
	assert_int_equal(lk.n, 2);
	obx_core_lookup_done(&core, lk.gen[1], lk.topic[1], NULL);
	obx_core_pump(&core, 10);
	assert_int_equal(fk.n, 4);
	assert_int_equal(met.dedupe_fallbacks, 3);
	assert_non_null(strstr(fk.notes, "topic outbox.event.order: out of memory; publishing"));
}

/* A dead-letter copy is looked for in the dead-letter topic, with its own read-back. */
static void
test_dedupe_dead_letter_copy(void **state)
{
	struct found f[1];
	struct obx_header h[4];
	struct obx_report r = { .status = OBX_REPORT_PERMANENT,
		.error = "too large",
		.error_name = "MSG_SIZE_TOO_LARGE",
		.now_us = 2000 };

	(void)state;
	set("delivery", "on_error", "dead_letter");
	start_dd(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	commit(0x200, 0x210);
	obx_core_lookup_done(&core, lk.gen[0], lk.topic[0], read_back(lk.topic[0], &lk.floor[0], 4, NULL, 0));
	obx_core_pump(&core, 10);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].lsn, "0/200");
	assert_string_equal(fk.recs[0].seq, "0");
	/* the broker rejects it for good: its copy goes to the dead-letter topic, which is read back */
	h[0] = (struct obx_header){ "id", "e1", 2 };
	h[1] = (struct obx_header){ "lsn", fk.recs[0].lsn, strlen(fk.recs[0].lsn) };
	h[2] = (struct obx_header){ "seq", fk.recs[0].seq, strlen(fk.recs[0].seq) };
	h[3] = (struct obx_header){ "type", "Created", 7 };
	r.opaque = fk.recs[0].opaque;
	r.record = (struct obx_record){ fk.recs[0].topic, "k1", 2, "{}", 2, 0, h, 4 };
	obx_core_report(&core, &r);
	assert_int_equal(lk.n, 2);
	assert_string_equal(lk.topic[1], "outbox.dead_letter");
	assert_int_equal(fk.n, 1);
	/* an earlier session's copy is there already */
	f[0] = (struct found){ "e1", 0x200, 0, "k1" };
	obx_core_lookup_done(&core, lk.gen[1], lk.topic[1], read_back(lk.topic[1], &lk.floor[1], 2, f, 1));
	obx_core_pump(&core, 20);
	obx_core_pump(&core, 30);
	assert_int_equal(fk.n, 1);
	assert_int_equal(met.dedupe_skipped, 1);
	assert_int_equal(met.events_dead_lettered, 0);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
}

/* A partitioner outboxd cannot reproduce: no read-backs, one warning per process. */
static void
test_dedupe_partitioner_unsupported(void **state)
{
	(void)state;
	set("kafka", "partitioner", "consistent_random");
	start_dd(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	commit(0x200, 0x210);
	assert_int_equal(lk.n, 0);
	assert_int_equal(fk.n, 1);
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 0), 0);
	{
		const char *first = strstr(fk.notes,
		    "partitioner consistent_random is not one outboxd can "
		    "reproduce");

		assert_non_null(first);
		assert_null(strstr(first + 1, "partitioner consistent_random"));
	}
	/* and off by configuration: not a word */
	obx_core_reset(&core);
	obx_config_reset(&cfg);
	obx_config_init(&cfg);
	set("delivery", "dedupe", "off");
	fk.notes[0] = '\0';
	start_dd(0x100);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	assert_int_equal(lk.n, 0);
	assert_int_equal(fk.n, 2);
	assert_string_equal(fk.notes, "");
}

/* ---- exactly-once: Kafka transactions ---- */

static void
start_eos(obx_lsn at, const struct obx_dd_mark *floor)
{
	start(at);
	obx_core_exactly_once(&core, floor, 1000); /* the commit time begin() gives */
}

/* A delivery report for produced record i with its own lsn and seq headers. */
static void
report_marked(size_t i, enum obx_report_status st)
{
	struct obx_header h[3] = { { "id", fk.recs[i].id, strlen(fk.recs[i].id) },
		{ "lsn", fk.recs[i].lsn, strlen(fk.recs[i].lsn) },
		{ "seq", fk.recs[i].seq, strlen(fk.recs[i].seq) } };
	struct obx_report r = { .opaque = fk.recs[i].opaque,
		.status = st,
		.error = "Broker: Message size too large",
		.error_name = "MSG_SIZE_TOO_LARGE",
		.now_us = 2000 };

	r.record = (struct obx_record){ fk.recs[i].topic, fk.recs[i].key[0] ? fk.recs[i].key : NULL,
		strlen(fk.recs[i].key), fk.recs[i].has_value ? fk.recs[i].value : NULL, strlen(fk.recs[i].value),
		0, h, 3 };
	obx_core_report(&core, &r);
}

/* Delivery reports acknowledge nothing; the commit acknowledges the whole transaction. */
static void
test_eos_acknowledged_at_commit(void **state)
{
	struct obx_core_progress p;

	(void)state;
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k2");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_OK);
	report(1, OBX_REPORT_OK);
	assert_int_equal(flush_now(), 0x100);
	assert_int_equal(core.published, 0);
	/* not idle, young, small: the transaction stays open */
	assert_false(obx_core_commit_due(&core, 10, false, &p));
	assert_true(obx_core_can_read(&core));
	assert_true(obx_core_commit_due(&core, 10, true, &p));
	assert_int_equal(p.mark.lsn, 0x200);
	assert_int_equal(p.mark.seq, 1);
	assert_int_equal(p.end_lsn, 0x210);
	assert_int_equal(p.commit_time, 1000);
	assert_int_equal(p.records, 2);
	assert_false(obx_core_can_read(&core));
	obx_core_pump(&core, 20);
	assert_false(obx_core_commit_due(&core, 20, true, &p)); /* asked once */
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(core.published, 2);
	assert_int_equal(core.eos_commits, 1);
	assert_true(obx_core_can_read(&core));
	assert_false(obx_core_commit_due(&core, 1000, true, &p)); /* nothing open */
	assert_int_equal(ended(), OBX_CORE_RUNNING);
}

/* The progress record waits for every report of the transaction; nothing joins it meanwhile. */
static void
test_eos_commit_waits_for_reports(void **state)
{
	struct obx_core_progress p;

	(void)state;
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	commit(0x200, 0x210);
	assert_false(obx_core_commit_due(&core, 10, true, &p));
	assert_false(obx_core_can_read(&core)); /* wanted: the stream waits */
	assert_false(obx_core_commit_due(&core, 20, false, &p));
	/* past the age bound while waiting: the loop sleeps until a report wakes it, no busy loop */
	assert_false(obx_core_commit_due(&core, 500, false, &p));
	assert_true(obx_core_wait_ms(&core, 500) > 0);
	report(0, OBX_REPORT_OK);
	assert_true(obx_core_commit_due(&core, 530, false, &p)); /* still wanted, now possible */
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x210);
	obx_core_reset(&core);

	/* a drain ends at its deadline even when the broker never answers */
	memset(&fk, 0, sizeof(fk));
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	commit(0x200, 0x210);
	obx_core_signal(&core, 1000);
	assert_false(obx_core_commit_due(&core, 1000, false, &p)); /* wanted, the report never comes */
	obx_core_pump(&core, 1000 + OBX_CORE_DRAIN_TIMEOUT_MS - 1);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	obx_core_pump(&core, 1000 + OBX_CORE_DRAIN_TIMEOUT_MS);
	assert_int_equal(ended(), OBX_CORE_END_STOP);
	assert_non_null(strstr(fk.notes, "not committed after 30 s"));
	assert_int_equal(flush_now(), 0x100);
}

/* Bounds: events, bytes, age; a transaction may end inside a PostgreSQL one, which is confirmed later. */
static void
test_eos_bounds(void **state)
{
	struct obx_core_progress p;

	(void)state;
	set("delivery", "transaction_max_events", "2");
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	report(0, OBX_REPORT_OK);
	assert_false(obx_core_commit_due(&core, 0, false, &p));
	insert("e2", "k1");
	report(1, OBX_REPORT_OK);
	assert_true(obx_core_commit_due(&core, 0, false, &p));
	assert_int_equal(p.mark.lsn, 0x200);
	assert_int_equal(p.mark.seq, 1);
	assert_int_equal(p.end_lsn, 0); /* no PostgreSQL transaction complete in it */
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x100); /* its transaction is not over */
	insert("e3", "k1");
	commit(0x200, 0x210);
	report(2, OBX_REPORT_OK);
	assert_false(obx_core_commit_due(&core, 99, false, &p));
	assert_int_equal(obx_core_wait_ms(&core, 50), 50);       /* woken when the age bound passes */
	assert_true(obx_core_commit_due(&core, 100, false, &p)); /* transaction_max_time 100 ms */
	assert_int_equal(p.mark.seq, 2);
	assert_int_equal(p.end_lsn, 0x210);
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(core.published, 3);
}

/* A new session skips every replayed event at or below the last committed progress record. */
static void
test_eos_floor_skips_replayed(void **state)
{
	struct obx_dd_mark floor = { 0x200, 1, 0 };
	struct obx_core_progress p;

	(void)state;
	start_eos(0x100, &floor);
	relation();
	begin(0x180, 6);
	insert("e0", "k1");
	commit(0x180, 0x190);
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k1");
	insert("e3", "k1");
	commit(0x200, 0x210);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].id, "e3");
	obx_core_pump(&core, 1);
	assert_int_equal(met.dedupe_skipped, 3);
	assert_non_null(strstr(fk.notes, "3 replayed event(s) were in committed Kafka transactions"));
	assert_int_equal(flush_now(), 0x190); /* e3 waits for its commit */
	begin(0x300, 8);
	insert("e4", "k1"); /* after the floor: never skipped again */
	commit(0x300, 0x310);
	assert_int_equal(fk.n, 2);
	report(0, OBX_REPORT_OK);
	report(1, OBX_REPORT_OK);
	assert_true(obx_core_commit_due(&core, 2, true, &p));
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x310);
	assert_int_equal(core.published, 2);
}

/*
 * A floor of another history (a data directory restored from a copy: the
 * same slot, new transactions over the old positions): events below it are
 * skipped only tentatively, nothing is confirmed, and once the replay
 * passes the floor's lsn without its transaction the session ends; the next
 * one refuses that floor and publishes everything.
 */
static void
test_eos_floor_of_another_history(void **state)
{
	struct obx_dd_mark floor = { 0x200, 1, 0 };

	(void)state;
	start_eos(0x100, &floor);
	relation();
	begin(0x180, 6);
	insert("n1", "k1");
	commit(0x180, 0x190);
	obx_core_pump(&core, 1);
	assert_int_equal(fk.n, 0);            /* taken for a replay, for now */
	assert_int_equal(flush_now(), 0x100); /* but never confirmed */
	begin(0x260, 7);                      /* past the floor, without a transaction at 0x200 */
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(core.reason, "passed the record's lsn without its transaction"));
	assert_int_equal(flush_now(), 0x100);
	obx_core_session_end(&core);

	/* the same record again: refused, everything published */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 2), 0);
	obx_core_exactly_once(&core, &floor, 1000);
	assert_non_null(strstr(fk.notes, "is the one the replay contradicted"));
	relation();
	begin(0x180, 6);
	insert("n1", "k1");
	commit(0x180, 0x190);
	begin(0x260, 7);
	insert("n2", "k1");
	commit(0x260, 0x270);
	assert_int_equal(fk.n, 2);
	assert_string_equal(fk.recs[0].id, "n1");
	assert_int_equal(ended(), OBX_CORE_RUNNING);
}

/* The same, told by a keepalive past the floor between transactions, and by a commit time. */
static void
test_eos_floor_refused_by_keepalive_and_time(void **state)
{
	struct obx_dd_mark floor = { 0x200, 0, 0 };
	struct obx_core_progress p;

	(void)state;
	start_eos(0x100, &floor);
	relation();
	begin(0x180, 6);
	insert("n1", "k1");
	obx_core_keepalive(&core, 0x300, false); /* inside a transaction: says nothing */
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	commit(0x180, 0x190);
	obx_core_keepalive(&core, 0x200, false); /* not past the floor's lsn */
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	obx_core_keepalive(&core, 0x201, false);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(core.reason, "sent past the record's lsn"));
	obx_core_session_end(&core);

	/* a transaction at the floor's lsn, committed at another time */
	floor.lsn = 0x300;
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 2), 0);
	obx_core_exactly_once(&core, &floor, 1000);
	relation();
	begin(0x180, 6);
	insert("n1", "k1");
	commit(0x180, 0x190);
	begin_at(0x300, 8, 999);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(core.reason, "committed at another time"));
	obx_core_session_end(&core);

	/* the first replayed transaction at the floor, of another time: nothing was held, nothing ends */
	floor.lsn = 0x180;
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 2), 0);
	obx_core_exactly_once(&core, &floor, 1000);
	relation();
	begin_at(0x180, 6, 5);
	insert("n1", "k1");
	commit(0x180, 0x190);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].id, "n1");
	report(0, OBX_REPORT_OK);
	assert_true(obx_core_commit_due(&core, 3, true, &p));
	assert_int_equal(p.mark_commit_time, 5);
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x190);
}

/*
 * A record the broker rejects inside a transaction: the transaction cannot
 * commit, so the session rewinds and on_error applies when it comes again.
 */
static void
test_eos_rejected_record(void **state)
{
	struct obx_core_progress p;

	(void)state;
	set("delivery", "on_error", "dead_letter");
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k1");
	commit(0x200, 0x210);
	report_marked(0, OBX_REPORT_OK);
	report_marked(1, OBX_REPORT_PERMANENT);
	assert_int_equal(ended(), OBX_CORE_END_RETRY);
	assert_non_null(strstr(reason(), "inside a Kafka transaction"));
	assert_int_equal(flush_now(), 0x100);
	obx_core_session_end(&core);
	assert_int_equal(core.eos_aborts, 1);

	/* the replay: e1 again, e2 straight to the dead-letter topic */
	assert_int_equal(obx_core_session_start(&core, 0x100, 2, 10000, 0), 0);
	obx_core_exactly_once(&core, NULL, 0);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	insert("e2", "k1");
	commit(0x200, 0x210);
	assert_int_equal(fk.n, 4);
	assert_string_equal(fk.recs[2].id, "e1");
	assert_string_equal(fk.recs[2].topic, "outbox.event.order");
	assert_string_equal(fk.recs[3].id, "e2");
	assert_string_equal(fk.recs[3].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[3].error, "Broker: Message size too large");
	report_marked(2, OBX_REPORT_OK);
	report_marked(3, OBX_REPORT_OK);
	assert_true(obx_core_commit_due(&core, 1, true, &p));
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	assert_int_equal(flush_now(), 0x210);
	assert_int_equal(core.published, 1);
	assert_int_equal(met.events_dead_lettered, 1);
	obx_core_reset(&core);

	/* on_error = stop: the run ends at once, nothing confirmed */
	set("delivery", "on_error", "stop");
	memset(&fk, 0, sizeof(fk));
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	commit(0x200, 0x210);
	report_marked(0, OBX_REPORT_PERMANENT);
	assert_int_equal(ended(), OBX_CORE_END_FATAL);
	assert_int_equal(flush_now(), 0x100);
}

/* How a commit can fail: abortable and fatal rewind, fencing stops the process. */
static void
test_eos_commit_failures(void **state)
{
	static const struct {
		enum obx_core_commit how;
		enum obx_core_end end;
		const char *says;
	} cases[] = {
		{ OBX_CORE_COMMIT_ABORT, OBX_CORE_END_RETRY, "rewinding to the slot" },
		{ OBX_CORE_COMMIT_FATAL, OBX_CORE_END_RETRY, "rewinding to the slot" },
		{ OBX_CORE_COMMIT_FENCED, OBX_CORE_END_FATAL, "could not commit the Kafka transaction" },
	};
	struct obx_core_progress p;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memset(&fk, 0, sizeof(fk));
		start_eos(0x100, NULL);
		relation();
		begin(0x200, 7);
		insert("e1", "k1");
		commit(0x200, 0x210);
		report(0, OBX_REPORT_OK);
		assert_true(obx_core_commit_due(&core, 1, true, &p));
		obx_core_commit_done(&core, cases[i].how, "could not commit the Kafka transaction: x", 3000);
		assert_int_equal(ended(), cases[i].end);
		assert_non_null(strstr(reason(), cases[i].says));
		assert_int_equal(flush_now(), 0x100);
		assert_int_equal(core.published, 0);
		obx_core_reset(&core);
	}
}

/* A drain commits what is open at once, then stops. */
static void
test_eos_drain(void **state)
{
	struct obx_core_progress p;

	(void)state;
	start_eos(0x100, NULL);
	relation();
	begin(0x200, 7);
	insert("e1", "k1");
	commit(0x200, 0x210);
	report(0, OBX_REPORT_OK);
	obx_core_signal(&core, 5);
	obx_core_pump(&core, 6);
	assert_int_equal(ended(), OBX_CORE_RUNNING);
	assert_true(obx_core_commit_due(&core, 6, false, &p));
	obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
	obx_core_pump(&core, 7);
	assert_int_equal(ended(), OBX_CORE_END_STOP);
	assert_int_equal(flush_now(), 0x210);
}

/*
 * A randomized run of exactly-once mode: PostgreSQL transactions of 1 to 4
 * events over 3 keys, delivery reports served at random, Kafka transactions
 * that commit or abort at random, crashes at random (the open Kafka
 * transaction is lost, the server resends from the last confirmed
 * position, the floor is the last committed progress mark).  What committed
 * Kafka transactions hold must be every event once, in per-key order, and
 * the flush position must never pass an event that did not commit.
 */
#define EOS_TXNS 60
#define EOS_MAXREC 4096

static struct {
	int nev[EOS_TXNS]; /* events per PostgreSQL transaction */
	int key[EOS_TXNS][4];
	struct {
		int t, e;
		uint64_t opaque;
		bool reported;
	} open[EOS_MAXREC]; /* the open Kafka transaction */
	size_t nopen;
	int committed[EOS_TXNS][4]; /* copies of each event in committed Kafka transactions */
	int last[3];                /* per key: the last (t * 4 + e) committed */
	struct obx_dd_mark progress;
	int64_t progress_time;
	bool have_progress;
	obx_lsn confirmed;
} ex;

static obx_lsn
ex_commit_lsn(int t)
{
	return 0x1000 + (obx_lsn)t * 0x100;
}

/* An id "tTeE" of test_eos_random: transaction T, event E. */
static bool
parse_id(const char *id, int *t, int *e)
{
	char *end;
	long a, b;

	if (id[0] != 't')
		return false;
	errno = 0;
	a = strtol(id + 1, &end, 10);
	if (end == id + 1 || *end != 'e' || errno != 0 || a < INT_MIN || a > INT_MAX)
		return false;
	id = end + 1;
	b = strtol(id, &end, 10);
	if (end == id || *end != '\0' || errno != 0 || b < INT_MIN || b > INT_MAX)
		return false;
	*t = (int)a;
	*e = (int)b;
	return true;
}

static enum obx_produce_result
ex_produce(void *ctx, const struct obx_record *r, uint64_t opaque, char *errbuf, size_t errlen)
{
	char id[32] = "";
	int t, e;

	(void)ctx;
	(void)errbuf;
	(void)errlen;
	hdr(r, "id", id, sizeof(id));
	assert_true(parse_id(id, &t, &e));
	assert_true(ex.nopen < EOS_MAXREC);
	ex.open[ex.nopen].t = t;
	ex.open[ex.nopen].e = e;
	ex.open[ex.nopen].opaque = opaque;
	ex.open[ex.nopen++].reported = false;
	return OBX_PRODUCE_OK;
}

static const struct obx_core_ops ex_ops = { ex_produce, fake_note, NULL };

/* The flush position may reach the end of T only when T and all before it committed. */
static void
ex_check_flush(void)
{
	obx_lsn f = flush_now(), bound = 0x100;

	for (int t = 0; t < EOS_TXNS; t++) {
		bool all = true;

		for (int e = 0; e < ex.nev[t]; e++)
			all = all && ex.committed[t][e] > 0;
		if (!all)
			break;
		bound = ex_commit_lsn(t) + 0x10;
	}
	if (f > bound)
		fail_msg("flush %" PRIx64 " passes %" PRIx64 ", the end of the last fully committed transaction",
		    f, bound);
}

/*
 * A session from the confirmed position.  Before the first commit, one
 * session in three gets a progress record of another history (rnd decides):
 * a mark at a transaction's lsn with another commit time, or at an lsn where
 * no transaction committed; the replay must refute it and lose nothing.
 */
static void
ex_session(int64_t now, uint64_t rnd)
{
	assert_int_equal(obx_core_session_start(&core, ex.confirmed, 2, 10000, now), 0);
	if (!ex.have_progress && rnd % 3 == 0) {
		struct obx_dd_mark bogus = { ex_commit_lsn((int)((rnd >> 8) % EOS_TXNS)) + ((rnd >> 16) & 1),
			(uint32_t)((rnd >> 24) % 4), 0 };

		obx_core_exactly_once(&core, &bogus, (bogus.lsn & 1) ? 1000 : 999);
	} else {
		obx_core_exactly_once(&core, ex.have_progress ? &ex.progress : NULL, ex.progress_time);
	}
	ex.nopen = 0;
	relation();
}

static void
test_eos_random(void **state)
{
	const char *env = getenv("OBX_MODEL_SEEDS");
	int seeds = env != NULL ? (int)strtonum(env, 0, INT_MAX, NULL) : 100;

	(void)state;
	for (int seed = 1; seed <= seeds; seed++) {
		uint64_t rng = (uint64_t)seed * 0x9e3779b97f4a7c15ULL;
		int64_t now = 0;
		int next_txn = 0, next_ev = 0; /* the server's position in the replay */
		bool in_txn = false;
		int crashes = 0, aborts = 0;

#define EX_RND() (rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17, rng)
		memset(&ex, 0, sizeof(ex));
		memset(&fk, 0, sizeof(fk));
		memset(&met, 0, sizeof(met));
		ex.confirmed = 0x100;
		for (int t = 0; t < EOS_TXNS; t++) {
			ex.nev[t] = 1 + (int)(EX_RND() % 4);
			for (int e = 0; e < ex.nev[t]; e++)
				ex.key[t][e] = (int)(EX_RND() % 3);
		}
		for (int k = 0; k < 3; k++)
			ex.last[k] = -1;
		obx_config_reset(&cfg);
		obx_config_init(&cfg);
		set("delivery", "transaction_max_events", EX_RND() % 2 ? "3" : "50");
		assert_int_equal(obx_core_init(&core, &cfg, &ex_ops, &fk, &met), 0);
		ex_session(now, EX_RND());
		for (int step = 0; step < 40000; step++) {
			struct obx_core_progress p;
			uint64_t r = EX_RND() % 100;
			bool done = next_txn == EOS_TXNS && !in_txn;

			now += 1;
			if (done && ex.nopen == 0 && flush_now() == ex_commit_lsn(EOS_TXNS - 1) + 0x10)
				break;
			if (r < 45 && !done && obx_core_can_read(&core)) {
				/* the server sends the next message of the replay */
				char id[32], key[8];

				if (!in_txn) {
					begin(ex_commit_lsn(next_txn), (uint32_t)(100 + next_txn));
					in_txn = true;
					next_ev = 0;
				} else if (next_ev < ex.nev[next_txn]) {
					snprintf(id, sizeof(id), "t%de%d", next_txn, next_ev);
					snprintf(key, sizeof(key), "k%d", ex.key[next_txn][next_ev]);
					insert(id, key);
					next_ev++;
				} else {
					commit(ex_commit_lsn(next_txn), ex_commit_lsn(next_txn) + 0x10);
					in_txn = false;
					next_txn++;
				}
			} else if (r < 75) {
				/* a delivery report of a record of the open Kafka transaction */
				for (size_t i = 0; i < ex.nopen; i++)
					if (!ex.open[i].reported) {
						struct obx_report rep = { .opaque = ex.open[i].opaque,
							.status = OBX_REPORT_OK,
							.now_us = 2000 };

						rep.record.topic = "outbox.event.order";

						ex.open[i].reported = true;
						obx_core_report(&core, &rep);
						break;
					}
			} else if (r < 95) {
				obx_core_pump(&core, now);
				if (obx_core_commit_due(&core, now, r < 85 || done, &p)) {
					if (EX_RND() % 10 == 0) {
						aborts++;
						obx_core_commit_done(&core, OBX_CORE_COMMIT_ABORT, "x", 3000);
					} else {
						/* every record is reported before the progress record is produced */
						for (size_t i = 0; i < ex.nopen; i++) {
							int t = ex.open[i].t, e = ex.open[i].e, k = ex.key[t][e];

							assert_true(ex.open[i].reported);
							if (++ex.committed[t][e] > 1)
								fail_msg("seed %d: t%de%d committed twice", seed,
								    t, e);
							if (t * 4 + e < ex.last[k])
								fail_msg("seed %d: key %d out of order at t%de%d",
								    seed, k, t, e);
							ex.last[k] = t * 4 + e;
						}
						assert_int_equal(p.records, ex.nopen);
						if (ex.nopen > 0) {
							ex.progress = p.mark;
							ex.progress_time = p.mark_commit_time;
							assert_int_equal(p.mark_commit_time, 1000);
							ex.have_progress = true;
						}
						ex.nopen = 0;
						obx_core_commit_done(&core, OBX_CORE_COMMIT_OK, NULL, 3000);
					}
				}
			} else if (r < 98) {
				/* a status update reaches the server */
				ex.confirmed = flush_now() > ex.confirmed ? flush_now() : ex.confirmed;
			} else {
				crashes++;
				obx_core_fail(&core, OBX_CORE_END_RETRY, "crash");
			}
			ex_check_flush();
			if (ended() != OBX_CORE_RUNNING) {
				/* the open Kafka transaction is lost; the server replays from the confirmed position */
				obx_core_session_end(&core);
				ex_session(now, EX_RND());
				in_txn = false;
				for (next_txn = 0;
				     next_txn < EOS_TXNS && ex_commit_lsn(next_txn) + 0x10 <= ex.confirmed;)
					next_txn++;
			}
		}
		for (int t = 0; t < EOS_TXNS; t++)
			for (int e = 0; e < ex.nev[t]; e++)
				if (ex.committed[t][e] != 1)
					fail_msg("seed %d: t%de%d committed %d times (%d crashes, %d aborts)",
					    seed, t, e, ex.committed[t][e], crashes, aborts);
		assert_int_equal(flush_now(), ex_commit_lsn(EOS_TXNS - 1) + 0x10);
		obx_core_reset(&core);
#undef EX_RND
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_commit_order_and_ack_before_confirm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_keepalive_advances_only_when_idle, setup, teardown),
		cmocka_unit_test_setup_teardown(test_status_timing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_coverage_holds_the_flush_position, setup, teardown),
		cmocka_unit_test_setup_teardown(test_coverage_quiet_is_said, setup, teardown),
		cmocka_unit_test_setup_teardown(test_coverage_across_sessions, setup, teardown),
		cmocka_unit_test_setup_teardown(test_streamed_savepoint_rows, setup, teardown),
		cmocka_unit_test_setup_teardown(test_streamed_savepoint_messages_fall_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_streamed_whole_abort_with_messages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_messages, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unbuildable_row_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_unbuildable_row_dead_letter, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused_at_once_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_lines_carry_fields, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_topic_fields, setup, teardown),
		cmocka_unit_test_setup_teardown(test_refused_with_its_request_found_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gapless_dead_letter_at_the_replay, setup, teardown),
		cmocka_unit_test_setup_teardown(test_report_failures, setup, teardown),
		cmocka_unit_test_setup_teardown(test_report_failures_stop_and_dead_letter_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_queue_full, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_topic, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_topic_two_events, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replay_wakes_the_loop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_backpressure_and_stream_commit_resumes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ack_queue_bounded, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stale_reports, setup, teardown),
		cmocka_unit_test_setup_teardown(test_drain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_protocol_errors, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dedupe_skips_what_kafka_has, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dedupe_skips_confirm, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dedupe_fallbacks, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dedupe_dead_letter_copy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dedupe_partitioner_unsupported, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_acknowledged_at_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_commit_waits_for_reports, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_bounds, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_floor_skips_replayed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_floor_of_another_history, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_floor_refused_by_keepalive_and_time, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_rejected_record, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_commit_failures, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_drain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_eos_random, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stats_mirror_the_state, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
