/*
 * Polling mode's decisions for a claimed batch (src/core/pollcore.c): focused
 * cases first, then a randomized model of the whole cycle.
 *
 * The model keeps a table of outbox rows over a few keys (an application
 * inserts some between claims), claims them as the claim statement of
 * src/core/pollsql.c does (batch rows in seq order, a row kept only when no
 * older pending row of its key is outside the claim, at most
 * obx_poll_claim_rows()), produces what the core says to a fake producer
 * that sometimes refuses a produce call, and serves delivery reports in
 * any order across keys but in produce order within a key and topic (a
 * partition), sometimes refused.  Stop signals (a drain with the broker
 * down meets the deadline; a second signal abandons), stale and duplicate
 * reports, and crashes (the batch is dropped unmarked: the transaction
 * rolls back, the rows stay pending; what the producer had sent may still
 * land in Kafka) come at random.  It checks:
 *   - no row is marked published before its record was acknowledged in the
 *     batch that marks it, and a row given up has used its attempts;
 *   - when a record of a key lands in Kafka, every older row of the key
 *     landed before, is published, or was handled ahead of it in the same
 *     batch without holding it back (given up, dead-lettered, or refused by
 *     the broker after the produce call: docs/internals/design.md, "Polling mode");
 *   - next() passes over exactly the rows behind a failure of their key;
 *   - decisions, report outcomes and the drain follow the rules, reports
 *     of an earlier batch or of a row not in flight change nothing;
 *   - rows not acknowledged, failed or given up stay untouched.
 * At the end of each seed the broker is healthy and cycles run until no row
 * is pending: every row must be published, each after an acknowledgement,
 * a dead-letter copy, or being given up after [poll] max_attempts.
 *
 * OBX_MODEL_SEEDS=N runs seeds 1..N (default 300), OBX_MODEL_SEED=S only S.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/config.h"
#include "obx/core/err.h"
#include "obx/run/poll.h"
#include "obx/core/pollcore.h"
#include "obx/core/relaycore.h"

static void
set(struct obx_config *c, const char *section, const char *key, const char *value)
{
	char err[256];

	if (obx_config_set(c, section, key, value, "test", false, err, sizeof(err)) != 0)
		fail_msg("config %s.%s = %s: %s", section, key, value, err);
}

static void
add(struct obx_pollcore *pc, int64_t seq, long long attempts, const char *key, const char *err)
{
	assert_int_equal(obx_pollcore_add(pc, seq, attempts, key, key != NULL ? strlen(key) : 0, err), 0);
}

/* The next row obx_pollcore_next() gives, or -1. */
static int
next(struct obx_pollcore *pc)
{
	size_t i;

	return obx_pollcore_next(pc, &i) ? (int)i : -1;
}

static void
test_claim_rows(void **state)
{
	struct obx_config c;

	(void)state;
	obx_config_init(&c);
	set(&c, "poll", "batch", "500");
	set(&c, "delivery", "max_inflight", "1000");
	assert_int_equal(obx_poll_claim_rows(&c), 500);
	set(&c, "delivery", "max_inflight", "20");
	assert_int_equal(obx_poll_claim_rows(&c), 20);
	set(&c, "poll", "batch", "20");
	assert_int_equal(obx_poll_claim_rows(&c), 20);
	obx_config_reset(&c);
}

/* A row that cannot be built or whose produce call fails holds back the later rows of its key. */
static void
test_hold_back_per_key(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };
	size_t count[OBX_PROW_NSTATES];

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_pollcore_begin(&pc, &c, 2), 0); /* grows past the hint */
	add(&pc, 10, 0, "a", NULL);
	add(&pc, 11, 0, "b", NULL);
	add(&pc, 12, 0, "a", NULL);
	add(&pc, 13, 0, NULL, NULL);
	add(&pc, 14, 0, "b", NULL);
	add(&pc, 15, 0, "c", NULL);
	add(&pc, 16, 0, NULL, NULL);
	add(&pc, 17, 0, "c", NULL);
	assert_int_equal(next(&pc), 0);
	assert_int_equal(obx_pollcore_decide(&pc, 0, false), OBX_POLL_FAIL);
	assert_int_equal(obx_pollcore_failed(&pc, 0, OBX_POLL_FAILED_BUILD, "no key"), 0);
	assert_int_equal(next(&pc), 1);
	assert_int_equal(obx_pollcore_decide(&pc, 1, true), OBX_POLL_SEND);
	obx_pollcore_sent(&pc, 1, false);
	assert_int_equal(next(&pc), 3); /* 12 (a) is held behind 10 */
	assert_int_equal(obx_pollcore_failed(&pc, 3, OBX_POLL_FAILED_PRODUCE, "refused"), 0);
	assert_int_equal(next(&pc), 4); /* a NULL key holds nothing back */
	obx_pollcore_sent(&pc, 4, false);
	assert_int_equal(next(&pc), 5);
	assert_int_equal(obx_pollcore_failed(&pc, 5, OBX_POLL_FAILED_DEAD_LETTER, "copy refused"), 0);
	assert_int_equal(next(&pc), 6);
	assert_int_equal(next(&pc), 7); /* a dead-letter copy's failure holds nothing back */
	assert_int_equal(next(&pc), -1);
	assert_int_equal(obx_pollcore_row(&pc, 2)->state, OBX_PROW_SKIPPED);
	assert_string_equal(obx_pollcore_row(&pc, 0)->error, "no key");
	obx_pollcore_count(&pc, count);
	assert_int_equal(count[OBX_PROW_SKIPPED], 3);
	assert_int_equal(count[OBX_PROW_INFLIGHT], 2);
	assert_int_equal(count[OBX_PROW_FAILED], 3);
	assert_false(obx_pollcore_finished(&pc));

	/* the next batch forgets the holds */
	assert_int_equal(obx_pollcore_begin(&pc, &c, 2), 0);
	add(&pc, 12, 0, "a", NULL);
	assert_int_equal(next(&pc), 0);
	assert_true(obx_pollcore_finished(&pc));
	obx_pollcore_reset(&pc);
	obx_pollcore_reset(&pc); /* a zeroed one is a no-op */
	obx_config_reset(&c);
}

