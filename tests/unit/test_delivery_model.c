/*
 * The delivery policy driven as the snapshot of pending rows drives it,
 * against a model, over random runs: rows of a few keys and random sizes
 * are sent in order while the in-flight bounds allow; the producer's
 * queue refuses at random, refuses for good, or does not have the topic;
 * the broker reports in any order across keys (in order within one), and
 * fails records at random; the process crashes at random, and a run that
 * ends (a wait for a topic, a transient failure, a crash) starts again
 * from the first row.  The broker heals after a few runs.  Checked:
 *   - every row of a finished run is acknowledged, as itself or as its
 *     dead-letter copy, and only after a report of a record produced in
 *     that run (nothing acknowledged before the broker said so);
 *   - within a run the records of one key reach the broker in row order;
 *   - what is in flight never exceeds max_inflight records, nor
 *     max_inflight_bytes plus one record (when the driver waits for room;
 *     some runs send in bursts past it, to keep records pending behind
 *     each other);
 *   - a run stops for good only when on_error = stop or even a record's
 *     headers were refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/delivery.h"

#define MAXROWS 160
#define MAXFLIGHT 512
#define KEYS 4

struct flight {
	uint64_t opaque;
	size_t row;
	bool dl, bare;
	size_t bytes;
};

static struct {
	struct obx_config cfg;
	struct obx_metrics met;
	struct obx_topic_waits waits;
	struct obx_delivery dlv;
	unsigned seed;
	bool faults;
	bool burst; /* send without waiting for room, as the rows of one transaction go */
	size_t nrows;
	size_t sizes[MAXROWS];
	int keys[MAXROWS];
	char values[MAXROWS][4096];
	struct flight fl[MAXFLIGHT]; /* produced, not reported yet, in produce order */
	size_t nfl;
	bool acked[MAXROWS];
	long last_row_of_key[KEYS]; /* the last row of each key the broker took in this run */
	uint32_t gen;
	size_t max_record;
} M;

static unsigned
rnd(unsigned n)
{
	return (unsigned)(rand_r(&M.seed) % n);
}

static size_t
row_of(const struct obx_record *r)
{
	for (size_t i = 0; i < r->nheaders; i++)
		if (strcmp(r->headers[i].name, "seq") == 0) {
			char buf[24];

			/* a header's value is len bytes, not a string (pending copies end there) */
			snprintf(buf, sizeof(buf), "%.*s", (int)r->headers[i].len,
			    (const char *)r->headers[i].value);
			return (size_t)strtoul(buf, NULL, 10);
		}
	fail_msg("a record without its seq header");
	return 0;
}

static enum obx_produce_result
produce(void *ctx, const struct obx_record *r, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct obx_dlv_tag t;
	unsigned dice = M.faults ? rnd(100) : 99;
	size_t row = row_of(r);

	(void)ctx;
	snprintf(errbuf, errlen, "refused at random");
	if (dice < 10)
		return OBX_PRODUCE_QUEUE_FULL;
	if (dice < 12)
		return OBX_PRODUCE_PERMANENT;
	if (dice < 13)
		return OBX_PRODUCE_MISSING_TOPIC;
	if (dice < 14)
		return OBX_PRODUCE_TRANSIENT;
	assert_true(obx_dlv_untag(opaque, &t));
	assert_true(M.nfl < MAXFLIGHT);
	if (!t.dead_letter) {
		/* the broker takes one key's records in row order */
		assert_true((long)row > M.last_row_of_key[M.keys[row]]);
		M.last_row_of_key[M.keys[row]] = (long)row;
	}
	M.fl[M.nfl++] = (struct flight){ opaque, row, t.dead_letter, t.bare, r->len + r->keylen };
	return OBX_PRODUCE_OK;
}

static void
note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	(void)ctx, (void)level, (void)f, (void)line;
}

static const struct obx_delivery_ops ops = { NULL, produce, NULL, note };

static void
check_bounds(void)
{
	assert_int_equal(M.dlv.inflight, M.nfl);
	if (M.burst)
		return;
	assert_true(M.dlv.inflight <= (uint64_t)M.cfg.max_inflight);
	assert_true(M.dlv.inflight_bytes <= (uint64_t)M.cfg.max_inflight_bytes + M.max_record);
	assert_int_equal(M.dlv.inflight, M.nfl);
}

/* What an outcome means to the run: 0 go on, 1 the run ends and starts again, 2 it stops for good. */
static int
outcome(enum obx_dlv_outcome o, const struct obx_dlv_result *res)
{
	switch (o) {
	case OBX_DLV_SENT:
	case OBX_DLV_SETTLED:
	case OBX_DLV_IGNORED:
		return 0;
	case OBX_DLV_ACKED:
		assert_true(res->ticket < M.nrows);
		M.acked[res->ticket] = true;
		return 0;
	case OBX_DLV_WAIT_TOPIC:
	case OBX_DLV_RETRY:
		return 1;
	case OBX_DLV_REJECTED:
		fail_msg("no Kafka transactions here");
		return 2;
	case OBX_DLV_SOLO:
		fail_msg("the model does not ask to find refused records alone (find_alone)");
		return 2;
	case OBX_DLV_STOP:
		/* only on_error = stop, a missing dead-letter topic, or the headers alone refused */
		assert_true(M.cfg.on_error == OBX_ON_ERROR_STOP || strstr(res->reason, "dead-letter") != NULL);
		return 2;
	}
	return 2;
}

