/*
 * Restart de-duplication's decisions on their own (core/restart_dedupe.h): marks from
 * headers, Kafka's murmur2 partitioning, the read-back window protocol of
 * a scan, what a scan ignores and what makes it fall back, and the
 * verdicts for records of a session.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/restart_dedupe.h"
#include "obx/core/err.h"
#include "obx/core/eos_progress.h"

/* ---- records as the read-back or the core would hand them over ---- */

struct rec {
	char lsn[24], seq[16], id[40];
	struct obx_header h[3];
	size_t nh;
};

/* Headers lsn, seq, id of an outboxd record (id NULL: none). */
static const struct obx_header *
hdrs(struct rec *r, obx_lsn lsn, uint32_t seq, const char *id)
{
	obx_lsn_format(lsn, r->lsn, sizeof(r->lsn));
	snprintf(r->seq, sizeof(r->seq), "%u", seq);
	r->nh = 0;
	r->h[r->nh++] = (struct obx_header){ "lsn", r->lsn, strlen(r->lsn) };
	r->h[r->nh++] = (struct obx_header){ "seq", r->seq, strlen(r->seq) };
	if (id != NULL) {
		snprintf(r->id, sizeof(r->id), "%s", id);
		r->h[r->nh++] = (struct obx_header){ "id", r->id, strlen(r->id) };
	}
	return r->h;
}

/* The mark of an outboxd record's headers (the headers are made first, then parsed). */
static int
parse(struct rec *r, obx_lsn lsn, uint32_t seq, const char *id, struct obx_dd_mark *m)
{
	const struct obx_header *h = hdrs(r, lsn, seq, id);

	return obx_dd_mark_parse(h, r->nh, m);
}

static char notes[8192];

static void
on_note(void *ctx, enum obx_log_level level, const char *line)
{
	(void)ctx;
	(void)level;
	strlcat(notes, line, sizeof(notes));
	strlcat(notes, "\n", sizeof(notes));
}

/* A key that murmur2 places in partition p of nparts (k<i> for the smallest such i). */
static const char *
key_for(int32_t p, int32_t nparts, int skip)
{
	static char buf[8][16];
	static int next;
	char *k = buf[next++ % 8];

	for (int i = 0;; i++) {
		snprintf(k, 16, "k%d", i);
		if (obx_dd_partition(k, strlen(k), nparts) == p && skip-- == 0)
			return k;
	}
}

/* Feeds one outboxd record to partition p of s at offset. */
static void
feed(struct obx_dd_scan *s, int32_t p, int64_t offset, const char *key, obx_lsn lsn, uint32_t seq, const char *id)
{
	struct rec r;
	const struct obx_header *h = hdrs(&r, lsn, seq, id);

	obx_dd_scan_record(s, p, offset, key, key ? strlen(key) : 0, 10, h, r.nh);
}

/* ---- marks ---- */

static void
test_marks(void **state)
{
	struct obx_dd_mark m, m2;
	struct rec r;
	struct obx_header h[8];

	(void)state;
	assert_int_equal(parse(&r, 0x16B3748ULL | (2ULL << 32), 7, "e-1", &m), 0);
	assert_true(m.lsn == ((2ULL << 32) | 0x16B3748ULL));
	assert_int_equal(m.seq, 7);
	assert_true(m.id_hash != 0);
	/* the first occurrence wins: a user's header of the same name comes after outboxd's */
	h[0] = (struct obx_header){ "id", "e-1", 3 };
	h[1] = (struct obx_header){ "lsn", "2/16B3748", 9 };
	h[2] = (struct obx_header){ "seq", "7", 1 };
	h[3] = (struct obx_header){ "lsn", "0/1", 3 };
	h[4] = (struct obx_header){ "seq", "99", 2 };
	h[5] = (struct obx_header){ "id", "other", 5 };
	assert_int_equal(obx_dd_mark_parse(h, 6, &m2), 0);
	assert_int_equal(obx_dd_mark_cmp(&m, &m2), 0);
	assert_true(m.id_hash == m2.id_hash);
	/* no id: hash 0; a different id: a different hash */
	assert_int_equal(parse(&r, 5, 0, NULL, &m), 0);
	assert_true(m.id_hash == 0);
	assert_int_equal(parse(&r, 5, 0, "e-2", &m2), 0);
	assert_true(m2.id_hash != 0 && m2.id_hash != m.id_hash);
	/* not outboxd's: lsn or seq missing, null or malformed */
	assert_int_equal(obx_dd_mark_parse(h, 1, &m), OBX_ENOENT);
	assert_int_equal(obx_dd_mark_parse(h + 2, 1, &m), OBX_ENOENT);
	{
		static const char *const bad_lsn[] = { "", "16B3748", "0/", "0/ZZ", "123456789/0", "0/1 " };
		static const char *const bad_seq[] = { "", "-1", "1a", "4294967296", "99999999999", " 1" };

		for (size_t i = 0; i < sizeof(bad_lsn) / sizeof(bad_lsn[0]); i++) {
			h[0] = (struct obx_header){ "lsn", bad_lsn[i], strlen(bad_lsn[i]) };
			h[1] = (struct obx_header){ "seq", "1", 1 };
			assert_int_equal(obx_dd_mark_parse(h, 2, &m), OBX_ENOENT);
		}
		for (size_t i = 0; i < sizeof(bad_seq) / sizeof(bad_seq[0]); i++) {
			h[0] = (struct obx_header){ "lsn", "0/1", 3 };
			h[1] = (struct obx_header){ "seq", bad_seq[i], strlen(bad_seq[i]) };
			assert_int_equal(obx_dd_mark_parse(h, 2, &m), OBX_ENOENT);
		}
		h[0] = (struct obx_header){ "lsn", NULL, 0 };
		h[1] = (struct obx_header){ "seq", "1", 1 };
		assert_int_equal(obx_dd_mark_parse(h, 2, &m), OBX_ENOENT);
		h[0] = (struct obx_header){ "lsn", "FFFFFFFF/FFFFFFFF", 17 };
		h[1] = (struct obx_header){ "seq", "4294967295", 10 };
		assert_int_equal(obx_dd_mark_parse(h, 2, &m), 0);
		assert_true(m.lsn == UINT64_MAX && m.seq == UINT32_MAX);
	}
	/* order: by lsn, then seq */
	m = (struct obx_dd_mark){ 10, 5, 1 };
	m2 = (struct obx_dd_mark){ 10, 6, 2 };
	assert_true(obx_dd_mark_cmp(&m, &m2) < 0 && obx_dd_mark_cmp(&m2, &m) > 0);
	m2 = (struct obx_dd_mark){ 9, 100, 1 };
	assert_true(obx_dd_mark_cmp(&m, &m2) > 0);
}