/* max_attempts reached: the dead-letter copy (its acknowledgement gives the row up), or only the mark. */
/* A row whose topic is missing while the wait goes on: pending, no attempt, its key held back. */
static void
test_wait_topic(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_pollcore_begin(&pc, &c, 4), 0);
	add(&pc, 10, 2, "a", NULL);
	add(&pc, 11, 0, "a", NULL);
	add(&pc, 12, 0, "b", NULL);
	add(&pc, 13, 0, "a", NULL);
	assert_int_equal(next(&pc), 0);
	obx_pollcore_sent(&pc, 0, false);
	/* in flight, then refused for its missing topic */
	assert_int_equal(obx_pollcore_wait_topic(&pc, 0), 0);
	assert_int_equal(obx_pollcore_row(&pc, 0)->state, OBX_PROW_SKIPPED);
	assert_int_equal(obx_pollcore_row(&pc, 0)->attempts, 2); /* no attempt counted */
	assert_true(obx_pollcore_finished(&pc));
	assert_int_equal(next(&pc), 2); /* 11 and 13 (a) wait behind it */
	obx_pollcore_sent(&pc, 2, false);
	assert_int_equal(next(&pc), -1);
	/* its late report is stale: the row is no longer in flight */
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 0, false), NULL, NULL),
	    OBX_POLL_REPORT_STALE);
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 2, false), NULL, NULL),
	    OBX_POLL_REPORT_ACKED);
	assert_false(obx_pollcore_take_mark(&pc, 0));
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

/* A failed report holds its key: a later row still waiting to be produced goes back to pending. */
static void
test_report_failure_holds_key(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_pollcore_begin(&pc, &c, 3), 0);
	add(&pc, 10, 0, "a", NULL);
	add(&pc, 11, 0, "a", NULL);
	add(&pc, 12, 0, "b", NULL);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(next(&pc), i);
		obx_pollcore_sent(&pc, (size_t)i, false); /* 11 and 12 wait behind a full queue */
	}
	assert_false(obx_pollcore_key_held(&pc, 1));
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 0, false), "MSG_SIZE_TOO_LARGE",
	                     "too large"),
	    OBX_POLL_REPORT_FAILED);
	assert_true(obx_pollcore_key_held(&pc, 1));
	assert_false(obx_pollcore_key_held(&pc, 2));
	obx_pollcore_unsent(&pc, 1);
	assert_int_equal(obx_pollcore_row(&pc, 1)->state, OBX_PROW_SKIPPED);
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 2, false), NULL, NULL),
	    OBX_POLL_REPORT_ACKED);
	assert_true(obx_pollcore_finished(&pc));
	assert_false(obx_pollcore_take_mark(&pc, 1)); /* never marked: claimed again after 10 */
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

static void
test_exhausted(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };

	(void)state;
	obx_config_init(&c);
	set(&c, "poll", "max_attempts", "3");
	set(&c, "delivery", "dead_letter_topic", "dlq");
	assert_int_equal(obx_pollcore_begin(&pc, &c, 4), 0);
	add(&pc, 1, 2, "a", "timed out");
	add(&pc, 2, 3, "b", "too large");
	add(&pc, 3, 3, "c", NULL);
	add(&pc, 4, 5, "d", "bad topic");
	assert_int_equal(obx_pollcore_decide(&pc, 0, true), OBX_POLL_SEND);
	assert_int_equal(obx_pollcore_decide(&pc, 0, false), OBX_POLL_FAIL);
	assert_int_equal(obx_pollcore_decide(&pc, 1, true), OBX_POLL_DEAD_LETTER);
	assert_int_equal(obx_pollcore_decide(&pc, 3, false), OBX_POLL_DEAD_LETTER);
	obx_pollcore_sent(&pc, 1, true);
	obx_pollcore_sent(&pc, 2, true);
	obx_pollcore_sent(&pc, 3, true);
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 1, true), NULL, NULL),
	    OBX_POLL_REPORT_DEAD_LETTERED);
	assert_int_equal(obx_pollcore_row(&pc, 1)->state, OBX_PROW_GIVEN_UP);
	assert_string_equal(obx_pollcore_row(&pc, 1)->error, "dead-lettered to dlq after 3 attempt(s): too large");
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 2, true), NULL, NULL),
	    OBX_POLL_REPORT_DEAD_LETTERED);
	assert_string_equal(obx_pollcore_row(&pc, 2)->error, "dead-lettered to dlq after 3 attempt(s): unknown");
	/* the copy refused: a failure like any other, retried as exhausted */
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 3, true), "MSG_SIZE_TOO_LARGE",
	                     "Broker: Message size too large"),
	    OBX_POLL_REPORT_FAILED);
	assert_int_equal(obx_pollcore_row(&pc, 3)->state, OBX_PROW_FAILED);
	assert_string_equal(obx_pollcore_row(&pc, 3)->error,
	    "dead-letter copy: MSG_SIZE_TOO_LARGE: Broker: Message size too large");
	assert_false(obx_pollcore_take_mark(&pc, 1)); /* given up is recorded, not marked */
	assert_true(obx_pollcore_finished(&pc));

	set(&c, "poll", "exhausted", "mark");
	assert_int_equal(obx_pollcore_begin(&pc, &c, 1), 0);
	add(&pc, 2, 3, "b", "too large");
	assert_int_equal(obx_pollcore_decide(&pc, 0, true), OBX_POLL_GIVE_UP);
	obx_pollcore_give_up(&pc, 0);
	assert_int_equal(obx_pollcore_row(&pc, 0)->state, OBX_PROW_GIVEN_UP);
	assert_string_equal(obx_pollcore_row(&pc, 0)->error, "given up after 3 attempt(s): too large");
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

