/*
 * The delivery policy of every source on its own: records and delivery
 * reports in, produce calls, notes and outcomes out.  A fake producer
 * records every produce call and answers what the test scripted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/delivery.h"

#define MAXREC 64

struct rec {
	char topic[64], key[32], value[64], original_topic[64], error[128], id[32];
	bool has_key, has_value;
	size_t nheaders;
	uint64_t opaque;
};

struct fake {
	struct rec recs[MAXREC];
	size_t n, calls;
	enum obx_produce_result script[16];
	size_t nscript, next;
	enum obx_dlv_gate gate;
	size_t gated, accepted;
	char notes[2048];
};

static struct obx_config cfg;
static struct obx_metrics met;
static struct obx_topic_waits waits;
static struct fake fk;
static struct obx_delivery dlv;
static struct obx_dlv_result res;

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
	enum obx_produce_result pr = f->next < f->nscript ? f->script[f->next++] : OBX_PRODUCE_OK;
	struct rec *o;

	f->calls++;
	if (pr != OBX_PRODUCE_OK) {
		snprintf(errbuf, errlen, "scripted refusal %d", (int)pr);
		return pr;
	}
	assert_true(f->n < MAXREC);
	o = &f->recs[f->n++];
	memset(o, 0, sizeof(*o));
	snprintf(o->topic, sizeof(o->topic), "%s", r->topic);
	o->has_key = r->key != NULL;
	o->has_value = r->value != NULL;
	if (r->key != NULL)
		snprintf(o->key, sizeof(o->key), "%.*s", (int)r->keylen, (const char *)r->key);
	if (r->value != NULL)
		snprintf(o->value, sizeof(o->value), "%.*s", (int)r->len, (const char *)r->value);
	hdr(r, "id", o->id, sizeof(o->id));
	hdr(r, "original_topic", o->original_topic, sizeof(o->original_topic));
	hdr(r, "error", o->error, sizeof(o->error));
	o->nheaders = r->nheaders;
	o->opaque = opaque;
	return OBX_PRODUCE_OK;
}

static enum obx_dlv_gate
fake_gate(void *ctx, const struct obx_record *r, uint64_t ticket, bool dl, char *errbuf, size_t errlen)
{
	struct fake *f = ctx;

	(void)r, (void)ticket;
	f->gated++;
	if (f->gate == OBX_DLV_GATE_REFUSED) {
		if (dl)
			return OBX_DLV_GATE_SEND; /* it refuses the record, not its copy */
		snprintf(errbuf, errlen, "refused by the gate");
	}
	return f->gate;
}

static void
fake_accepted(void *ctx, const struct obx_record *r, uint64_t ticket, bool dl)
{
	(void)r, (void)ticket, (void)dl;
	((struct fake *)ctx)->accepted++;
}

static void
fake_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	struct fake *fake = ctx;
	size_t n = strlen(fake->notes);

	(void)level, (void)f;
	snprintf(fake->notes + n, sizeof(fake->notes) - n, "%s\n", line);
}

static const struct obx_delivery_ops ops = { fake_gate, fake_produce, fake_accepted, fake_note };

static void
set(const char *section, const char *key, const char *value)
{
	char err[256];

	assert_int_equal(obx_config_set(&cfg, section, key, value, "test", false, err, sizeof(err)), 0);
}

static void
start(enum obx_dlv_source src, enum obx_dlv_policy policy, bool transactional)
{
	obx_dlv_init(&dlv, &cfg, src, policy, &ops, &fk, &met, &waits);
	obx_dlv_begin(&dlv, 7, transactional);
}

static int
setup(void **state)
{
	(void)state;
	memset(&fk, 0, sizeof(fk));
	memset(&met, 0, sizeof(met));
	memset(&waits, 0, sizeof(waits));
	obx_config_init(&cfg);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	obx_dlv_reset(&dlv);
	obx_config_reset(&cfg);
	return 0;
}

static const struct obx_header hdrs[] = {
	{ "id", "e1", 2 },
	{ "lsn", "0/200", 5 },
	{ "xid", "7", 1 },
};

static struct obx_record
record(const char *topic)
{
	return (struct obx_record){ topic, "k", 1, "{\"a\":1}", 7, 0, hdrs, 3 };
}

static enum obx_dlv_outcome
send(const char *topic, uint64_t ticket, int64_t now)
{
	struct obx_record r = record(topic);

	return obx_dlv_send(&dlv, &r, ticket, false, now, &res);
}