/* ---- partitions ---- */

/* murmur2 values from Kafka's Java client tests (UtilsTest.testMurmur2). */
static void
test_murmur2_matches_java(void **state)
{
	static const struct {
		const char *key;
		int32_t murmur2;
	} cases[] = {
		{ "21", -973932308 },
		{ "foobar", -790332482 },
		{ "a-little-bit-long-string", -985981536 },
		{ "a-little-bit-longer-string", -1486304829 },
		{ "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971 },
		{ "abc", 479470107 },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal((int32_t)obx_murmur2(cases[i].key, strlen(cases[i].key)), cases[i].murmur2);
		for (int32_t parts = 1; parts <= 64; parts++)
			assert_int_equal(obx_dd_partition(cases[i].key, strlen(cases[i].key), parts),
			    (int32_t)(((uint32_t)cases[i].murmur2 & 0x7fffffff) % (uint32_t)parts));
	}
	/* a NULL key is placed at random; an empty one is hashed */
	assert_int_equal(obx_dd_partition(NULL, 0, 4), -1);
	assert_int_equal(obx_dd_partition("", 0, 7), (int32_t)((obx_murmur2("", 0) & 0x7fffffff) % 7));
	assert_int_equal(obx_dd_partition("a", 1, 0), -1);
}

static void
test_partitioner_supported(void **state)
{
	struct obx_config cfg;
	const char *name;
	char err[256];

	(void)state;
	obx_config_init(&cfg);
	assert_true(obx_dd_partitioner_supported(&cfg, &name));
	assert_string_equal(name, "murmur2_random");
	assert_int_equal(obx_config_set(&cfg, "kafka", "partitioner", "murmur2", "t", false, err, sizeof(err)), 0);
	assert_true(obx_dd_partitioner_supported(&cfg, &name));
	assert_int_equal(
	    obx_config_set(&cfg, "kafka", "partitioner", "consistent_random", "t", false, err, sizeof(err)), 0);
	assert_false(obx_dd_partitioner_supported(&cfg, &name));
	assert_string_equal(name, "consistent_random");
	obx_config_reset(&cfg);
}

/* ---- the read-back protocol ---- */

static void
test_window_protocol(void **state)
{
	struct obx_dd_mark floor = { 1000, 0, 0 };
	struct obx_dd_scan *s = obx_dd_scan_new("t", &floor);
	struct obx_dd_window w;
	const char *k = key_for(0, 1, 0);

	(void)state;
	assert_non_null(s);
	assert_false(obx_dd_scan_want(s, 0, &w)); /* no partitions known yet */
	assert_int_equal(obx_dd_scan_partitions(s, 1), 0);
	assert_false(obx_dd_scan_want(s, 0, &w)); /* nor its watermarks */
	obx_dd_scan_bounds(s, 0, 10, 100);
	/* first: the last records */
	assert_true(obx_dd_scan_want(s, 0, &w));
	assert_int_equal(w.from, 100 - OBX_DD_FIRST_WINDOW);
	assert_int_equal(w.to, 100);
	assert_false(obx_dd_scan_want(s, 0, &w)); /* given out already */
	for (int64_t off = w.from; off < w.to; off++)
		feed(s, 0, off, k, 1000 + (obx_lsn)off, 0, "x");
	obx_dd_scan_window_done(s, 0);
	/* nothing below the floor yet: the window below, larger, down to the first offset at most */
	assert_true(obx_dd_scan_want(s, 0, &w));
	assert_int_equal(w.to, 100 - OBX_DD_FIRST_WINDOW);
	assert_int_equal(w.from, 10);
	/* records outside the window are ignored (prefetched beyond its end) */
	feed(s, 0, 90, k, 1, 0, "old"); /* would end the read if it counted */
	feed(s, 0, 9, k, 1, 0, "old");
	assert_int_equal(s->parts[0].n, OBX_DD_FIRST_WINDOW);
	feed(s, 0, 10, k, 999, 3, "below"); /* below the floor: nothing older matters */
	feed(s, 0, 11, k, 1000 + 1, 0, "x");
	obx_dd_scan_window_done(s, 0);
	assert_false(obx_dd_scan_want(s, 0, &w));
	obx_dd_scan_finish(s, "late");
	assert_int_equal(s->parts[0].state, OBX_DD_CHECKING);
	assert_int_equal(s->parts[0].n, OBX_DD_FIRST_WINDOW + 1); /* the one below the floor is not kept */
	obx_dd_scan_free(s);

	/* a window that reaches the first offset ends the read; an empty partition has none */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 2), 0);
	obx_dd_scan_bounds(s, 0, 0, 1);
	obx_dd_scan_bounds(s, 1, 5, 5);
	assert_true(obx_dd_scan_want(s, 0, &w));
	assert_false(obx_dd_scan_want(s, 1, &w));
	feed(s, 0, 0, key_for(0, 2, 0), 1001, 0, "x");
	obx_dd_scan_window_done(s, 0);
	assert_false(obx_dd_scan_want(s, 0, &w));
	obx_dd_scan_finish(s, "late");
	assert_int_equal(s->parts[0].state, OBX_DD_CHECKING);
	assert_int_equal(s->parts[1].state, OBX_DD_CHECKING);
	obx_dd_scan_free(s);

	/* unfinished partitions fall back with the reason given */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 2), 0);
	obx_dd_scan_bounds(s, 0, 0, 100);
	assert_true(obx_dd_scan_want(s, 0, &w));
	obx_dd_scan_finish(s, "its read-back did not finish within 5000 ms");
	assert_int_equal(s->parts[0].state, OBX_DD_FALLBACK);
	assert_int_equal(s->parts[1].state, OBX_DD_FALLBACK);
	assert_string_equal(s->parts[0].reason, "its read-back did not finish within 5000 ms");
	obx_dd_scan_free(s);

	/* the metadata never came */
	s = obx_dd_scan_new("t", &floor);
	obx_dd_scan_finish(s, "late");
	assert_true(s->failed);
	obx_dd_scan_free(s);
	obx_dd_scan_free(NULL);
}