/* A report of an earlier batch, of a row past the batch or of a row not in flight changes nothing. */
static void
test_stale_report(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };
	uint64_t old;

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_pollcore_begin(&pc, &c, 2), 0);
	add(&pc, 1, 0, "a", NULL);
	add(&pc, 2, 0, "b", NULL);
	obx_pollcore_sent(&pc, 0, false);
	old = obx_pollcore_opaque(&pc, 0, false);
	obx_pollcore_end(&pc);
	assert_int_equal(obx_pollcore_report(&pc, old, NULL, NULL), OBX_POLL_REPORT_STALE); /* no batch */

	assert_int_equal(obx_pollcore_begin(&pc, &c, 2), 0);
	add(&pc, 1, 0, "a", NULL);
	add(&pc, 2, 0, "b", NULL);
	obx_pollcore_sent(&pc, 0, false);
	obx_pollcore_sent(&pc, 1, false);
	assert_int_not_equal(obx_pollcore_opaque(&pc, 0, false), old);
	assert_int_equal(obx_pollcore_report(&pc, old, NULL, NULL), OBX_POLL_REPORT_STALE);
	assert_int_equal(obx_pollcore_report(&pc, old, "ERR", "text"), OBX_POLL_REPORT_STALE);
	assert_int_equal(obx_pollcore_row(&pc, 0)->state, OBX_PROW_INFLIGHT);
	assert_int_equal(pc.outstanding, 2);
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 0, false) + 5, NULL, NULL),
	    OBX_POLL_REPORT_STALE); /* past the batch */
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 0, false), NULL, NULL),
	    OBX_POLL_REPORT_ACKED);
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 0, false), "ERR", "again"),
	    OBX_POLL_REPORT_STALE); /* no longer in flight */
	assert_int_equal(obx_pollcore_row(&pc, 0)->state, OBX_PROW_ACKED);
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 1, false), "REQUEST_TIMED_OUT",
	                     "Broker: Request timed out"),
	    OBX_POLL_REPORT_FAILED);
	assert_string_equal(obx_pollcore_row(&pc, 1)->error, "REQUEST_TIMED_OUT: Broker: Request timed out");
	assert_true(obx_pollcore_finished(&pc));
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

/* The drain deadline marks what was acknowledged; the rows in flight and unsent stay pending. */
static void
test_drain_deadline(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };
	int64_t t0 = 5000;

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_pollcore_begin(&pc, &c, 4), 0);
	for (int i = 0; i < 4; i++)
		add(&pc, 100 + i, 0, (const char *[]){ "a", "b", "c", "d" }[i], NULL);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(next(&pc), i);
		obx_pollcore_sent(&pc, (size_t)i, false);
	}
	assert_int_equal(obx_pollcore_drain(&pc, t0), OBX_POLL_DRAIN_WAIT);
	obx_pollcore_stop(&pc, 1, t0);
	assert_int_equal(next(&pc), -1); /* stopping: row 3 stays unsent */
	assert_int_equal(obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, 1, false), NULL, NULL),
	    OBX_POLL_REPORT_ACKED);
	assert_int_equal(obx_pollcore_drain(&pc, t0 + OBX_CORE_DRAIN_TIMEOUT_MS - 1), OBX_POLL_DRAIN_WAIT);
	assert_int_equal(obx_pollcore_drain(&pc, t0 + OBX_CORE_DRAIN_TIMEOUT_MS), OBX_POLL_DRAIN_DEADLINE);
	assert_false(obx_pollcore_finished(&pc));
	assert_false(obx_pollcore_take_mark(&pc, 0));
	assert_true(obx_pollcore_take_mark(&pc, 1));
	assert_false(obx_pollcore_take_mark(&pc, 1)); /* once */
	assert_false(obx_pollcore_take_mark(&pc, 2));
	assert_false(obx_pollcore_take_mark(&pc, 3));
	assert_int_equal(obx_pollcore_row(&pc, 0)->state, OBX_PROW_INFLIGHT);
	assert_int_equal(obx_pollcore_row(&pc, 3)->state, OBX_PROW_SKIPPED);
	obx_pollcore_stop(&pc, 2, t0);
	assert_int_equal(obx_pollcore_drain(&pc, t0 + 1), OBX_POLL_DRAIN_ABANDON);
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

/* Early marking waits for OBX_POLLCORE_MARK_EARLY_MIN acknowledged rows not taken yet. */
static void
test_mark_early(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };
	size_t n = 2 * OBX_POLLCORE_MARK_EARLY_MIN + 10, taken = 0;

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_pollcore_begin(&pc, &c, n), 0);
	for (size_t i = 0; i < n; i++) {
		add(&pc, (int64_t)i + 1, 0, "k", NULL);
		obx_pollcore_sent(&pc, i, false);
	}
	for (size_t i = 0; i + 1 < OBX_POLLCORE_MARK_EARLY_MIN; i++)
		obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, i, false), NULL, NULL);
	assert_false(obx_pollcore_mark_early(&pc));
	obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, OBX_POLLCORE_MARK_EARLY_MIN - 1, false), NULL, NULL);
	assert_true(obx_pollcore_mark_early(&pc));
	for (size_t i = 0; i < n; i++)
		taken += obx_pollcore_take_mark(&pc, i);
	assert_int_equal(taken, OBX_POLLCORE_MARK_EARLY_MIN);
	assert_false(obx_pollcore_mark_early(&pc));
	for (size_t i = OBX_POLLCORE_MARK_EARLY_MIN; i < n; i++)
		obx_pollcore_report(&pc, obx_pollcore_opaque(&pc, i, false), i % 2 ? NULL : "ERR", "x");
	assert_false(obx_pollcore_mark_early(&pc)); /* (n - 64) / 2 = 37 more */
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

