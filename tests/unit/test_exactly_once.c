/*
 * Exactly-once's decisions on their own (relaycore.h, core/eos_progress.h): the
 * session's history, the progress record of a batch, where the replay
 * starts skipping, what init_transactions and a commit's result mean, a
 * fenced producer's verdict, and the status interval of a session.
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
#include "obx/core/eos_progress.h"
#include "obx/core/relaycore.h"

static struct obx_config cfg;

static int
setup(void **state)
{
	(void)state;
	obx_config_init(&cfg);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	obx_config_reset(&cfg);
	return 0;
}

/* The session's history from the stream's identity and the configuration. */
static void
test_source_init(void **state)
{
	struct obx_progress_source src, want = { .timeline = 3, .slot_created = 0x1000 };

	(void)state;
	obx_progress_source_init(&src, "7301", "shop", 3, 0x1000, &cfg);
	assert_string_equal(src.system_id, "7301");
	assert_string_equal(src.database, "shop");
	assert_int_equal(src.timeline, 3);
	assert_int_equal(src.slot_created, 0x1000);
	obx_progress_events(&want, cfg.table_schema, cfg.table_name, cfg.messages, cfg.message_prefix);
	assert_string_equal(src.events, want.events);
	assert_string_equal(src.events, "public.outbox");
	cfg.messages = true;
	obx_progress_source_init(&src, "7301", "shop", 3, 0x1000, &cfg);
	assert_non_null(strstr(src.events, "+messages:"));
	cfg.messages = false;
}

/* A batch's record names the batch and the history, and reads back as written. */
static void
test_record_from_batch(void **state)
{
	struct obx_core_progress p = { .mark = { 0x16B3A28, 7, 0 },
		.mark_commit_time = 12000000,
		.end_lsn = 0x16B3B00,
		.commit_time = 13000000,
		.records = 42 };
	struct obx_progress_source src;
	struct obx_progress pr, back;
	char errbuf[256], *v;

	(void)state;
	obx_progress_source_init(&src, "7301", "shop", 3, 0x1000, &cfg);
	obx_core_progress_record(&p, &src, &pr);
	assert_true(pr.has_source);
	assert_int_equal(pr.mark.lsn, 0x16B3A28);
	assert_int_equal(pr.mark.seq, 7);
	assert_int_equal(pr.mark_commit_time, 12000000);
	assert_int_equal(pr.end_lsn, 0x16B3B00);
	assert_int_equal(pr.commit_time, 13000000);
	assert_int_equal(pr.records, 42);
	assert_memory_equal(&pr.src, &src, sizeof(src));
	v = obx_progress_encode(&pr, "s1", "t1");
	assert_non_null(v);
	assert_int_equal(obx_progress_parse(v, strlen(v), "s1", &back, errbuf, sizeof(errbuf)), 0);
	free(v);
	assert_true(back.has_source);
	/* what it writes is what the next session trusts */
	assert_true(obx_progress_trusted(&back, &src, 0x16B3B00, errbuf, sizeof(errbuf)));
}

/* A new slot skips nothing; an unreadable record never guesses; none; untrusted; trusted. */
static void
test_floor(void **state)
{
	struct obx_progress_source now;
	struct obx_progress rec = { .mark = { 0x5000, 2, 0 }, .mark_commit_time = 99, .has_source = true };
	char line[2048];

	(void)state;
	obx_progress_source_init(&now, "7", "db", 1, 0x100, &cfg);
	rec.src = now;
	/* the slot was made: what was (not) read is not looked at */
	assert_int_equal(obx_progress_floor(&cfg, "t1", &now, 0x6000, true, -1, NULL, NULL, line, sizeof(line)),
	    OBX_PROGRESS_FLOOR_NEW_SLOT);
	assert_string_equal(line, "exactly-once: transactional.id t1; a new slot, nothing to skip");
	assert_int_equal(obx_progress_floor(&cfg, "t1", &now, 0x6000, false, OBX_EIO, "timed out", &rec, line,
	                     sizeof(line)),
	    OBX_PROGRESS_FLOOR_UNREADABLE);
	assert_non_null(strstr(line,
	    "could not read the progress of slot outboxd from outboxd.progress: timed out"));
	assert_int_equal(obx_progress_floor(&cfg, "t1", &now, 0x6000, false, 0, NULL, &rec, line, sizeof(line)),
	    OBX_PROGRESS_FLOOR_NONE);
	assert_non_null(strstr(line, "transactional.id t1; no progress record of it in outboxd.progress yet"));
	assert_int_equal(obx_progress_floor(&cfg, "t1", &now, 0x6000, false, 1, NULL, &rec, line, sizeof(line)),
	    OBX_PROGRESS_FLOOR_TRUSTED);
	assert_string_equal(line,
	    "exactly-once: transactional.id t1; the last committed Kafka transaction "
	    "ends at event lsn 0/5000 seq 2: replayed events up to it are not sent again once the replay "
	    "meets that transaction");
	/* the server went back below the mark: not this history */
	assert_int_equal(obx_progress_floor(&cfg, "t1", &now, 0x4000, false, 1, NULL, &rec, line, sizeof(line)),
	    OBX_PROGRESS_FLOOR_UNTRUSTED);
	assert_non_null(strstr(line, "the last progress record of transactional.id t1 marks lsn 0/5000"));
	assert_non_null(strstr(line, ": not skipping anything this session (events may be published again)"));
	now.timeline = 2;
	assert_int_equal(obx_progress_floor(&cfg, "t1", &now, 0x6000, false, 1, NULL, &rec, line, sizeof(line)),
	    OBX_PROGRESS_FLOOR_UNTRUSTED);
	assert_non_null(strstr(line, "timeline"));
}