/* The report of produced record i, with status st. */
static enum obx_dlv_outcome
report(size_t i, enum obx_report_status st, int64_t now)
{
	struct obx_header h[4];
	struct obx_record r;
	struct rec *o = &fk.recs[i];
	size_t n = 0;

	h[n++] = (struct obx_header){ "id", "e1", 2 };
	h[n++] = (struct obx_header){ "lsn", "0/200", 5 };
	if (o->original_topic[0] != '\0')
		h[n++] = (struct obx_header){ "original_topic", o->original_topic, strlen(o->original_topic) };
	r = (struct obx_record){ o->topic, o->has_key ? o->key : NULL, strlen(o->key),
		o->has_value ? o->value : NULL, strlen(o->value), 0, h, n };
	return obx_dlv_report(&dlv,
	    &(struct obx_report){ .opaque = o->opaque,
	        .status = st,
	        .error = "Broker: Message size too large",
	        .error_name = "MSG_SIZE_TOO_LARGE",
	        .record = r },
	    now, &res);
}

/* ---- the opaque ---- */

static void
test_opaque_layout(void **state)
{
	struct obx_dlv_tag t = { OBX_DLV_POLL, 0x1234, (1ULL << 44) - 1, true, true }, u;

	(void)state;
	assert_true(obx_dlv_untag(obx_dlv_opaque(&t), &u));
	assert_int_equal(u.src, OBX_DLV_POLL);
	assert_int_equal(u.gen, 0x1234);
	assert_int_equal(u.ticket, (1ULL << 44) - 1);
	assert_true(u.dead_letter && u.bare);
	t = (struct obx_dlv_tag){ OBX_DLV_SNAPSHOT, 0x12345, 5, false, false }; /* 16 bits of generation */
	assert_true(obx_dlv_untag(obx_dlv_opaque(&t), &u));
	assert_int_equal(u.gen, 0x2345);
	assert_int_equal(u.src, OBX_DLV_SNAPSHOT);
	assert_false(u.dead_letter || u.bare);
	assert_false(obx_dlv_untag(UINT64_MAX, &u)); /* the progress record's */
}

/* ---- a full producer queue is a state ---- */

static void
test_queue_full_pending_in_order(void **state)
{
	(void)state;
	start(OBX_DLV_SNAPSHOT, OBX_DLV_ON_ERROR, false);
	fk.script[0] = OBX_PRODUCE_QUEUE_FULL;
	fk.script[1] = OBX_PRODUCE_QUEUE_FULL;
	fk.nscript = 2;
	assert_int_equal(send("t", 1, 0), OBX_DLV_SENT);
	assert_true(obx_dlv_pending(&dlv));
	assert_false(obx_dlv_room(&dlv));
	/* the next one queues behind it without a produce call */
	assert_int_equal(send("t", 2, 0), OBX_DLV_SENT);
	assert_int_equal(fk.calls, 1);
	assert_int_equal(obx_dlv_pump(&dlv, 10, &res), OBX_DLV_SENT); /* refused again: still first */
	assert_int_equal(fk.n, 0);
	assert_true(obx_dlv_pending(&dlv));
	assert_int_equal(obx_dlv_pump(&dlv, 20, &res), OBX_DLV_SENT);
	assert_false(obx_dlv_pending(&dlv));
	assert_int_equal(fk.n, 2);
	struct obx_dlv_tag a, b;
	assert_true(obx_dlv_untag(fk.recs[0].opaque, &a) && obx_dlv_untag(fk.recs[1].opaque, &b));
	assert_int_equal(a.ticket, 1);
	assert_int_equal(b.ticket, 2);
	assert_int_equal(a.src, OBX_DLV_SNAPSHOT);
	assert_int_equal(dlv.inflight, 2);
	assert_int_equal(fk.accepted, 2);
	/* a new generation drops what was pending */
	fk.script[fk.nscript++] = OBX_PRODUCE_QUEUE_FULL;
	assert_int_equal(send("t", 3, 30), OBX_DLV_SENT);
	assert_true(obx_dlv_pending(&dlv));
	obx_dlv_begin(&dlv, 8, false);
	assert_false(obx_dlv_pending(&dlv));
	assert_int_equal(dlv.inflight, 0);
}