/* A failure is recorded as attempt attempts + 1 with its backoff. */
static void
test_backoff(void **state)
{
	struct obx_config c;
	struct obx_pollcore pc = { 0 };

	(void)state;
	obx_config_init(&c);
	set(&c, "poll", "backoff_min", "100ms");
	set(&c, "poll", "backoff_max", "1s");
	assert_int_equal(obx_pollcore_begin(&pc, &c, 1), 0);
	add(&pc, 1, 2, "k", "earlier");
	assert_int_equal(obx_pollcore_backoff_ms(&pc, 0, 0), 200); /* attempt 3: 400, at least half */
	assert_int_equal(obx_pollcore_backoff_ms(&pc, 0, 200), 400);
	assert_int_equal(obx_pollcore_backoff_ms(&pc, 0, 12345), obx_poll_backoff_ms(3, 100, 1000, 12345));
	obx_pollcore_reset(&pc);
	obx_config_reset(&c);
}

/* ---- the model ---- */

#define MODEL_SEEDS 300
#define MODEL_CYCLES 80
#define NKEYS 4
#define MAXROWS 2048
#define NSTALE 32

static uint64_t rng;

/* splitmix64: the same sequence everywhere */
static uint64_t
rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint32_t
below(uint32_t n)
{
	return n ? (uint32_t)(rnd() % n) : 0;
}

/* True with probability pm per mille. */
static bool
chance(uint32_t pm)
{
	return below(1000) < pm;
}

/* What the seeds exercised, printed at the end: a model that checks nothing proves nothing. */
enum mstat {
	ST_BATCHES,
	ST_ACKED,
	ST_REFUSED,
	ST_REJECTED,
	ST_UNBUILDABLE,
	ST_HELD,
	ST_DEAD_LETTERED,
	ST_GIVEN_UP,
	ST_CRASHES,
	ST_LANDED_AT_CRASH,
	ST_DEADLINES,
	ST_ABANDONED,
	ST_QFULL_STOPS,
	ST_EARLY_MARKS,
	ST_STALE,
	ST_REORDERED,
	ST_NSTATS
};
static const char *const stat_names[ST_NSTATS] = {
	"batches",
	"acknowledged",
	"reports refused",
	"produce calls refused",
	"unbuildable",
	"rows held back",
	"dead-lettered",
	"given up",
	"crashes",
	"landed at a crash",
	"drain deadlines",
	"batches abandoned",
	"queue-full stops",
	"early markings",
	"stale reports",
	"refused reordered",
};
static long stats[ST_NSTATS];

/* What the current batch did with a row. */
enum mout {
	OUT_NONE,     /* nothing (yet): SKIPPED */
	OUT_SENT,     /* its record is in flight */
	OUT_ACKED,    /* acknowledged */
	OUT_REFUSED,  /* its report failed */
	OUT_FAILED,   /* it could not be built or produced: holds its key back */
	OUT_GAVE_UP,  /* marked without a send */
	OUT_DL_SENT,  /* its dead-letter copy is in flight */
	OUT_DL_ACKED, /* its dead-letter copy was acknowledged */
	OUT_DL_FAILED /* its dead-letter copy could not be produced, or was refused */
};

enum mvia { VIA_NONE, VIA_ACK, VIA_DEAD_LETTER, VIA_GIVE_UP };

struct mrow {
	int64_t seq;
	int key;
	long long attempts;
	bool published;
	enum mvia via;
	int64_t due_ms;
	bool unbuildable;
	int refuse_left; /* the broker refuses its record this many more times */
	int reject_left; /* its produce call fails this many more times */
	bool landed;     /* its record is in Kafka, at least once */
	uint64_t bid;    /* the batch that handled it last (M.bid), and how */
	enum mout out;
	bool taken; /* taken for marking in batch bid */
};

struct mflight {
	int row;
	bool dl;
	uint64_t bid;
	uint64_t opaque;
};

struct model {
	uint64_t seed;
	int max_attempts;
	bool mark_only;
	struct mrow rows[MAXROWS];
	size_t nrows;
	struct mflight fl[MAXROWS]; /* the producer's queue, in produce order */
	size_t nfl;
	int claim[MAXROWS]; /* the batch: the core's index -> row */
	size_t nclaim, mnext;
	uint64_t bid;  /* batches so far, across restarts */
	unsigned held; /* keys held back in this batch, a bit each */
	int signals;
	int64_t stop_ms, now;
	bool broker_down, quiet;
	uint64_t stale[NSTALE], done[MAXROWS];
	size_t nstale, ndone;
	bool failed;
	int cycle;
};

static struct model M;
static struct obx_config mcfg;
static const char *const keys[NKEYS] = { "k0", "k1", "k2", "k3" };

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
violation(const char *fmt, ...)
{
	va_list ap;
	char text[512];

	if (M.failed)
		return;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	print_error("pollcore model: seed %" PRIu64 ", cycle %d, batch %" PRIu64 ": %s\n"
	            "  (rerun with OBX_MODEL_SEED=%" PRIu64 ")\n",
	    M.seed, M.cycle, M.bid, text, M.seed);
	M.failed = true;
}

static void
insert_rows(int n)
{
	for (int k = 0; k < n && M.nrows < MAXROWS; k++) {
		struct mrow *r = &M.rows[M.nrows];

		memset(r, 0, sizeof(*r));
		r->seq = 1000 + (int64_t)M.nrows * 3; /* gaps, as an identity column may leave */
		r->key = (int)below(NKEYS);
		r->due_ms = M.now;
		r->unbuildable = chance(20);
		r->refuse_left = chance(60) ? (int)below(4) + 1 : 0;
		r->reject_left = chance(30) ? (int)below(3) + 1 : 0;
		M.nrows++;
	}
}

/*
 * The claim statement: the first batch due rows in seq order; of those, a
 * row is kept only when no older pending row of its key is outside them;
 * at most obx_poll_claim_rows().
 */
static size_t
claim(void)
{
	int64_t first_outside[NKEYS];
	static bool locked[MAXROWS];
	size_t nl = 0;

	for (int k = 0; k < NKEYS; k++)
		first_outside[k] = INT64_MAX;
	for (size_t i = 0; i < M.nrows; i++) {
		const struct mrow *r = &M.rows[i];

		locked[i] = !r->published && r->due_ms <= M.now && nl < (size_t)mcfg.poll_batch;
		nl += locked[i];
		if (!r->published && !locked[i] && r->seq < first_outside[r->key])
			first_outside[r->key] = r->seq;
	}
	M.nclaim = 0;
	for (size_t i = 0; i < M.nrows && M.nclaim < (size_t)obx_poll_claim_rows(&mcfg); i++)
		if (locked[i] && M.rows[i].seq < first_outside[M.rows[i].key])
			M.claim[M.nclaim++] = (int)i;
	return M.nclaim;
}