/* init_transactions: go on, stop when fenced, else a new session; a time-out says so. */
static void
test_txn_init_end(void **state)
{
	char errbuf[256];

	(void)state;
	snprintf(errbuf, sizeof(errbuf), "kept");
	assert_int_equal(obx_core_txn_init_end(OBX_OK, "t1", 15000, errbuf, sizeof(errbuf)), OBX_CORE_RUNNING);
	assert_int_equal(obx_core_txn_init_end(OBX_EFENCED, "t1", 15000, errbuf, sizeof(errbuf)),
	    OBX_CORE_END_FATAL);
	assert_string_equal(errbuf, "kept");
	assert_int_equal(obx_core_txn_init_end(OBX_EABORT, "t1", 15000, errbuf, sizeof(errbuf)),
	    OBX_CORE_END_RETRY);
	assert_int_equal(obx_core_txn_init_end(OBX_EFATAL, "t1", 15000, errbuf, sizeof(errbuf)),
	    OBX_CORE_END_RETRY);
	assert_string_equal(errbuf, "kept");
	assert_int_equal(obx_core_txn_init_end(OBX_ETIMEDOUT, "t1", 15000, errbuf, sizeof(errbuf)),
	    OBX_CORE_END_RETRY);
	assert_string_equal(errbuf, "Kafka transactions for transactional.id t1 not initialised within 15 s");
}

/*
 * A fenced producer while the session runs or ends: the replication
 * connection gone means another instance took over (stop); still ours, the
 * broker aborted a transaction that outlived transaction.timeout.ms (a new
 * session).
 */
static void
test_fenced_end(void **state)
{
	char errbuf[768];

	(void)state;
	assert_int_equal(obx_core_fenced_end(false, "t1", "s1", errbuf, sizeof(errbuf)), OBX_CORE_END_FATAL);
	assert_non_null(strstr(errbuf, "fenced: another instance took over transactional.id t1"));
	assert_non_null(strstr(errbuf, "stopping without publishing anything more"));
	assert_int_equal(obx_core_fenced_end(true, "t1", "s1", errbuf, sizeof(errbuf)), OBX_CORE_END_RETRY);
	assert_non_null(strstr(errbuf, "while this instance still holds slot s1"));
	assert_non_null(strstr(errbuf, "starting a new session"));
}

/* A commit's result as obx_core_commit_done() takes it; only a fence looks at the connection. */
static void
test_commit_verdict(void **state)
{
	char errbuf[768];

	(void)state;
	snprintf(errbuf, sizeof(errbuf), "kept");
	assert_int_equal(obx_core_commit_verdict(OBX_OK, false, "t1", "s1", errbuf, sizeof(errbuf)),
	    OBX_CORE_COMMIT_OK);
	assert_int_equal(obx_core_commit_verdict(OBX_EABORT, true, "t1", "s1", errbuf, sizeof(errbuf)),
	    OBX_CORE_COMMIT_ABORT);
	assert_int_equal(obx_core_commit_verdict(OBX_EFATAL, false, "t1", "s1", errbuf, sizeof(errbuf)),
	    OBX_CORE_COMMIT_FATAL);
	assert_string_equal(errbuf, "kept"); /* the producer's words */
	/* the zombie: its connection is gone, so the run stops */
	assert_int_equal(obx_core_commit_verdict(OBX_EFENCED, false, "t1", "s1", errbuf, sizeof(errbuf)),
	    OBX_CORE_COMMIT_FENCED);
	assert_non_null(strstr(errbuf, "fenced: another instance took over transactional.id t1"));
	/* still holding the slot: a rewind and a new session */
	assert_int_equal(obx_core_commit_verdict(OBX_EFENCED, true, "t1", "s1", errbuf, sizeof(errbuf)),
	    OBX_CORE_COMMIT_FATAL);
	assert_non_null(strstr(errbuf, "starting a new session"));
}

/* A third of wal_sender_timeout when that is sooner than [source] status_interval. */
static void
test_status_interval(void **state)
{
	(void)state;
	assert_int_equal(obx_core_status_interval(10000, 60000), 10000);
	assert_int_equal(obx_core_status_interval(10000, 30000), 10000);
	assert_int_equal(obx_core_status_interval(10000, 29999), 9999);
	assert_int_equal(obx_core_status_interval(10000, 3000), 1000);
	assert_int_equal(obx_core_status_interval(10000, 0), 10000); /* no timeout */
	assert_int_equal(obx_core_status_interval(10000, -1), 10000);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_source_init),
		cmocka_unit_test(test_record_from_batch),
		cmocka_unit_test(test_floor),
		cmocka_unit_test(test_txn_init_end),
		cmocka_unit_test(test_fenced_end),
		cmocka_unit_test(test_commit_verdict),
		cmocka_unit_test(test_status_interval),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