/* Windows grow, more slowly for large records. */
static void
test_window_growth(void **state)
{
	struct obx_dd_mark floor = { 1u << 30, 0, 0 };
	struct obx_dd_window w;
	uint64_t sizes[2][6];

	(void)state;
	for (int big = 0; big < 2; big++) {
		struct obx_dd_scan *s = obx_dd_scan_new("t", &floor);
		const char *k = key_for(0, 1, 0);

		assert_int_equal(obx_dd_scan_partitions(s, 1), 0);
		obx_dd_scan_bounds(s, 0, 0, 1 << 22);
		for (int round = 0; round < 6; round++) {
			assert_true(obx_dd_scan_want(s, 0, &w));
			sizes[big][round] = (uint64_t)(w.to - w.from);
			for (int64_t off = w.from; off < w.to; off++) {
				struct rec r;
				const struct obx_header *h = hdrs(&r, floor.lsn + (obx_lsn)off, 0, "x");

				obx_dd_scan_record(s, 0, off, k, strlen(k), big ? 1 << 20 : 100, h, r.nh);
			}
			obx_dd_scan_window_done(s, 0);
		}
		obx_dd_scan_free(s);
	}
	assert_int_equal(sizes[0][0], OBX_DD_FIRST_WINDOW);
	assert_int_equal(sizes[1][0], OBX_DD_FIRST_WINDOW);
	for (int round = 1; round < 6; round++) {
		/* small records: eight times as many each round, until a window holds about 4 MiB */
		if (round <= 3)
			assert_true(sizes[0][round] == sizes[0][round - 1] * 8);
		assert_true(sizes[0][round] >= sizes[0][round - 1] * 2 &&
		    sizes[0][round] <= sizes[0][round - 1] * 8);
		/* 1 MiB records: twice as many each round */
		assert_true(sizes[1][round] == sizes[1][round - 1] * 2);
	}
}