static void
signal_stop(struct obx_pollcore *pc)
{
	if (++M.signals == 1)
		M.stop_ms = M.now;
	obx_pollcore_stop(pc, M.signals, M.stop_ms);
}

/* A record of row x landed in Kafka in batch bid: every older row of its key is accounted for. */
static void
check_order(int x, uint64_t bid)
{
	const struct mrow *r = &M.rows[x];

	for (int y = 0; y < x; y++) {
		const struct mrow *o = &M.rows[y];

		if (o->key != r->key || o->landed || o->published)
			continue;
		if (o->bid == bid && (o->out == OUT_REFUSED || o->out == OUT_GAVE_UP || o->out >= OUT_DL_SENT)) {
			stats[ST_REORDERED] += o->out == OUT_REFUSED;
			continue; /* handled ahead of it in this batch, without holding it back */
		}
		violation("row seq %" PRId64 " of key %s landed in Kafka before the older row seq %" PRId64
		          " (out %d in batch %" PRIu64 ")",
		    r->seq, keys[r->key], o->seq, (int)o->out, o->bid);
		return;
	}
}

static void
land(const struct mflight *f)
{
	if (f->dl)
		return; /* the dead-letter topic: its own partitions */
	check_order(f->row, f->bid);
	M.rows[f->row].landed = true;
}

/* The process ends: of what the producer still holds, a prefix of each partition may have landed. */
static void
restart(struct obx_pollcore *pc)
{
	bool cut[2][NKEYS] = { { false } };

	for (size_t i = 0; i < M.nfl; i++) {
		const struct mflight *f = &M.fl[i];
		bool *c = &cut[f->dl][M.rows[f->row].key];

		if (!*c && chance(500)) {
			land(f);
			stats[ST_LANDED_AT_CRASH]++;
		} else {
			*c = true;
		}
	}
	M.nfl = 0;
	M.signals = 0;
	M.stop_ms = 0;
	M.broker_down = false;
	M.nstale = 0;
	M.ndone = 0;
	obx_pollcore_reset(pc); /* a new process */
}

static void
crash(struct obx_pollcore *pc)
{
	stats[ST_CRASHES]++;
	restart(pc); /* the transaction rolls back: nothing of the batch is recorded */
}

static void
push_flight(struct obx_pollcore *pc, size_t i, bool dl)
{
	M.fl[M.nfl++] = (struct mflight){ M.claim[i], dl, M.bid, obx_pollcore_opaque(pc, i, dl) };
	obx_pollcore_sent(pc, i, dl);
	M.rows[M.claim[i]].out = dl ? OUT_DL_SENT : OUT_SENT;
}

/* A row the core gave as not exhausted: build it and produce its record. */
static void
send_row(struct obx_pollcore *pc, size_t i, enum obx_poll_action a)
{
	struct mrow *r = &M.rows[M.claim[i]];

	if (a == OBX_POLL_FAIL) {
		stats[ST_UNBUILDABLE]++;
		if (obx_pollcore_failed(pc, i, OBX_POLL_FAILED_BUILD, "cannot build") != 0)
			violation("obx_pollcore_failed() failed");
		r->out = OUT_FAILED;
		M.held |= 1U << r->key;
		return;
	}
	if (!M.quiet && M.signals == 0 && chance(8)) {
		stats[ST_QFULL_STOPS]++; /* the queue is full, then a stop signal: left pending */
		signal_stop(pc);
		return;
	}
	if (r->reject_left > 0 || (!M.quiet && chance(10))) {
		if (r->reject_left > 0)
			r->reject_left--;
		stats[ST_REJECTED]++;
		if (obx_pollcore_failed(pc, i, OBX_POLL_FAILED_PRODUCE, "Local: Invalid argument") != 0)
			violation("obx_pollcore_failed() failed");
		r->out = OUT_FAILED;
		M.held |= 1U << r->key;
		return;
	}
	push_flight(pc, i, false);
}

static void
handle_row(struct obx_pollcore *pc, size_t i)
{
	struct mrow *r = &M.rows[M.claim[i]];
	enum obx_poll_action want, got;

	if (r->attempts >= M.max_attempts)
		want = M.mark_only ? OBX_POLL_GIVE_UP : OBX_POLL_DEAD_LETTER;
	else
		want = r->unbuildable ? OBX_POLL_FAIL : OBX_POLL_SEND;
	if ((got = obx_pollcore_decide(pc, i, !r->unbuildable)) != want) {
		violation("row seq %" PRId64 " (attempts %lld): decided %d, not %d", r->seq, r->attempts, (int)got,
		    (int)want);
		return;
	}
	switch (got) {
	case OBX_POLL_GIVE_UP:
		obx_pollcore_give_up(pc, i);
		r->out = OUT_GAVE_UP;
		return;
	case OBX_POLL_DEAD_LETTER:
		if (!M.quiet && chance(50)) {
			(void)obx_pollcore_failed(pc, i, OBX_POLL_FAILED_DEAD_LETTER, "dead-letter copy: refused");
			r->out = OUT_DL_FAILED;
		} else {
			push_flight(pc, i, true);
		}
		return;
	default:
		send_row(pc, i, got);
		return;
	}
}

/* The row next() must give: the next one not held back, none once stopping. */
static int
expect_next(void)
{
	while (M.mnext < M.nclaim) {
		if (M.held & (1U << M.rows[M.claim[M.mnext]].key)) {
			M.mnext++;
			stats[ST_HELD]++;
			continue;
		}
		if (M.signals > 0)
			return -1;
		return (int)M.mnext++;
	}
	return -1;
}

