/*
 * The relay core on bytes each supported PostgreSQL major sent for exactly
 * what outboxd asks that major for (tests/fixtures/pgoutput/pg<major>-relay.hex,
 * written by tests/fixtures/capture-pgoutput.sh: protocol 1 on 13, 2 on 14,
 * 3 on 15, 4 from 16; streaming and messages from 14).  The same workload
 * on every major must publish the same events: every committed outbox row
 * once, nothing of a rolled-back transaction, savepoint or prepared
 * transaction, per-key insertion order, and the flush position at the last
 * commit once everything is acknowledged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture_file.h"
#include "obx/core/err.h"
#include "obx/core/lsn.h"
#include "obx/core/pgoutput.h"
#include "obx/core/pgversion.h"
#include "obx/core/relaycore_int.h"

#define MAXREC 4096

struct rec {
	char id[64];
	char key[32];
	char topic[64];
	long n; /* the payload's "n", or -1 */
	uint64_t opaque;
};

struct sink {
	struct rec recs[MAXREC];
	size_t n;
};

static struct sink sink;

static enum obx_produce_result
sink_produce(void *ctx, const struct obx_record *r, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct sink *s = ctx;
	struct rec *o;
	const char *p;

	(void)errbuf;
	(void)errlen;
	assert_true(s->n < MAXREC);
	o = &s->recs[s->n++];
	memset(o, 0, sizeof(*o));
	for (size_t i = 0; i < r->nheaders; i++)
		if (strcmp(r->headers[i].name, "id") == 0 && r->headers[i].value != NULL)
			snprintf(o->id, sizeof(o->id), "%.*s", (int)r->headers[i].len,
			    (const char *)r->headers[i].value);
	snprintf(o->topic, sizeof(o->topic), "%s", r->topic);
	if (r->key != NULL)
		snprintf(o->key, sizeof(o->key), "%.*s", (int)r->keylen, (const char *)r->key);
	p = r->value != NULL ? memmem(r->value, r->len, "\"n\": ", 5) : NULL;
	o->n = p != NULL ? strtol(p + 5, NULL, 10) : -1;
	o->opaque = opaque;
	return OBX_PRODUCE_OK;
}

static void
sink_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	(void)ctx;
	(void)f;
	(void)level;
	(void)line;
}

static const struct obx_core_ops ops = { sink_produce, sink_note, NULL };

static void
put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (56 - 8 * i));
}

static size_t
count_id(const char *id)
{
	size_t k = 0;

	for (size_t i = 0; i < sink.n; i++)
		k += strcmp(sink.recs[i].id, id) == 0;
	return k;
}

