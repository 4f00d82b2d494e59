/*
 * Polling mode's pure half: its configuration keys, the backoff arithmetic
 * and the statements built from the column mapping.  What the statements do
 * on a server is tests/integration/t4000_poll.c's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/config.h"
#include "obx/core/err.h"
#include "obx/core/pollcore.h"
#include "obx/core/pollsql.h"

static char errbuf[512];

static int
set(struct obx_config *c, const char *section, const char *key, const char *value)
{
	errbuf[0] = '\0';
	return obx_config_set(c, section, key, value, "test", true, errbuf, sizeof(errbuf));
}

static void
test_defaults(void **state)
{
	struct obx_config c;

	(void)state;
	obx_config_init(&c);
	assert_int_equal(c.mode, OBX_SOURCE_LOGICAL);
	assert_string_equal(c.col_seq, "seq");
	assert_string_equal(c.col_published_at, "published_at");
	assert_string_equal(c.col_attempts, "attempts");
	assert_string_equal(c.col_last_error, "last_error");
	assert_string_equal(c.col_next_attempt_at, "next_attempt_at");
	assert_string_equal(c.col_created_at, "created_at");
	assert_int_equal(c.poll_batch, 10000);
	assert_int_equal(c.poll_interval_ms, 1000);
	assert_int_equal(c.poll_max_attempts, 10);
	assert_int_equal(c.poll_backoff_min_ms, 1000);
	assert_int_equal(c.poll_backoff_max_ms, 300000);
	assert_int_equal(c.poll_exhausted, OBX_POLL_EXHAUSTED_DEAD_LETTER);
	assert_string_equal(c.poll_notify_channel, "outboxd");
	obx_config_reset(&c);
}

static void
test_keys(void **state)
{
	struct obx_config c, d;
	const char *names[64];
	size_t n;

	(void)state;
	obx_config_init(&c);
	obx_config_init(&d);
	assert_int_equal(set(&c, "source", "mode", "poll"), 0);
	assert_int_equal(c.mode, OBX_SOURCE_POLL);
	assert_int_equal(set(&c, "outbox", "seq", "event_no"), 0);
	assert_int_equal(set(&c, "outbox", "published_at", "sent"), 0);
	assert_int_equal(set(&c, "outbox", "attempts", "tries"), 0);
	assert_int_equal(set(&c, "outbox", "last_error", "err"), 0);
	assert_int_equal(set(&c, "outbox", "next_attempt_at", "due"), 0);
	assert_int_equal(set(&c, "outbox", "created_at", ""), 0);
	assert_int_equal(set(&c, "poll", "batch", "250"), 0);
	assert_int_equal(set(&c, "poll", "poll_interval", "200ms"), 0);
	assert_int_equal(set(&c, "poll", "max_attempts", "3"), 0);
	assert_int_equal(set(&c, "poll", "backoff_min", "100ms"), 0);
	assert_int_equal(set(&c, "poll", "backoff_max", "2s"), 0);
	assert_int_equal(set(&c, "poll", "exhausted", "mark"), 0);
	assert_int_equal(set(&c, "poll", "notify_channel", ""), 0);
	assert_string_equal(c.col_seq, "event_no");
	assert_string_equal(c.col_published_at, "sent");
	assert_string_equal(c.col_created_at, "");
	assert_int_equal(c.poll_batch, 250);
	assert_int_equal(c.poll_interval_ms, 200);
	assert_int_equal(c.poll_max_attempts, 3);
	assert_int_equal(c.poll_backoff_min_ms, 100);
	assert_int_equal(c.poll_backoff_max_ms, 2000);
	assert_int_equal(c.poll_exhausted, OBX_POLL_EXHAUSTED_MARK);
	assert_string_equal(c.poll_notify_channel, "");
	/* SIGHUP names what differs */
	n = obx_config_diff(&d, &c, names, 64);
	assert_int_equal(n, 3);
	assert_string_equal(names[0], "[source] mode");
	assert_string_equal(names[1], "[outbox] polling columns");
	assert_string_equal(names[2], "[poll]");
	obx_config_reset(&c);
	obx_config_reset(&d);
}