/* Produces the batch.  Returns false when the process crashed meanwhile. */
static bool
produce_phase(struct obx_pollcore *pc)
{
	for (;;) {
		int want = expect_next(), got;
		size_t i;

		got = obx_pollcore_next(pc, &i) ? (int)i : -1;
		if (got != want) {
			violation("obx_pollcore_next() gave %d, not %d", got, want);
			return false;
		}
		if (got < 0 || M.failed)
			return !M.failed;
		if (!M.quiet && chance(5)) {
			crash(pc);
			return false;
		}
		if (!M.quiet && chance(3))
			signal_stop(pc);
		else
			handle_row(pc, i);
	}
}

/* Serves the report of the oldest record of a random partition (topic and key). */
static void
serve_report(struct obx_pollcore *pc)
{
	int first[2][NKEYS], groups[2 * NKEYS], ng = 0, pick;
	struct mflight f;
	struct mrow *r;
	enum obx_poll_report want, got;
	bool ok;

	memset(first, -1, sizeof(first));
	for (size_t i = 0; i < M.nfl; i++) {
		int *g = &first[M.fl[i].dl][M.rows[M.fl[i].row].key];

		if (*g < 0) {
			*g = (int)i;
			groups[ng++] = (int)i;
		}
	}
	if (ng == 0)
		return;
	pick = groups[below((uint32_t)ng)];
	f = M.fl[pick];
	memmove(&M.fl[pick], &M.fl[pick + 1], (M.nfl - (size_t)pick - 1) * sizeof(M.fl[0]));
	M.nfl--;
	r = &M.rows[f.row];
	if (f.dl)
		ok = M.quiet || !chance(50);
	else if (r->refuse_left > 0)
		ok = (r->refuse_left--, false);
	else
		ok = M.quiet || !chance(30);
	if (ok)
		land(&f);
	if (f.bid != M.bid)
		want = OBX_POLL_REPORT_STALE;
	else
		want = !ok ? OBX_POLL_REPORT_FAILED : f.dl ? OBX_POLL_REPORT_DEAD_LETTERED : OBX_POLL_REPORT_ACKED;
	got = obx_pollcore_report(pc, f.opaque, ok ? NULL : "REQUEST_TIMED_OUT",
	    ok ? NULL : "Broker: Request timed out");
	if (got != want) {
		violation("report for row seq %" PRId64 "%s: %d, not %d", r->seq,
		    f.dl ? " (dead-letter copy)" : "", (int)got, (int)want);
		return;
	}
	M.done[M.ndone++] = f.opaque;
	if (got == OBX_POLL_REPORT_ACKED)
		r->out = OUT_ACKED;
	else if (got == OBX_POLL_REPORT_DEAD_LETTERED)
		r->out = OUT_DL_ACKED;
	else
		r->out = f.dl ? OUT_DL_FAILED : OUT_REFUSED;
	stats[ok ? ST_ACKED : ST_REFUSED]++;
}

/* A report the core must ignore: of an earlier batch, or again for a row already reported. */
static void
stale_report(struct obx_pollcore *pc)
{
	enum obx_prow_state before[MAXROWS];
	size_t outstanding = pc->outstanding;
	uint64_t o;

	if (M.nstale == 0 && M.ndone == 0)
		return;
	if (M.ndone == 0 || (M.nstale > 0 && chance(500)))
		o = M.stale[below((uint32_t)M.nstale)];
	else
		o = M.done[below((uint32_t)M.ndone)];
	for (size_t i = 0; i < pc->nrows; i++)
		before[i] = obx_pollcore_row(pc, i)->state;
	if (obx_pollcore_report(pc, o, chance(500) ? NULL : "ERR", "x") != OBX_POLL_REPORT_STALE)
		violation("a stale report (opaque %#" PRIx64 ") counted", o);
	if (pc->outstanding != outstanding)
		violation("a stale report changed the count in flight");
	for (size_t i = 0; i < pc->nrows; i++)
		if (before[i] != obx_pollcore_row(pc, i)->state)
			violation("a stale report changed row %zu", i);
	stats[ST_STALE]++;
}

/* Takes the rows the core gives for marking; each must have been acknowledged in this batch. */
static void
take_marks(struct obx_pollcore *pc)
{
	for (size_t i = 0; i < M.nclaim; i++) {
		struct mrow *r = &M.rows[M.claim[i]];

		if (!obx_pollcore_take_mark(pc, i))
			continue;
		if (r->out != OUT_ACKED || r->taken || !r->landed)
			violation("row seq %" PRId64 " marked without its acknowledgement (out %d)", r->seq,
			    (int)r->out);
		r->taken = true;
	}
}

static void
check_mark_early(struct obx_pollcore *pc)
{
	size_t waiting = 0;

	for (size_t i = 0; i < M.nclaim; i++)
		waiting += M.rows[M.claim[i]].out == OUT_ACKED && !M.rows[M.claim[i]].taken;
	if (obx_pollcore_mark_early(pc) != (waiting >= OBX_POLLCORE_MARK_EARLY_MIN)) {
		violation("obx_pollcore_mark_early() with %zu acknowledged rows not taken", waiting);
		return;
	}
	if (waiting >= OBX_POLLCORE_MARK_EARLY_MIN && chance(700)) {
		stats[ST_EARLY_MARKS]++;
		take_marks(pc);
	}
}

/*
 * Waits for the batch's reports as wait_acks() does.  Returns true when
 * the batch goes on to its COMMIT (every report in, or the drain
 * deadline), false when it was abandoned or the process crashed.
 */