static void
test_caps(void **state)
{
	(void)state;
	set("delivery", "max_inflight", "2");
	cfg.max_inflight_bytes = 10; /* below what a file may set, to count these bytes */
	start(OBX_DLV_STREAM, OBX_DLV_ON_ERROR, false);
	assert_false(obx_dlv_capped(&dlv));
	send("t", 1, 0); /* 8 bytes */
	assert_false(obx_dlv_capped(&dlv));
	send("t", 2, 0); /* 16 bytes, 2 records */
	assert_true(obx_dlv_capped(&dlv));
	assert_int_equal(report(0, OBX_REPORT_OK, 1), OBX_DLV_ACKED);
	assert_int_equal(res.ticket, 1);
	assert_false(obx_dlv_capped(&dlv));
	assert_int_equal(report(1, OBX_REPORT_OK, 1), OBX_DLV_ACKED);
	/* one record always goes, however large */
	cfg.max_inflight_bytes = 1;
	assert_false(obx_dlv_capped(&dlv));
	send("t", 3, 2);
	assert_true(obx_dlv_capped(&dlv));
}

/* ---- on_error ---- */

static void
test_on_error_stop(void **state)
{
	(void)state;
	set("delivery", "on_error", "stop");
	start(OBX_DLV_STREAM, OBX_DLV_ON_ERROR, false);
	fk.script[fk.nscript++] = OBX_PRODUCE_PERMANENT;
	assert_int_equal(send("t", 1, 0), OBX_DLV_STOP);
	assert_non_null(strstr(res.reason, "event id=e1 at lsn 0/200 (xid 7) cannot be published"));
	assert_non_null(strstr(res.reason, "on_error = stop"));
	assert_string_equal(res.f_id, "e1");
	assert_int_equal(fk.n, 0);
	/* the broker's refusal, the same */
	send("t", 2, 0);
	assert_int_equal(report(0, OBX_REPORT_PERMANENT, 1), OBX_DLV_STOP);
	assert_non_null(strstr(res.reason, "event id=e1 lsn=0/200 rejected by the broker for topic t"));
	{
		uint64_t errors = 0;

		for (int i = 0; i < OBX_KAFKA_ERR_CODES; i++)
			errors += met.kafka_errors[i];
		assert_int_equal(errors, 1);
	}
}

/* The copy, then its headers alone, then nothing more: every source's ladder. */
static void
test_dead_letter_ladder(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(OBX_DLV_STREAM, OBX_DLV_ON_ERROR, false);
	fk.script[fk.nscript++] = OBX_PRODUCE_PERMANENT;
	assert_int_equal(send("t", 1, 0), OBX_DLV_SENT);
	assert_int_equal(fk.n, 1);
	assert_string_equal(fk.recs[0].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[0].original_topic, "t");
	assert_string_equal(fk.recs[0].error, "scripted refusal 2");
	assert_string_equal(fk.recs[0].key, "k");
	assert_int_equal(fk.recs[0].nheaders, 5);
	assert_non_null(strstr(fk.notes,
	    "event id=e1 at lsn 0/200 cannot be published (scripted refusal 2): "
	    "dead-lettering it to outbox.dead_letter"));
	/* the broker refuses the copy: its headers alone, as they were */
	assert_int_equal(report(0, OBX_REPORT_PERMANENT, 1), OBX_DLV_SENT);
	assert_int_equal(fk.n, 2);
	assert_false(fk.recs[1].has_key || fk.recs[1].has_value);
	assert_string_equal(fk.recs[1].original_topic, "t");
	assert_int_equal(fk.recs[1].nheaders, 3); /* the headers the broker had: id, lsn, original_topic */
	struct obx_dlv_tag t;
	assert_true(obx_dlv_untag(fk.recs[1].opaque, &t) && t.dead_letter && t.bare && t.ticket == 1);
	/* even that refused: nothing more can be done */
	assert_int_equal(report(1, OBX_REPORT_PERMANENT, 2), OBX_DLV_STOP);
	assert_non_null(strstr(res.reason,
	    "could not dead-letter event id=e1 at lsn 0/200 to outbox.dead_letter"));
	/* a copy acknowledged counts for its record */
	send("t", 2, 3);
	fk.script[fk.nscript++] = OBX_PRODUCE_OK;
	assert_int_equal(report(2, OBX_REPORT_PERMANENT, 4), OBX_DLV_SENT);
	assert_int_equal(report(3, OBX_REPORT_OK, 5), OBX_DLV_ACKED);
	assert_int_equal(res.ticket, 2);
	assert_true(res.dead_letter);
	assert_int_equal(dlv.inflight, 0);
}