/* Opens partition p of s holding n records (offsets 0..n-1) and gives out its first window. */
static void
open_part(struct obx_dd_scan *s, int32_t p, int64_t n)
{
	struct obx_dd_window w;

	obx_dd_scan_bounds(s, p, 0, n);
	if (n > 0) {
		assert_true(n <= OBX_DD_FIRST_WINDOW);
		assert_true(obx_dd_scan_want(s, p, &w));
		assert_int_equal(w.from, 0);
	}
}

/* What makes a partition or the topic fall back, and what is history. */
static void
test_fallbacks_in_scan(void **state)
{
	struct obx_dd_mark floor = { 1000, 0, 0 };
	struct obx_dd_scan *s;
	struct obx_dd_window w;
	struct obx_header none[1] = { { "trace", "x", 1 } };

	(void)state;
	/* a record without outboxd's headers after the last one below the floor: that partition */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 4), 0);
	for (int32_t p = 0; p < 4; p++)
		open_part(s, p, p == 1 || p == 2 ? 3 : 0);
	feed(s, 1, 0, key_for(1, 4, 0), 999, 0, "a");
	feed(s, 1, 1, key_for(1, 4, 0), 1000, 0, "b");
	obx_dd_scan_record(s, 1, 2, "z", 1, 3, none, 1);
	/* the same but before the last record below the floor: history */
	obx_dd_scan_record(s, 2, 0, "z", 1, 3, none, 1);
	feed(s, 2, 1, key_for(2, 4, 0), 999, 0, "a");
	feed(s, 2, 2, key_for(2, 4, 0), 1001, 0, "c");
	for (int32_t p = 0; p < 4; p++)
		obx_dd_scan_window_done(s, p);
	assert_int_equal(s->parts[1].state, OBX_DD_FALLBACK);
	assert_non_null(strstr(s->parts[1].reason,
	    "the record at offset 2 has no lsn and seq headers of outboxd"));
	assert_int_equal(s->parts[1].n, 0);
	assert_int_equal(s->parts[2].state, OBX_DD_CHECKING);
	assert_int_equal(s->parts[2].n, 1);
	assert_false(s->failed);
	obx_dd_scan_free(s);

	/* a key that maps elsewhere today: the partition count changed, the whole topic falls back */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 8), 0);
	open_part(s, 3, 2);
	feed(s, 3, 0, key_for(3, 8, 0), 1000, 0, "a");
	feed(s, 3, 1, key_for(5, 8, 0), 1000, 1, "b");
	obx_dd_scan_window_done(s, 3);
	assert_true(s->failed);
	assert_non_null(strstr(s->reason,
	    "the record at offset 1 of partition 3 has a key that maps to "
	    "partition 5 of today's 8: the partition count changed"));
	obx_dd_scan_free(s);

	/* ... unless it lies before the last record below the floor (an old change) */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 8), 0);
	open_part(s, 3, 3);
	feed(s, 3, 0, key_for(5, 8, 0), 900, 0, "a");
	feed(s, 3, 1, key_for(3, 8, 0), 999, 0, "b");
	feed(s, 3, 2, key_for(3, 8, 0), 1000, 0, "c");
	obx_dd_scan_window_done(s, 3);
	assert_false(s->failed);
	assert_int_equal(s->parts[3].n, 1);
	obx_dd_scan_free(s);

	/* a NULL key (placed at random) is no evidence of anything, and never kept */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 2), 0);
	open_part(s, 0, 1);
	feed(s, 0, 0, NULL, 1000, 0, "a");
	obx_dd_scan_window_done(s, 0);
	assert_false(s->failed);
	assert_int_equal(s->parts[0].n, 0);
	obx_dd_scan_free(s);

	/* too many records to hold: that partition falls back, its marks are freed */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 1), 0);
	obx_dd_scan_bounds(s, 0, 0, 4 * OBX_DD_MAX_MARKS);
	while (obx_dd_scan_want(s, 0, &w)) {
		for (int64_t off = w.from; off < w.to; off++)
			feed(s, 0, off, key_for(0, 1, 0), 1000 + (obx_lsn)off, 0, "x");
		obx_dd_scan_window_done(s, 0);
	}
	assert_int_equal(s->parts[0].state, OBX_DD_FALLBACK);
	assert_int_equal(s->nmarks, 0);
	assert_non_null(strstr(s->parts[0].reason, "more than 131072 records"));
	obx_dd_scan_free(s);

	/* a failure names the first reason */
	s = obx_dd_scan_new("t", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 1), 0);
	obx_dd_scan_fail(s, 0, "first %d", 1);
	obx_dd_scan_fail(s, 0, "second");
	assert_string_equal(s->parts[0].reason, "first 1");
	obx_dd_scan_fail(s, -1, "topic");
	obx_dd_scan_fail(s, -1, "again");
	assert_string_equal(s->reason, "topic");
	obx_dd_scan_free(s);
}