/* The broker reports one record in flight: the oldest of a random key (in order within a key). */
static int
report_one(int64_t now)
{
	struct obx_header h[1];
	char seq[24];
	struct obx_dlv_result res;
	size_t pick = rnd((unsigned)M.nfl), i;
	struct flight f;
	unsigned dice = M.faults ? rnd(100) : 99;
	enum obx_report_status st = OBX_REPORT_OK;

	/* the oldest record in flight of the picked one's key goes first */
	for (i = 0; i < pick; i++)
		if (M.keys[M.fl[i].row] == M.keys[M.fl[pick].row])
			break;
	f = M.fl[i];
	memmove(&M.fl[i], &M.fl[i + 1], (M.nfl - i - 1) * sizeof(M.fl[0]));
	M.nfl--;
	if (dice < 4)
		st = OBX_REPORT_PERMANENT;
	else if (dice < 6)
		st = OBX_REPORT_TRANSIENT;
	else if (dice < 7)
		st = OBX_REPORT_MISSING_TOPIC;
	snprintf(seq, sizeof(seq), "%zu", f.row);
	h[0] = (struct obx_header){ "seq", seq, strlen(seq) };
	return outcome(obx_dlv_report(&M.dlv,
	                   &(struct obx_report){ .opaque = f.opaque,
	                       .status = st,
	                       .error = "failed at random",
	                       .error_name = "X",
	                       .record = { f.dl ? "dl" : "t", f.bare ? NULL : "k", f.bare ? 0 : 1,
	                           f.bare ? NULL : M.values[f.row], f.bare ? 0 : f.bytes - 1, 0, h, 1 } },
	                   now, &res),
	    &res);
}

/* One run from the first row: 0 finished, 1 ended (start again), 2 stopped for good. */
static int
run(int64_t *now)
{
	struct obx_dlv_result res;
	int r;

	obx_dlv_begin(&M.dlv, ++M.gen, false);
	M.nfl = 0; /* a new producer: the old one's records are gone (purged, never counted) */
	memset(M.acked, 0, sizeof(M.acked));
	for (int k = 0; k < KEYS; k++)
		M.last_row_of_key[k] = -1;
	for (size_t row = 0; row < M.nrows; row++) {
		char seq[24];
		struct obx_header h[1];
		struct obx_record rec;

		while (!obx_dlv_room_for(&M.dlv, M.sizes[row] + 1) && !(M.burst && rnd(4) != 0)) {
			*now += rnd(50);
			if (M.faults && rnd(500) == 0)
				return 1; /* a crash */
			if (M.nfl > 0 && rnd(3) != 0 && (r = report_one(*now)) != 0)
				return r;
			if ((r = outcome(obx_dlv_pump(&M.dlv, *now, &res), &res)) != 0)
				return r;
			check_bounds();
		}
		snprintf(seq, sizeof(seq), "%zu", row);
		h[0] = (struct obx_header){ "seq", seq, strlen(seq) };
		rec = (struct obx_record){ "t", "k", 1, M.values[row], M.sizes[row], 0, h, 1 };
		if ((r = outcome(obx_dlv_send(&M.dlv, &rec, row, false, *now, &res), &res)) != 0)
			return r;
		check_bounds();
	}
	while (obx_dlv_pending(&M.dlv) || M.nfl > 0) {
		*now += rnd(50);
		if (M.nfl > 0 && (r = report_one(*now)) != 0)
			return r;
		if ((r = outcome(obx_dlv_pump(&M.dlv, *now, &res), &res)) != 0)
			return r;
		check_bounds();
	}
	for (size_t row = 0; row < M.nrows; row++)
		assert_true(M.acked[row]);
	return 0;
}

static void
test_model(void **state)
{
	char err[256];

	(void)state;
	for (unsigned iter = 0; iter < 400; iter++) {
		int64_t now = 0;
		int r = 1, runs = 0;

		memset(&M, 0, sizeof(M));
		M.seed = 0x5eed + iter;
		obx_config_init(&M.cfg);
		assert_int_equal(obx_config_set(&M.cfg, "delivery", "on_error",
		                     rnd(4) == 0 ? "stop" : "dead_letter", "model", false, err, sizeof(err)),
		    0);
		M.cfg.max_inflight = 1 + (int)rnd(16);
		M.cfg.max_inflight_bytes = 1024 + rnd(8192);
		M.cfg.missing_topic_timeout_ms = 200;
		M.nrows = 1 + rnd(MAXROWS);
		M.burst = rnd(3) == 0;
		for (size_t i = 0; i < M.nrows; i++) {
			M.sizes[i] = 1 + rnd(sizeof(M.values[0]) - 1);
			M.keys[i] = (int)rnd(KEYS);
			memset(M.values[i], 'a' + (int)(i % 26), M.sizes[i]);
			if (M.sizes[i] + 1 > M.max_record)
				M.max_record = M.sizes[i] + 1;
		}
		obx_dlv_init(&M.dlv, &M.cfg, OBX_DLV_SNAPSHOT, OBX_DLV_ON_ERROR, &ops, NULL, &M.met, &M.waits);
		while (r == 1 && runs < 50) {
			M.faults = runs < 4; /* the broker heals */
			r = run(&now);
			runs++;
		}
		assert_int_not_equal(r, 1);
		obx_dlv_reset(&M.dlv);
		obx_config_reset(&M.cfg);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