/* A source that counts attempts: a refusal is a failure to try again; its give-up uses the same copy. */
static void
test_attempts_policy(void **state)
{
	struct obx_record r = record("t");

	(void)state;
	set("delivery", "on_error", "stop");
	start(OBX_DLV_POLL, OBX_DLV_ATTEMPTS, false);
	fk.script[fk.nscript++] = OBX_PRODUCE_PERMANENT;
	assert_int_equal(send("t", 1, 0), OBX_DLV_RETRY);
	assert_string_equal(res.reason, "scripted refusal 2");
	send("t", 2, 0);
	assert_int_equal(report(0, OBX_REPORT_PERMANENT, 1), OBX_DLV_RETRY);
	assert_int_equal(res.ticket, 2);
	/* given up: the dead-letter copy, whatever on_error says */
	assert_int_equal(obx_dlv_dead_letter(&dlv, &r, 3, "failed 5 time(s)", 2, &res), OBX_DLV_SENT);
	assert_string_equal(fk.recs[1].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[1].error, "failed 5 time(s)");
	assert_int_equal(report(1, OBX_REPORT_PERMANENT, 3), OBX_DLV_SENT);  /* headers alone */
	assert_int_equal(report(2, OBX_REPORT_PERMANENT, 4), OBX_DLV_RETRY); /* the row fails again */
}

/* ---- the missing-topic rule ---- */

static void
test_topic_missing_rule(void **state)
{
	(void)state;
	assert_true(obx_topic_missing(&waits, "outbox.event.gone", 1000, 5000));
	obx_topic_gauge(&waits, 1000, &met);
	assert_string_equal(met.missing_topic, "outbox.event.gone");
	assert_true(obx_topic_missing(&waits, "outbox.event.gone", 5999, 5000));
	obx_topic_gauge(&waits, 5999, &met);
	assert_true(met.missing_topic_seconds >= 4.9);
	assert_false(obx_topic_missing(&waits, "outbox.event.gone", 6000, 5000)); /* on_error */
	/* every later record of the topic too, at once: no fresh wait per record */
	assert_false(obx_topic_missing(&waits, "outbox.event.gone", 7000, 5000));
	assert_false(obx_topic_missing(&waits, "outbox.event.gone", 900000, 5000));
	obx_topic_gauge(&waits, 900000, &met);
	assert_string_equal(met.missing_topic, "outbox.event.gone"); /* still missing */
	/* one acknowledged: the topic exists, a later refusal waits again */
	obx_topic_present(&waits, "outbox.event.gone");
	obx_topic_gauge(&waits, 900000, &met);
	assert_string_equal(met.missing_topic, "");
	assert_true(obx_topic_missing(&waits, "outbox.event.gone", 901000, 5000));
	/* more topics than slots: no wait is forgotten, a further topic meets on_error at once */
	for (int i = 0; i < OBX_DLV_MISSING_TOPICS - 1; i++) {
		char name[32];

		snprintf(name, sizeof(name), "t%d", i);
		assert_true(obx_topic_missing(&waits, name, 902000 + i, 5000));
	}
	assert_false(obx_topic_missing(&waits, "one.too.many", 903000, 5000));
	assert_true(obx_topic_missing(&waits, "outbox.event.gone", 903000, 5000)); /* still waited for */
	obx_topic_gauge(&waits, 903000, &met);
	assert_string_equal(met.missing_topic, "outbox.event.gone");
}

/* Every source: the wait first, then on_error; a missing dead-letter topic is never waited for. */
static void
test_missing_topic_then_on_error(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	set("delivery", "missing_topic_timeout", "5s");
	start(OBX_DLV_SNAPSHOT, OBX_DLV_ON_ERROR, false);
	fk.script[fk.nscript++] = OBX_PRODUCE_MISSING_TOPIC;
	assert_int_equal(send("gone", 1, 1000), OBX_DLV_WAIT_TOPIC);
	assert_non_null(strstr(res.reason, "topic gone does not exist (yet): waiting up to 5 s"));
	assert_string_equal(met.missing_topic, "gone");
	send("gone", 2, 2000);
	assert_int_equal(report(0, OBX_REPORT_MISSING_TOPIC, 3000), OBX_DLV_WAIT_TOPIC);
	/* past the timeout: the dead-letter copy */
	send("gone", 3, 6500);
	assert_int_equal(report(1, OBX_REPORT_MISSING_TOPIC, 6500), OBX_DLV_SENT);
	assert_string_equal(fk.recs[2].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[2].original_topic, "gone");
	/* the copy's topic is missing too: stop, naming it */
	assert_int_equal(report(2, OBX_REPORT_MISSING_TOPIC, 6600), OBX_DLV_STOP);
	assert_non_null(strstr(res.reason,
	    "the dead-letter topic outbox.dead_letter does not exist: event id=e1 "
	    "for gone"));
	/* an acknowledgement of the topic ends its wait */
	send("gone", 4, 7000);
	assert_int_equal(report(3, OBX_REPORT_OK, 7000), OBX_DLV_ACKED);
	assert_string_equal(met.missing_topic, "");
}