static void
test_key_errors(void **state)
{
	static const struct {
		const char *section, *key, *value, *want;
	} bad[] = {
		{ "source", "mode", "polling", "expected logical or poll, got 'polling'" },
		{ "outbox", "seq", "", "must not be empty" },
		{ "outbox", "published_at", "", "must not be empty" },
		{ "poll", "batch", "0", "out of range (1 to 100000)" },
		{ "poll", "batch", "many", "expected an integer" },
		{ "poll", "max_attempts", "0", "out of range" },
		{ "poll", "poll_interval", "0ms", "out of range (1ms to 24h)" },
		{ "poll", "backoff_max", "soon", "expected a duration" },
		{ "poll", "exhausted", "stop", "expected dead_letter or mark" },
		{ "poll", "interval", "1s", "unknown key in [poll]" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct obx_config c;

		obx_config_init(&c);
		assert_int_equal(set(&c, bad[i].section, bad[i].key, bad[i].value), OBX_ECONFIG);
		if (strstr(errbuf, bad[i].want) == NULL)
			fail_msg("[%s] %s = %s: want \"%s\", got \"%s\"", bad[i].section, bad[i].key, bad[i].value,
			    bad[i].want, errbuf);
		obx_config_reset(&c);
	}
}

static void
test_finish(void **state)
{
	struct obx_config c;

	(void)state;
	obx_config_init(&c);
	assert_int_equal(set(&c, "kafka", "bootstrap.servers", "127.0.0.1:9092"), 0);
	assert_int_equal(set(&c, "poll", "backoff_min", "10s"), 0);
	assert_int_equal(set(&c, "poll", "backoff_max", "1s"), 0);
	/* only polling mode cares */
	assert_int_equal(obx_config_finish(&c, "f.ini", errbuf, sizeof(errbuf)), 0);
	assert_int_equal(set(&c, "source", "mode", "poll"), 0);
	assert_int_equal(obx_config_finish(&c, "f.ini", errbuf, sizeof(errbuf)), OBX_ECONFIG);
	assert_non_null(strstr(errbuf, "backoff_min (10000 ms) is above backoff_max (1000 ms)"));
	obx_config_reset(&c);
}

static void
test_backoff(void **state)
{
	(void)state;
	/* doubling from min, jitter in [d/2, d] */
	assert_int_equal(obx_poll_backoff_ms(1, 1000, 300000, 0), 500);
	assert_int_equal(obx_poll_backoff_ms(1, 1000, 300000, 500), 1000);
	assert_int_equal(obx_poll_backoff_ms(1, 1000, 300000, 501), 500);
	assert_int_equal(obx_poll_backoff_ms(2, 1000, 300000, 500), 1500);
	assert_int_equal(obx_poll_backoff_ms(3, 1000, 300000, 2000), 4000);
	/* capped at max, also for absurd counts */
	assert_int_equal(obx_poll_backoff_ms(20, 1000, 300000, 150000), 300000);
	assert_int_equal(obx_poll_backoff_ms(1000000, 1000, 300000, 0), 150000);
	for (uint32_t r = 0; r < 100000; r += 977) {
		int64_t d = obx_poll_backoff_ms(5, 100, 1000, r);

		assert_true(d >= 500 && d <= 1000);
	}
	/* never 0 */
	assert_int_equal(obx_poll_backoff_ms(1, 1, 1, 0), 1);
	assert_int_equal(obx_poll_backoff_ms(0, 0, 0, 7), 1);
}

static void
test_quote_ident(void **state)
{
	char buf[16] = "";

	(void)state;
	assert_int_equal(obx_poll_quote_ident("a\"b", buf, sizeof(buf)), 0);
	assert_string_equal(buf, "\"a\"\"b\"");
	buf[0] = '\0';
	assert_int_equal(obx_poll_quote_ident("Seq", buf, sizeof(buf)), 0);
	assert_string_equal(buf, "\"Seq\"");
	buf[0] = '\0';
	assert_int_equal(obx_poll_quote_ident("abcdefghijklmnop", buf, sizeof(buf)), OBX_ERANGE);
	buf[0] = '\0';
	assert_int_equal(obx_poll_quote_ident("abcdefghijklm", buf, sizeof(buf)), 0); /* 15 + NUL */
	assert_int_equal(strlen(buf), 15);
}

static void
test_statements(void **state)
{
	struct obx_config c;
	struct obx_poll_sql s;

	(void)state;
	obx_config_init(&c);
	assert_int_equal(obx_poll_sql_build(&s, &c), 0);
	/* locks due rows in order, skipping locked ones, at most batch */
	assert_non_null(strstr(s.claim,
	    "BEGIN; WITH c AS MATERIALIZED (SELECT o.\"seq\" AS obx_seq, "
	    "o.\"attempts\" AS obx_attempts, o.\"last_error\"::text AS obx_last_error, "
	    "(extract(epoch FROM o.\"created_at\") * 1000000)::bigint AS obx_created_us, "
	    "pg_column_size(o.\"payload\")::bigint AS obx_size, o.\"id\", "
	    "o.\"aggregateid\", o.\"type\", o.\"payload\", o.\"aggregatetype\" FROM \"public\".\"outbox\" o "
	    "WHERE o.\"published_at\" IS NULL AND o.\"next_attempt_at\" <= now() ORDER BY o.\"seq\" "
	    "LIMIT 10000 FOR UPDATE SKIP LOCKED)"));
	assert_int_equal(obx_poll_claim_rows(&c), 4000); /* sends at most max_inflight */
	/* keeps a row only when no older pending row of its key is outside the batch */
	assert_non_null(strstr(s.claim,
	    "k AS (SELECT *, sum(obx_size) OVER (ORDER BY obx_seq) AS obx_bytes "
	    "FROM c WHERE NOT EXISTS (SELECT 1 FROM \"public\".\"outbox\" p "
	    "WHERE p.\"aggregateid\" = c.\"aggregateid\" AND p.\"seq\" < c.obx_seq AND p.\"published_at\" IS NULL "
	    "AND NOT EXISTS (SELECT 1 FROM c c2 WHERE c2.obx_seq = p.\"seq\")))"));
	/* no more payload than max_inflight_bytes, but always the first row */
	assert_non_null(strstr(s.claim,
	    "SELECT * FROM k WHERE coalesce(obx_bytes - obx_size, 0) < 4194304 "
	    "ORDER BY obx_seq LIMIT 4000"));
	assert_string_equal(s.mark_head,
	    "UPDATE \"public\".\"outbox\" SET \"published_at\" = now() "
	    "WHERE \"published_at\" IS NULL AND \"seq\" = ANY ('{");
	assert_string_equal(s.mark_tail, "}'::bigint[])");
	assert_non_null(strstr(s.fail,
	    "SET \"attempts\" = o.\"attempts\" + 1, \"last_error\" = f.e, "
	    "\"next_attempt_at\" = now() + f.d * interval '1 millisecond'"));
	assert_non_null(strstr(s.give_up, "SET \"published_at\" = now(), \"last_error\" = f.e"));
	assert_non_null(strstr(s.stats, "min(\"created_at\")"));
	assert_non_null(strstr(s.check, "LIMIT 0"));
	obx_poll_sql_reset(&s);
	obx_poll_sql_reset(&s); /* a zeroed one is a no-op */

	/* other names, quoted as the server reads them; no created_at column */
	assert_int_equal(set(&c, "source", "table", "\"Sales\".\"Out\"\"box\""), 0);
	assert_int_equal(set(&c, "outbox", "seq", "No"), 0);
	assert_int_equal(set(&c, "outbox", "created_at", ""), 0);
	assert_int_equal(set(&c, "poll", "batch", "7"), 0);
	assert_int_equal(obx_poll_sql_build(&s, &c), 0);
	assert_non_null(strstr(s.claim, "FROM \"Sales\".\"Out\"\"box\" o"));
	assert_non_null(strstr(s.claim, "ORDER BY o.\"No\" LIMIT 7 FOR UPDATE SKIP LOCKED"));
	assert_int_equal(obx_poll_claim_rows(&c), 7);
	assert_int_equal(set(&c, "delivery", "max_inflight", "5"), 0);
	assert_int_equal(obx_poll_claim_rows(&c), 5); /* the in-flight bound cuts the batch */
	assert_non_null(strstr(s.claim, "NULL::bigint AS obx_created_us"));
	assert_non_null(strstr(s.stats, "SELECT count(*), 0::float8,"));
	obx_poll_sql_reset(&s);
	obx_config_reset(&c);
}

/* Each claimed row's fate, and the hold-back of the later rows of a key that failed. */
static void
test_row_action_and_holds(void **state)
{
	struct obx_config c;
	struct obx_poll_holds h = { 0 };
	const char *res_keys = "k1k2k10";

	(void)state;
	obx_config_init(&c);
	assert_int_equal(set(&c, "poll", "max_attempts", "3"), 0);
	assert_int_equal(obx_poll_row_action(&c, 0, false, true), OBX_POLL_SEND);
	assert_int_equal(obx_poll_row_action(&c, 2, false, false), OBX_POLL_FAIL);
	assert_int_equal(obx_poll_row_action(&c, 0, true, true), OBX_POLL_HOLD); /* held wins */
	assert_int_equal(obx_poll_row_action(&c, 3, true, true), OBX_POLL_HOLD);
	assert_int_equal(obx_poll_row_action(&c, 3, false, true), OBX_POLL_DEAD_LETTER);
	assert_int_equal(obx_poll_row_action(&c, 4, false, false), OBX_POLL_DEAD_LETTER);
	assert_int_equal(set(&c, "poll", "exhausted", "mark"), 0);
	assert_int_equal(obx_poll_row_action(&c, 3, false, true), OBX_POLL_GIVE_UP);

	/* keys compared as bytes (borrowed views of the batch), NULL holds nothing */
	assert_false(obx_poll_held(&h, res_keys, 2));
	assert_int_equal(obx_poll_hold_add(&h, res_keys, 2), 0); /* k1 */
	assert_int_equal(obx_poll_hold_add(&h, NULL, 0), 0);
	assert_true(obx_poll_held(&h, "k1", 2));
	assert_false(obx_poll_held(&h, res_keys + 2, 2)); /* k2 */
	assert_false(obx_poll_held(&h, res_keys + 4, 3)); /* k10 is not k1 */
	assert_false(obx_poll_held(&h, NULL, 0));
	for (int i = 0; i < 40; i++)
		assert_int_equal(obx_poll_hold_add(&h, res_keys + 2, 2), 0); /* grows */
	assert_true(obx_poll_held(&h, "k2", 2));
	obx_poll_holds_reset(&h);
	assert_false(obx_poll_held(&h, "k1", 2));
	obx_poll_holds_reset(&h); /* a zeroed one is a no-op */
	obx_config_reset(&c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_row_action_and_holds),
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_keys),
		cmocka_unit_test(test_key_errors),
		cmocka_unit_test(test_finish),
		cmocka_unit_test(test_backoff),
		cmocka_unit_test(test_quote_ident),
		cmocka_unit_test(test_statements),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