static void
replay(int version)
{
	struct obx_config cfg;
	struct obx_metrics met;
	struct obx_core core;
	struct obx_pgfacts f;
	struct obx_pgoutput dec;
	struct fx_msg *fx = NULL;
	char path[512], err[256];
	size_t acked = 0, big = 0, sp = 0, last_n[7];
	obx_lsn last_commit = 0, write, flush;
	bool reply;
	long n;

	assert_int_equal(obx_pgfacts_for(version, &f, err, sizeof(err)), 0);
	snprintf(path, sizeof(path), "%s/pg%d-relay.hex", OBX_FIXTURE_DIR, f.major);
	n = fx_load(path, &fx);
	if (n <= 0)
		fail_msg("could not read fixture %s (run tests/fixtures/capture-pgoutput.sh)", path);
	memset(&sink, 0, sizeof(sink));
	memset(&met, 0, sizeof(met));
	obx_config_init(&cfg);
	if (f.messages)
		assert_int_equal(obx_config_set(&cfg, "source", "messages", "on", "test", false, err, sizeof(err)),
		    0);
	assert_int_equal(obx_core_init(&core, &cfg, &ops, &sink, &met), 0);
	assert_int_equal(obx_core_session_start(&core, 0, f.proto, 10000, 0), 0);
	obx_pgoutput_init(&dec, f.proto);
	for (long i = 0; i < n; i++) {
		uint8_t *w = malloc(25 + fx[i].len);
		struct obx_pgmsg m;
		obx_lsn at;
		const char *reason;

		assert_int_equal(obx_lsn_parse(fx[i].lsn, &at), 0);
		/* the last commit's end, from an independent decode */
		assert_int_equal(obx_pgoutput_decode(&dec, fx[i].data, fx[i].len, &m), 0);
		if (m.type == 'C')
			last_commit = m.u.commit.end_lsn;
		else if (m.type == 'c')
			last_commit = m.u.stream_commit.end_lsn;
		w[0] = 'w';
		put64(w + 1, at);
		put64(w + 9, at);
		put64(w + 17, 0);
		memcpy(w + 25, fx[i].data, fx[i].len);
		assert_true(obx_core_can_read(&core));
		obx_core_copydata(&core, w, 25 + fx[i].len);
		free(w);
		if (obx_core_ended(&core, &reason) != OBX_CORE_RUNNING)
			fail_msg("PostgreSQL %d: message %ld at %s (%c) ended the session: %s", f.major, i,
			    fx[i].lsn, fx[i].data[0], reason);
		/* the broker acknowledges everything at once; a Stream Commit publishes over pumps */
		do {
			for (; acked < sink.n; acked++) {
				struct obx_report r = { .opaque = sink.recs[acked].opaque,
					.status = OBX_REPORT_OK,
					.now_us = 1 };

				r.record.topic = sink.recs[acked].topic;

				obx_core_report(&core, &r);
			}
			obx_core_pump(&core, 1);
		} while (acked < sink.n || !obx_core_can_read(&core));
	}

	/* every committed outbox row once, nothing rolled back */
	assert_int_equal(count_id("00000000-0000-4000-8000-000000000001"), 1);
	assert_int_equal(count_id("00000000-0000-4000-8000-000000000002"), 1);
	assert_int_equal(count_id("00000000-0000-4000-8000-000000000004"), 1);
	assert_int_equal(count_id("00000000-0000-4000-8000-000000000005"), 1);
	assert_int_equal(count_id("00000000-0000-4000-8000-000000001001"), 1); /* COMMIT PREPARED */
	assert_int_equal(count_id("00000000-0000-4000-8000-000000001002"), 0); /* ROLLBACK PREPARED */
	/* the transactional message, as an event, where the major sends messages */
	assert_int_equal(count_id("00000000-0000-4000-8000-000000000003"), f.messages ? 1 : 0);
	memset(last_n, 0, sizeof(last_n));
	for (size_t i = 0; i < sink.n; i++) {
		const struct rec *r = &sink.recs[i];

		assert_true(strcmp(r->topic, "outbox.event.gone") != 0);
		if (strcmp(r->topic, "outbox.event.sp") == 0)
			sp++;
		if (strcmp(r->topic, "outbox.event.big") != 0)
			continue;
		big++;
		/* the rolled-back savepoint held n = 400..699 */
		assert_true((r->n >= 100 && r->n <= 399) || (r->n >= 700 && r->n <= 999));
		/* per key, in insertion order */
		assert_true(r->key[0] == 'b' && r->key[2] >= '0' && r->key[2] <= '6');
		assert_true((size_t)r->n > last_n[r->key[2] - '0']);
		last_n[r->key[2] - '0'] = (size_t)r->n;
	}
	assert_int_equal(big, 600);
	assert_int_equal(sp, 300); /* a large prepared transaction, committed */
	assert_int_equal(sink.n, 5 + 600 + 300 + (f.messages ? 1 : 0));

	/* all acknowledged: the flush position is the last commit's end */
	assert_true(last_commit > 0);
	(void)obx_core_status_due(&core, 1000000, &write, &flush, &reply);
	assert_true(flush == last_commit);

	obx_pgoutput_reset(&dec);
	obx_core_session_end(&core);
	obx_core_reset(&core);
	obx_config_reset(&cfg);
	fx_free(fx, n);
}

static void
test_pg13(void **state)
{
	(void)state;
	replay(130023);
}
static void
test_pg14(void **state)
{
	(void)state;
	replay(140023);
}
static void
test_pg15(void **state)
{
	(void)state;
	replay(150015);
}
static void
test_pg16(void **state)
{
	(void)state;
	replay(160014);
}
static void
test_pg17(void **state)
{
	(void)state;
	replay(170010);
}
static void
test_pg18(void **state)
{
	(void)state;
	replay(180004);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pg13),
		cmocka_unit_test(test_pg14),
		cmocka_unit_test(test_pg15),
		cmocka_unit_test(test_pg16),
		cmocka_unit_test(test_pg17),
		cmocka_unit_test(test_pg18),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