/* ---- reports ---- */

static void
test_reports_of_others_ignored(void **state)
{
	struct obx_dlv_tag t;

	(void)state;
	start(OBX_DLV_STREAM, OBX_DLV_ON_ERROR, false);
	send("t", 1, 0);
	obx_dlv_begin(&dlv, 8, false); /* a new generation */
	assert_int_equal(report(0, OBX_REPORT_OK, 1), OBX_DLV_IGNORED);
	/* another source's opaque */
	send("t", 2, 0);
	assert_true(obx_dlv_untag(fk.recs[1].opaque, &t));
	t.src = OBX_DLV_SNAPSHOT;
	fk.recs[1].opaque = obx_dlv_opaque(&t);
	assert_int_equal(report(1, OBX_REPORT_OK, 1), OBX_DLV_IGNORED);
	assert_int_equal(dlv.inflight, 1);
	/* a purge is nothing; a transient failure tries again */
	send("t", 3, 0);
	assert_int_equal(report(2, OBX_REPORT_PURGED, 1), OBX_DLV_IGNORED);
	send("t", 4, 0);
	assert_int_equal(report(3, OBX_REPORT_TRANSIENT, 1), OBX_DLV_RETRY);
	assert_non_null(strstr(res.reason, "delivery of event id=e1 to t failed"));
	/* a transient produce refusal too */
	fk.script[fk.nscript++] = OBX_PRODUCE_TRANSIENT;
	assert_int_equal(send("t", 5, 0), OBX_DLV_RETRY);
}

/* Inside Kafka transactions a refusal aborts the transaction: on_error at the replay. */
static void
test_transactional_rejection(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(OBX_DLV_STREAM, OBX_DLV_ON_ERROR, true);
	send("t", 1, 0);
	assert_int_equal(report(0, OBX_REPORT_PERMANENT, 1), OBX_DLV_REJECTED);
	assert_int_equal(fk.n, 1); /* no copy inside the doomed transaction */
	assert_non_null(strstr(res.reason, "inside a Kafka transaction"));
}

/* The gate: held records stay in order, settled ones are done, refused ones meet on_error. */
static void
test_gate(void **state)
{
	(void)state;
	set("delivery", "on_error", "dead_letter");
	start(OBX_DLV_STREAM, OBX_DLV_ON_ERROR, false);
	fk.gate = OBX_DLV_GATE_HOLD;
	assert_int_equal(send("t", 1, 0), OBX_DLV_SENT);
	assert_true(obx_dlv_pending(&dlv));
	fk.gate = OBX_DLV_GATE_SETTLED;
	assert_int_equal(obx_dlv_pump(&dlv, 1, &res), OBX_DLV_SENT);
	assert_false(obx_dlv_pending(&dlv));
	assert_int_equal(fk.calls, 0);
	fk.gate = OBX_DLV_GATE_REFUSED;
	assert_int_equal(send("t", 2, 2), OBX_DLV_SENT);
	assert_string_equal(fk.recs[0].topic, "outbox.dead_letter");
	assert_string_equal(fk.recs[0].error, "refused by the gate");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_opaque_layout),
		cmocka_unit_test_setup_teardown(test_queue_full_pending_in_order, setup, teardown),
		cmocka_unit_test_setup_teardown(test_caps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_on_error_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dead_letter_ladder, setup, teardown),
		cmocka_unit_test_setup_teardown(test_attempts_policy, setup, teardown),
		cmocka_unit_test_setup_teardown(test_topic_missing_rule, setup, teardown),
		cmocka_unit_test_setup_teardown(test_missing_topic_then_on_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reports_of_others_ignored, setup, teardown),
		cmocka_unit_test_setup_teardown(test_transactional_rejection, setup, teardown),
		cmocka_unit_test_setup_teardown(test_gate, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