static bool
wait_phase(struct obx_pollcore *pc)
{
	for (int turns = 0; !obx_pollcore_finished(pc); turns++) {
		uint32_t r = below(1000);
		enum obx_poll_drain want, got;

		check_mark_early(pc);
		if (turns > 20000 || M.failed) {
			violation("the wait for %zu report(s) did not end", pc->outstanding);
			return false;
		}
		if (r < 450 && !M.broker_down)
			for (int k = 1 + (int)below(4); k > 0; k--)
				serve_report(pc);
		else if (r < 550 && !M.quiet && (!M.broker_down || chance(300)))
			M.broker_down = !M.broker_down;
		else if (r < 700)
			M.now += 50 + below(M.broker_down ? 6000 : 1000);
		else if (r < 720 && !M.quiet && (M.signals == 0 || chance(100)))
			signal_stop(pc); /* a second signal is rarer: the drain deadline comes too */
		else if (r < 730 && !M.quiet) {
			crash(pc);
			return false;
		} else if (r < 800)
			stale_report(pc);
		if (M.quiet)
			M.broker_down = false;
		want = M.signals > 1                                                 ? OBX_POLL_DRAIN_ABANDON :
		    M.signals == 1 && M.now - M.stop_ms >= OBX_CORE_DRAIN_TIMEOUT_MS ? OBX_POLL_DRAIN_DEADLINE :
		                                                                       OBX_POLL_DRAIN_WAIT;
		if ((got = obx_pollcore_drain(pc, M.now)) != want) {
			violation("obx_pollcore_drain() said %d, not %d", (int)got, (int)want);
			return false;
		}
		if (got == OBX_POLL_DRAIN_ABANDON) {
			stats[ST_ABANDONED]++;
			restart(pc); /* nothing marked: the rows stay pending */
			return false;
		}
		if (got == OBX_POLL_DRAIN_DEADLINE) {
			stats[ST_DEADLINES]++;
			return true;
		}
	}
	return true;
}

/* The state the core must hold for row r after this batch handled it as r->out. */
static bool
state_matches(const struct mrow *r, enum obx_prow_state s)
{
	switch (r->out) {
	case OUT_NONE:
		return s == OBX_PROW_SKIPPED;
	case OUT_SENT:
	case OUT_DL_SENT:
		return s == OBX_PROW_INFLIGHT;
	case OUT_ACKED:
		return s == OBX_PROW_ACKED;
	case OUT_REFUSED:
	case OUT_FAILED:
	case OUT_DL_FAILED:
		return s == OBX_PROW_FAILED;
	case OUT_GAVE_UP:
	case OUT_DL_ACKED:
		return s == OBX_PROW_GIVEN_UP;
	}
	return false;
}

/* Records row i as cycle() does before the COMMIT (applied only if the COMMIT happens). */
static void
record_row(struct obx_pollcore *pc, size_t i, bool commit)
{
	struct mrow *r = &M.rows[M.claim[i]];
	const struct obx_prow *pr = obx_pollcore_row(pc, i);
	uint32_t x = (uint32_t)rnd();

	if (!state_matches(r, pr->state))
		violation("row seq %" PRId64 " is in state %d after out %d", r->seq, (int)pr->state, (int)r->out);
	if (pr->seq != r->seq || pr->attempts != r->attempts)
		violation("row seq %" PRId64 " reads as seq %" PRId64 ", %lld attempt(s)", r->seq, pr->seq,
		    pr->attempts);
	if (pr->state == OBX_PROW_GIVEN_UP && r->attempts < M.max_attempts)
		violation("row seq %" PRId64 " given up after %lld attempt(s)", r->seq, r->attempts);
	if (!commit)
		return;
	if (pr->state == OBX_PROW_FAILED) {
		int64_t d = obx_pollcore_backoff_ms(pc, i, x);

		if (d !=
		    obx_poll_backoff_ms(r->attempts + 1, mcfg.poll_backoff_min_ms, mcfg.poll_backoff_max_ms, x))
			violation("row seq %" PRId64 ": backoff %" PRId64 " ms", r->seq, d);
		r->attempts++;
		r->due_ms = M.now + d;
	} else if (pr->state == OBX_PROW_GIVEN_UP) {
		r->published = true;
		r->via = r->out == OUT_DL_ACKED ? VIA_DEAD_LETTER : VIA_GIVE_UP;
		stats[r->out == OUT_DL_ACKED ? ST_DEAD_LETTERED : ST_GIVEN_UP]++;
	} else if (pr->state == OBX_PROW_ACKED && r->taken) {
		r->published = true;
		r->via = VIA_ACK;
	}
}

/* Records the failures, marks what was acknowledged, COMMITs (or crashes before it). */
static void
commit(struct obx_pollcore *pc)
{
	bool crashed = !M.quiet && chance(20);

	take_marks(pc);
	for (size_t i = 0; i < M.nclaim && !M.failed; i++) {
		const struct mrow *r = &M.rows[M.claim[i]];

		if (r->out == OUT_ACKED && !r->taken)
			violation("acknowledged row seq %" PRId64 " not marked at the COMMIT", r->seq);
		record_row(pc, i, !crashed);
	}
	if (crashed) {
		crash(pc);
		return;
	}
	for (size_t i = 0; i < M.ndone && M.nstale < NSTALE; i++)
		M.stale[M.nstale++] = M.done[i];
	obx_pollcore_end(pc);
	if (M.signals > 0)
		restart(pc); /* a stop ends the process after its batch */
}

/* One cycle: claim, produce, wait, record and COMMIT.  Returns the rows claimed. */
static size_t
run_cycle(struct obx_pollcore *pc)
{
	size_t n = claim();

	if (n == 0)
		return 0;
	M.bid++;
	stats[ST_BATCHES]++;
	if (obx_pollcore_begin(pc, &mcfg, chance(500) ? n : 1) != 0) {
		violation("obx_pollcore_begin() failed");
		return n;
	}
	for (size_t i = 0; i < n; i++) {
		struct mrow *r = &M.rows[M.claim[i]];

		if (obx_pollcore_add(pc, r->seq, r->attempts, keys[r->key], 2,
		        r->attempts > 0 ? "earlier failure" : NULL) != 0)
			violation("obx_pollcore_add() failed");
		r->bid = M.bid;
		r->out = OUT_NONE;
		r->taken = false;
	}
	M.mnext = 0;
	M.held = 0;
	M.ndone = 0;
	obx_pollcore_stop(pc, M.signals, M.stop_ms);
	if (produce_phase(pc) && wait_phase(pc) && !M.failed)
		commit(pc);
	return n;
}