/* ---- verdicts ---- */

/* A finished scan of topic with nparts partitions holding the given records (p, lsn, seq, id, key). */
struct rb {
	int32_t p;
	obx_lsn lsn;
	uint32_t seq;
	const char *id;
	const char *key;
};

static struct obx_dd_scan *
scan_of(const char *topic, const struct obx_dd_mark *floor, int32_t nparts, const struct rb *rbs, size_t n)
{
	struct obx_dd_scan *s = obx_dd_scan_new(topic, floor);
	int64_t count[16] = { 0 }, off[16] = { 0 };

	assert_int_equal(obx_dd_scan_partitions(s, nparts), 0);
	for (size_t i = 0; i < n; i++)
		count[rbs[i].p]++;
	for (int32_t p = 0; p < nparts; p++)
		open_part(s, p, count[p]);
	for (size_t i = 0; i < n; i++)
		feed(s, rbs[i].p, off[rbs[i].p]++, rbs[i].key, rbs[i].lsn, rbs[i].seq, rbs[i].id);
	for (int32_t p = 0; p < nparts; p++)
		obx_dd_scan_window_done(s, p);
	obx_dd_scan_finish(s, "unfinished");
	return s;
}

static enum obx_dd_verdict
check(struct obx_dedupe *d, const char *topic, const char *key, obx_lsn lsn, uint32_t seq, const char *id,
    struct obx_dd_mark *floor)
{
	struct rec r;
	const struct obx_header *h = hdrs(&r, lsn, seq, id);

	return obx_dedupe_check(d, topic, key, key ? strlen(key) : 0, h, r.nh, floor);
}

static void
test_verdicts(void **state)
{
	struct obx_dedupe d;
	struct obx_dd_mark floor;
	const char *a0 = key_for(0, 2, 0), *a1 = key_for(0, 2, 1), *b0 = key_for(1, 2, 0);
	struct rb rbs[] = {
		/* partition 0: the session's events at 100/0..100/2 and 101/0 are there */
		{ 0, 100, 0, "e0", NULL },
		{ 0, 100, 1, "e1", NULL },
		{ 0, 100, 2, "e2", NULL },
		{ 0, 101, 0, "e3", NULL },
		/* partition 1: 100/3 is there, 100/4 is not, 102/0 is (a gap: e.g. a rejected event) */
		{ 1, 100, 3, "e4", NULL },
		{ 1, 102, 0, "e6", NULL },
	};

	(void)state;
	for (size_t i = 0; i < 4; i++)
		rbs[i].key = i % 2 ? a1 : a0;
	rbs[4].key = rbs[5].key = b0;
	notes[0] = '\0';
	obx_dedupe_init(&d, true, on_note, NULL);
	/* no key, no mark: sent, and no read-back asked for */
	assert_int_equal(check(&d, "t", NULL, 100, 0, "e0", &floor), OBX_DD_SEND);
	{
		struct obx_header plain = { "trace", "1", 1 };

		assert_int_equal(obx_dedupe_check(&d, "t", "k", 1, &plain, 1, &floor), OBX_DD_SEND);
	}
	assert_false(obx_dedupe_waiting(&d));
	/* the first keyed record asks for the read-back with its mark as the floor */
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_LOOKUP);
	assert_true(floor.lsn == 100 && floor.seq == 0);
	assert_true(obx_dedupe_waiting(&d));
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_WAIT);
	assert_int_equal(check(&d, "t", NULL, 100, 0, "e0", &floor), OBX_DD_SEND);
	/* a scan for a topic nobody waits for is freed unused */
	obx_dedupe_install(&d, scan_of("other", &floor, 2, NULL, 0));
	obx_dedupe_install(&d, scan_of("t", &floor, 2, rbs, sizeof(rbs) / sizeof(rbs[0])));
	assert_false(obx_dedupe_waiting(&d));
	/* a second scan for the same topic too */
	obx_dedupe_install(&d, scan_of("t", &floor, 2, NULL, 0));
	assert_non_null(strstr(notes,
	    "de-duplication: topic t read back: 2 partition(s), 2 of them to "
	    "check against 6 record(s)"));

	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", a1, 100, 1, "e1", &floor), OBX_DD_SKIP);
	/* the same mark with another id is not that record */
	assert_int_equal(check(&d, "t", a0, 100, 2, "not-e2", &floor), OBX_DD_SEND);
	/* partition 0 is caught up: even a record that is there is sent (order) */
	assert_int_equal(check(&d, "t", a1, 101, 0, "e3", &floor), OBX_DD_SEND);
	assert_non_null(strstr(notes,
	    "de-duplication: t [0] caught up after 2 event(s) found in Kafka: "
	    "publishing from lsn 0/64 seq 2"));
	/* partition 1: found, then the gap ends the checking there */
	assert_int_equal(check(&d, "t", b0, 100, 3, "e4", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", b0, 100, 4, "e5", &floor), OBX_DD_SEND);
	assert_int_equal(check(&d, "t", b0, 102, 0, "e6", &floor), OBX_DD_SEND);
	assert_int_equal(d.skipped, 3);
	assert_non_null(strstr(notes,
	    "de-duplication: 3 event(s) of topic t were in Kafka already and "
	    "were not sent again"));
	obx_dedupe_reset(&d);

	/* the last record read back found: caught up there, without waiting for a new one */
	notes[0] = '\0';
	obx_dedupe_init(&d, true, on_note, NULL);
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_LOOKUP);
	obx_dedupe_install(&d, scan_of("t", &floor, 2, rbs, 4));
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", a1, 100, 1, "e1", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", a0, 100, 2, "e2", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", a1, 101, 0, "e3", &floor), OBX_DD_SKIP);
	assert_non_null(strstr(notes,
	    "caught up after 4 event(s) found in Kafka: publishing after lsn "
	    "0/65 seq 0"));
	assert_non_null(strstr(notes, "4 event(s) of topic t were in Kafka already"));
	assert_int_equal(check(&d, "t", a1, 101, 0, "e3", &floor), OBX_DD_SEND);
	/* partition 1 had nothing of this session: new from the start */
	assert_int_equal(check(&d, "t", b0, 100, 3, "e4", &floor), OBX_DD_SEND);
	obx_dedupe_reset(&d);

	/* off: everything is sent */
	obx_dedupe_init(&d, false, on_note, NULL);
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_SEND);
	obx_dedupe_reset(&d);
}

/*
 * A run that re-sent older events (a session that fell back to publishing)
 * and crashed leaves them after newer copies.  Skipping the newer ones
 * because they are there would make the next record of their key jump
 * over them: a record is skipped only at or below the partition's last
 * record, found or not.
 */
static void
test_order_after_a_resent_run(void **state)
{
	struct obx_dedupe d;
	struct obx_dd_mark floor;
	const char *k = key_for(0, 1, 0);
	struct rb rbs[] = {
		{ 0, 100, 0, "v1", NULL }, { 0, 101, 0, "v2", NULL }, { 0, 102, 0, "v3", NULL },
		{ 0, 100, 0, "v1", NULL }, /* re-sent, then the sender died */
	};

	(void)state;
	for (size_t i = 0; i < 4; i++)
		rbs[i].key = k;
	obx_dedupe_init(&d, true, on_note, NULL);
	assert_int_equal(check(&d, "t", k, 100, 0, "v1", &floor), OBX_DD_LOOKUP);
	obx_dedupe_install(&d, scan_of("t", &floor, 1, rbs, 4));
	assert_int_equal(check(&d, "t", k, 100, 0, "v1", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", k, 101, 0, "v2", &floor), OBX_DD_SEND); /* there, but before v1 */
	assert_int_equal(check(&d, "t", k, 102, 0, "v3", &floor), OBX_DD_SEND);
	obx_dedupe_reset(&d);

	/* the last record below the floor: nothing of this session can be there */
	obx_dedupe_init(&d, true, on_note, NULL);
	rbs[3] = (struct rb){ 0, 99, 0, "v0", k };
	assert_int_equal(check(&d, "t", k, 100, 0, "v1", &floor), OBX_DD_LOOKUP);
	obx_dedupe_install(&d, scan_of("t", &floor, 1, rbs, 4));
	assert_int_equal(check(&d, "t", k, 100, 0, "v1", &floor), OBX_DD_SEND);
	obx_dedupe_reset(&d);
}

static void
test_topic_fallbacks(void **state)
{
	struct obx_dedupe d;
	struct obx_dd_mark floor;
	struct obx_dd_scan *s;
	const char *a0 = key_for(0, 2, 0), *b0 = key_for(1, 2, 0);
	struct rb rbs[] = { { 0, 100, 0, "e0", NULL }, { 1, 100, 1, "e1", NULL } };

	(void)state;
	rbs[0].key = a0;
	rbs[1].key = b0;
	notes[0] = '\0';
	obx_dedupe_init(&d, true, on_note, NULL);
	/* a partition that fell back is published; the other is checked */
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_LOOKUP);
	s = scan_of("t", &floor, 2, rbs, 2);
	obx_dd_scan_fail(s, 1, "the record at offset 7 has no lsn and seq headers of outboxd (another writer)");
	obx_dedupe_install(&d, s);
	assert_int_equal(d.fallbacks, 1);
	assert_non_null(strstr(notes,
	    "de-duplication: topic t partition 1: the record at offset 7 has no lsn "
	    "and seq headers of outboxd (another writer); publishing its events from the slot's position "
	    "(at-least-once)"));
	assert_int_equal(check(&d, "t", a0, 100, 0, "e0", &floor), OBX_DD_SKIP);
	assert_int_equal(check(&d, "t", b0, 100, 1, "e1", &floor), OBX_DD_SEND);

	/* a topic that failed as a whole: everything is published, one line */
	assert_int_equal(check(&d, "u", a0, 100, 0, "e0", &floor), OBX_DD_LOOKUP);
	s = scan_of("u", &floor, 2, rbs, 2);
	obx_dd_scan_fail(s, -1, "could not read its metadata: Local: Timed out");
	obx_dedupe_install(&d, s);
	assert_int_equal(d.fallbacks, 2);
	assert_non_null(strstr(notes,
	    "de-duplication: topic u: could not read its metadata: Local: Timed "
	    "out; publishing its events from the slot's position (at-least-once)"));
	assert_int_equal(check(&d, "u", a0, 100, 0, "e0", &floor), OBX_DD_SEND);

	/* a topic that does not exist: nothing to find, no fallback */
	assert_int_equal(check(&d, "v", a0, 100, 0, "e0", &floor), OBX_DD_LOOKUP);
	s = obx_dd_scan_new("v", &floor);
	assert_int_equal(obx_dd_scan_partitions(s, 0), 0);
	obx_dd_scan_finish(s, "late");
	obx_dedupe_install(&d, s);
	assert_int_equal(d.fallbacks, 2);
	assert_int_equal(check(&d, "v", a0, 100, 0, "e0", &floor), OBX_DD_SEND);

	/* a read-back that could not start */
	assert_int_equal(check(&d, "w", a0, 100, 0, "e0", &floor), OBX_DD_LOOKUP);
	obx_dedupe_unavailable(&d, "w", "could not start reading it back");
	assert_int_equal(d.fallbacks, 3);
	assert_non_null(strstr(notes, "de-duplication: topic w: could not start reading it back"));
	assert_int_equal(check(&d, "w", a0, 100, 0, "e0", &floor), OBX_DD_SEND);
	assert_false(obx_dedupe_waiting(&d));
	obx_dedupe_reset(&d);
	obx_dedupe_reset(&d); /* a second reset is harmless */
}

/* A source as a session on system 7, database db, timeline 3 would name it. */
static struct obx_progress_source
source(void)
{
	struct obx_progress_source src = { .system_id = "7",
		.database = "db",
		.timeline = 3,
		.slot_created = 0x1000 };

	obx_progress_events(&src, "public", "outbox", false, "outboxd");
	return src;
}

/* The progress record of exactly-once mode: written, read back, and what is refused. */
static void
test_progress_record(void **state)
{
	struct obx_progress p = { .mark = { 0x16B3A28, 7, 0 },
		.mark_commit_time = 12000000,
		.has_source = true,
		.src = source(),
		.end_lsn = 0x16B3B00,
		.commit_time = 12345678,
		.records = 42 },
	                    q;
	char errbuf[128];
	char *v;

	(void)state;
	v = obx_progress_encode(&p, "s1", "outboxd-1-db-s1");
	assert_non_null(v);
	assert_non_null(strstr(v, "\"lsn\":\"0/16B3A28\""));
	assert_non_null(strstr(v, "\"timeline\":3"));
	assert_non_null(strstr(v, "\"system_id\":\"7\""));
	assert_non_null(strstr(v, "\"slot_created\":\"0/1000\""));
	assert_non_null(strstr(v, "\"events\":\"public.outbox\""));
	assert_non_null(strstr(v, "\"commit_time\":\"2000-01-01T00:00:12.345678Z\""));
	assert_int_equal(obx_progress_parse(v, strlen(v), "s1", &q, errbuf, sizeof(errbuf)), 0);
	assert_int_equal(q.mark.lsn, 0x16B3A28);
	assert_int_equal(q.mark.seq, 7);
	assert_int_equal(q.mark_commit_time, 12000000);
	assert_true(q.has_source);
	assert_int_equal(q.src.timeline, 3);
	assert_string_equal(q.src.system_id, "7");
	assert_string_equal(q.src.database, "db");
	assert_int_equal(q.src.slot_created, 0x1000);
	assert_string_equal(q.src.events, "public.outbox");
	assert_int_equal(q.end_lsn, 0x16B3B00);
	assert_int_equal(q.records, 42);
	assert_int_equal(obx_progress_parse(v, strlen(v), "s2", &q, errbuf, sizeof(errbuf)), OBX_ENOENT);
	free(v);
	assert_int_equal(obx_progress_parse("nope", 4, "s1", &q, errbuf, sizeof(errbuf)), OBX_EINVAL);
	assert_int_equal(obx_progress_parse("{\"slot\":\"s1\",\"lsn\":\"x\",\"seq\":1}", 31, "s1", &q, errbuf,
	                     sizeof(errbuf)),
	    OBX_EINVAL);
	assert_int_equal(obx_progress_parse("{\"slot\":\"s1\",\"seq\":1}", 21, "s1", &q, errbuf, sizeof(errbuf)),
	    OBX_EINVAL);
	/* an earlier version's record: no timeline, no source */
	assert_int_equal(obx_progress_parse("{\"slot\":\"s1\",\"lsn\":\"0/10\",\"seq\":1}", 34, "s1", &q, errbuf,
	                     sizeof(errbuf)),
	    0);
	assert_int_equal(q.src.timeline, 0);
	assert_false(q.has_source);
	assert_int_equal(q.mark.lsn, 0x10);
}

/* What a fenced producer means, and where the progress record goes (exactly-once's verdicts). */
static void
test_progress_fence_and_partition(void **state)
{
	char errbuf[512];

	(void)state;
	/* the connection still ours: nobody took over, a transaction was aborted; a new session */
	assert_int_equal(obx_progress_fenced(true, "t1", "s1", errbuf, sizeof(errbuf)), OBX_PROGRESS_NEW_SESSION);
	assert_non_null(strstr(errbuf, "while this instance still holds slot s1"));
	/* the connection gone: another instance took the slot, then the id */
	assert_int_equal(obx_progress_fenced(false, "t1", "s1", errbuf, sizeof(errbuf)), OBX_PROGRESS_STOP);
	assert_non_null(strstr(errbuf, "fenced: another instance took over transactional.id t1"));
	/* a fence that looked like an abort, then the slot in use: a takeover after all */
	errbuf[0] = '\0';
	assert_false(obx_progress_taken_over(false, true, "t1", "s1", errbuf, sizeof(errbuf)));
	assert_false(obx_progress_taken_over(true, false, "t1", "s1", errbuf, sizeof(errbuf)));
	assert_string_equal(errbuf, "");
	assert_true(obx_progress_taken_over(true, true, "t1", "s1", errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "slot s1 is in use by another instance"));
	/* the key's own partition, as librdkafka's murmur2 puts it; the partitioner's while unknown */
	assert_int_equal(obx_progress_partition("outboxd-1-db-s1", 6), obx_dd_partition("outboxd-1-db-s1", 15, 6));
	assert_int_equal(obx_progress_partition("outboxd-1-db-s1", 0), -1);
}

/* A record is trusted only for its own history, and never beyond the server's WAL. */
static void
test_progress_trusted(void **state)
{
	struct obx_progress rec = { .mark = { 0x5000, 2, 0 },
		.mark_commit_time = 99,
		.has_source = true,
		.src = source(),
		.end_lsn = 0x4F00 };
	struct obx_progress_source now = source(), other;
	struct obx_progress r2;
	char errbuf[256];

	(void)state;
	assert_true(obx_progress_trusted(&rec, &now, 0x6000, errbuf, sizeof(errbuf)));
	assert_true(obx_progress_trusted(&rec, &now, 0x5000, errbuf, sizeof(errbuf)));
	/* the server went back (a restore from a copy): its WAL ends before the mark */
	assert_false(obx_progress_trusted(&rec, &now, 0x4FFF, errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "beyond the server's WAL position 0/4FFF"));
	r2 = rec;
	r2.has_source = false;
	assert_false(obx_progress_trusted(&r2, &now, 0x6000, errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "earlier version"));
	r2 = rec;
	r2.mark_commit_time = 0;
	assert_false(obx_progress_trusted(&r2, &now, 0x6000, errbuf, sizeof(errbuf)));
	other = now;
	strcpy(other.system_id, "8");
	assert_false(obx_progress_trusted(&rec, &other, 0x6000, errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "system 7, the server is system 8"));
	other = now;
	strcpy(other.database, "db2"); /* two databases sharing a transactional.id */
	assert_false(obx_progress_trusted(&rec, &other, 0x6000, errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "database db"));
	other = now;
	other.timeline = 4;
	assert_false(obx_progress_trusted(&rec, &other, 0x6000, errbuf, sizeof(errbuf)));
	other = now;
	other.slot_created = 0x5800; /* the slot was dropped and created again after the record */
	assert_false(obx_progress_trusted(&rec, &other, 0x6000, errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "dropped and created again"));
	other = now;
	obx_progress_events(&other, "public", "outbox", true, "outboxd"); /* [source] messages toggled */
	assert_string_equal(other.events, "public.outbox+messages:outboxd");
	assert_false(obx_progress_trusted(&rec, &other, 0x6000, errbuf, sizeof(errbuf)));
	assert_non_null(strstr(errbuf, "numbers the events of public.outbox,"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_marks),
		cmocka_unit_test(test_progress_trusted),
		cmocka_unit_test(test_progress_fence_and_partition),
		cmocka_unit_test(test_murmur2_matches_java),
		cmocka_unit_test(test_partitioner_supported),
		cmocka_unit_test(test_window_protocol),
		cmocka_unit_test(test_window_growth),
		cmocka_unit_test(test_fallbacks_in_scan),
		cmocka_unit_test(test_verdicts),
		cmocka_unit_test(test_order_after_a_resent_run),
		cmocka_unit_test(test_topic_fallbacks),
		cmocka_unit_test(test_progress_record),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