/* The broker healthy, no crash, no signal: cycles until nothing is pending. */
static void
drain_all(struct obx_pollcore *pc)
{
	M.quiet = true;
	M.broker_down = false;
	for (int rounds = 0; rounds < 5000 && !M.failed; rounds++) {
		int64_t due = INT64_MAX;

		M.cycle++;
		if (run_cycle(pc) > 0)
			continue;
		for (size_t i = 0; i < M.nrows; i++)
			if (!M.rows[i].published && M.rows[i].due_ms < due)
				due = M.rows[i].due_ms;
		if (due == INT64_MAX)
			break;
		M.now = due > M.now ? due : M.now + 1;
	}
	for (size_t i = 0; i < M.nrows && !M.failed; i++) {
		const struct mrow *r = &M.rows[i];

		if (!r->published)
			violation("row seq %" PRId64 " is still pending after the drain", r->seq);
		else if (r->via == VIA_ACK && !r->landed)
			violation("row seq %" PRId64 " is published, its record never landed", r->seq);
		else if (r->via != VIA_ACK && r->attempts < M.max_attempts)
			violation("row seq %" PRId64 " went aside after %lld attempt(s)", r->seq, r->attempts);
	}
}

static void
run_seed(uint64_t seed)
{
	struct obx_pollcore pc = { 0 };
	char buf[32];

	memset(&M, 0, sizeof(M));
	M.seed = seed;
	rng = seed * 0x2545f4914f6cdd1dULL + 1;
	M.now = 1000000;
	obx_config_init(&mcfg);
	snprintf(buf, sizeof(buf), "%u", chance(200) ? 100 + below(150) : 1 + below(30));
	set(&mcfg, "poll", "batch", buf);
	snprintf(buf, sizeof(buf), "%u", chance(500) ? 2 + below(20) : 1000);
	set(&mcfg, "delivery", "max_inflight", buf);
	M.max_attempts = 1 + (int)below(4);
	snprintf(buf, sizeof(buf), "%d", M.max_attempts);
	set(&mcfg, "poll", "max_attempts", buf);
	M.mark_only = chance(300);
	set(&mcfg, "poll", "exhausted", M.mark_only ? "mark" : "dead_letter");
	set(&mcfg, "poll", "backoff_min", "10ms");
	set(&mcfg, "poll", "backoff_max", "500ms");
	for (M.cycle = 1; M.cycle <= MODEL_CYCLES && !M.failed; M.cycle++) {
		insert_rows((int)below(mcfg.poll_batch > 50 ? 40 : 8));
		(void)run_cycle(&pc);
		M.now += below(200);
	}
	if (!M.failed)
		drain_all(&pc);
	obx_pollcore_reset(&pc);
	obx_config_reset(&mcfg);
}

static void
test_model(void **state)
{
	const char *one = getenv("OBX_MODEL_SEED"), *many = getenv("OBX_MODEL_SEEDS");
	uint64_t first = 1, last = MODEL_SEEDS;
	int failures = 0;
	long rows = 0;

	(void)state;
	if (one != NULL)
		first = last = strtoull(one, NULL, 10);
	else if (many != NULL)
		last = strtoull(many, NULL, 10);
	for (uint64_t s = first; s <= last; s++) {
		run_seed(s);
		rows += (long)M.nrows;
		if (M.failed && ++failures >= 20)
			break;
	}
	print_message("pollcore model: seeds %" PRIu64 "..%" PRIu64 ", %ld rows, %d failing seed(s)\n", first,
	    last, rows, failures);
	for (int i = 0; i < ST_NSTATS; i++)
		print_message("  %-22s %ld\n", stat_names[i], stats[i]);
	if (failures > 0)
		fail_msg("%d seed(s) broke the model (see above)", failures);
}

/* Several tables: a claim per table in turn; idle only after a whole round moved nothing. */
static void
test_round_robin(void **state)
{
	struct obx_poll_round r;
	bool end;
	size_t visits[3] = { 0, 0, 0 };

	(void)state;
	obx_poll_round_init(&r, 3);
	/* table 0 is busy every time: tables 1 and 2 still get their turn each round */
	for (int round = 0; round < 5; round++) {
		for (int t = 0; t < 3; t++) {
			visits[r.cur]++;
			assert_false(obx_poll_round_next(&r, r.cur == 0 ? 10000 : 0, &end));
			assert_int_equal(end, t == 2);
		}
	}
	assert_int_equal(visits[0], 5);
	assert_int_equal(visits[1], 5);
	assert_int_equal(visits[2], 5);
	/* nothing anywhere: the round ends idle, once per round */
	assert_false(obx_poll_round_next(&r, 0, &end));
	assert_false(end);
	assert_false(obx_poll_round_next(&r, 0, &end));
	assert_true(obx_poll_round_next(&r, 0, &end));
	assert_true(end);
	assert_int_equal(r.cur, 0);
	/* a row in the last table of a round: not idle */
	assert_false(obx_poll_round_next(&r, 0, &end));
	assert_false(obx_poll_round_next(&r, 0, &end));
	assert_false(obx_poll_round_next(&r, 1, &end));
	assert_true(end);
	/* one table: every claim ends a round */
	obx_poll_round_init(&r, 1);
	assert_true(obx_poll_round_next(&r, 0, &end));
	assert_false(obx_poll_round_next(&r, 3, &end));
	assert_true(end);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_claim_rows),
		cmocka_unit_test(test_hold_back_per_key),
		cmocka_unit_test(test_wait_topic),
		cmocka_unit_test(test_report_failure_holds_key),
		cmocka_unit_test(test_exhausted),
		cmocka_unit_test(test_stale_report),
		cmocka_unit_test(test_drain_deadline),
		cmocka_unit_test(test_mark_early),
		cmocka_unit_test(test_backoff),
		cmocka_unit_test(test_model),
		cmocka_unit_test(test_round_robin),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
