/*
 * The chaos suite: an application workload (concurrent transactions on many
 * aggregates, some rolled back, some deleting their outbox row in the same
 * transaction) while faults are injected at random: kill -9 of outboxd,
 * brokers down, retriable Produce errors, broker RTT, walsender
 * termination, PostgreSQL restarted with -m immediate.  After each phase it
 * drains, reads everything back, and checks against what the database says
 * committed (a side table written in each transaction):
 *   1 no committed event missing; 2 nothing from a rolled-back transaction;
 *   3 per-key order (versions only ever continue by one or restart lower,
 *     a re-sent suffix); 6 duplicates only when a crash-kind fault happened.
 *
 * Two phases.  The first injects only faults whose re-sent events restart
 * de-duplication removes ([delivery] dedupe, on by default: kill -9,
 * walsender terminated, PostgreSQL restarted with -m immediate, broker RTT,
 * retriable Produce errors answered before the test broker appends
 * anything): after it, every committed event must be there exactly once,
 * in per-key order without restarts.  The second adds all brokers down.
 * The test broker (librdkafka's mock cluster) validates idempotent
 * sequence numbers only for transactional producers: a Produce request it
 * appended but whose answer was lost when it went down is appended again
 * when the producer retries it, inside one session, with nothing for a
 * restart to look up; and a read-back that meets the outage falls back to
 * publishing.  So the second phase may leave duplicates (only it).
 *
 * Against the real Apache Kafka broker (OBX_CHAOS_BROKER=kafka, the kafka
 * fixture): librdkafka's defaults (5 requests in flight, which that broker
 * checks), faults kill -9 of outboxd, walsender terminated, PostgreSQL
 * restarted, and in the second phase the broker killed with -9 or stopped,
 * then started again on its data (no RTT or Produce errors: a real broker
 * cannot be told to give them).  OBX_CHAOS_EXACTLY_ONCE=1 runs it with
 * [delivery] exactly_once = on and reads as a read_committed consumer: no
 * duplicate in either phase.
 *
 * OBX_CHAOS_SECONDS sets the fault time (default 90, split between the
 * phases; longer for a soak); OBX_CHAOS_SEED the random seed;
 * OBX_CHAOS_MIN_FAULTS the faults injected however short the time (default
 * 25, split between the phases, at least one of each kind).  It fails when
 * fewer were injected or a kind was missed.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define AGGS 160
#define TOPICS 16
#define WRITERS 4

enum fault { F_KILL9, F_TERMINATE, F_PG_RESTART, F_RTT, F_PRODUCE_ERRORS, F_BROKERS_DOWN, F_COUNT };
static const char *const fault_names[F_COUNT] = {
	"kill -9 outboxd",
	"walsender terminated",
	"postgres restart -m immediate",
	"broker rtt",
	"produce errors",
	"all brokers down",
};
/* the first phase's kinds: those before F_BROKERS_DOWN */
#define F_DEDUPED F_BROKERS_DOWN

static struct t_relay R;
static volatile sig_atomic_t writer_stop;
static bool REAL;        /* against the real broker (OBX_CHAOS_BROKER=kafka) */
static bool EXACTLY;     /* exactly_once = on, read as read_committed (OBX_CHAOS_EXACTLY_ONCE=1) */
static int broker_downs; /* real broker: odd ones are kill -9, even ones a clean stop */

/* Whether fault kind f can be injected against this run's broker. */
static bool
available(enum fault f)
{
	return !REAL || (f != F_RTT && f != F_PRODUCE_ERRORS);
}

static void
on_term(int sig)
{
	(void)sig;
	writer_stop = 1;
}

static PGconn *
writer_connect(const struct t_stack *st, const char *db)
{
	char ci[512];

	t_conninfo(st, db, ci, sizeof(ci));
	for (;;) {
		PGconn *c = PQconnectdb(ci);

		if (PQstatus(c) == CONNECTION_OK)
			return c;
		PQfinish(c);
		if (writer_stop)
			return NULL;
		usleep(100000);
	}
}

/* One application transaction; the outcome is judged later by the database. */
static void
writer_txn(PGconn *c, unsigned seed)
{
	static const char one[] =
	    "WITH v AS (UPDATE agg SET version = version + 1 WHERE id = %d RETURNING id, version), "
	    "e AS (INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "  SELECT current_database() || '.' || (id %% %d), id::text, 'V', "
	    "jsonb_build_object('version', version) FROM v "
	    "  RETURNING id, aggregateid, payload) "
	    "INSERT INTO chaos_events (event_id, agg, version) "
	    "  SELECT id, aggregateid::int, (payload->>'version')::int FROM e;";
	char sql[4096];
	size_t n = 0;
	int a = (int)(seed % AGGS) + 1;
	int kind = (int)((seed / AGGS) % 10);
	PGresult *r;

	n += (size_t)snprintf(sql + n, sizeof(sql) - n, "BEGIN;");
	n += (size_t)snprintf(sql + n, sizeof(sql) - n, one, a, TOPICS);
	if (kind >= 7) { /* a second aggregate, locked in id order (no deadlocks) */
		int b = a % AGGS + 1;

		if (b > a)
			n += (size_t)snprintf(sql + n, sizeof(sql) - n, one, b, TOPICS);
	}
	if (kind == 3 || kind == 4) /* delete the row again in the same transaction */
		n += (size_t)snprintf(sql + n, sizeof(sql) - n, "DELETE FROM outbox WHERE aggregateid = '%d';", a);
	snprintf(sql + n, sizeof(sql) - n, kind == 5 ? "ROLLBACK;" : "COMMIT;");
	r = PQexec(c, sql);
	PQclear(r);
}

static void
writer(const struct t_stack *st, const char *db, unsigned seed)
{
	PGconn *c;

	signal(SIGTERM, on_term);
	c = writer_connect(st, db);
	while (!writer_stop && c != NULL) {
		seed = seed * 1103515245u + 12345u;
		writer_txn(c, seed >> 8);
		if (PQstatus(c) != CONNECTION_OK) {
			PQfinish(c);
			c = writer_connect(st, db);
		}
		usleep(3000);
	}
	PQfinish(c);
	_exit(0);
}

static void
reconnect_driver(void)
{
	for (int i = 0; i < 300; i++) {
		char ci[512];

		if (R.pg != NULL && PQstatus(R.pg) == CONNECTION_OK) {
			PGresult *r = PQexec(R.pg, "SELECT 1");
			int ok = PQresultStatus(r) == PGRES_TUPLES_OK;

			PQclear(r);
			if (ok)
				return;
		}
		PQfinish(R.pg);
		t_conninfo(&R.st, R.db, ci, sizeof(ci));
		R.pg = PQconnectdb(ci);
		usleep(100000);
	}
	fail_msg("could not reconnect to PostgreSQL");
}

static void
ensure_outboxd(void)
{
	if (R.pid > 0 && waitpid(R.pid, NULL, WNOHANG) == R.pid) {
		t_log_dump(&R);
		fail_msg("outboxd exited by itself during chaos");
	}
	if (R.pid <= 0)
		t_relay_start(&R, NULL, 0);
}

static void
inject(enum fault f)
{
	switch (f) {
	case F_KILL9:
		if (R.pid > 0) {
			kill(R.pid, SIGKILL);
			waitpid(R.pid, NULL, 0);
			R.pid = 0;
		}
		usleep(200000);
		ensure_outboxd();
		break;
	case F_BROKERS_DOWN:
		if (REAL) {
			/* kill -9 and start again on its data, or a clean stop and start ("restart") */
			if (broker_downs++ % 2 == 0) {
				t_kafka_ctl("kill");
				usleep(1000000);
			}
			t_kafka_ctl("restart");
			break;
		}
		for (int b = 1; b <= 3; b++)
			t_broker_cmd(&R.b, "down %d", b);
		usleep(2500000);
		for (int b = 1; b <= 3; b++)
			t_broker_cmd(&R.b, "up %d", b);
		break;
	case F_PRODUCE_ERRORS:
		t_broker_cmd(&R.b, "produce-errors 4 NOT_ENOUGH_REPLICAS");
		break;
	case F_RTT:
		for (int b = 1; b <= 3; b++)
			t_broker_cmd(&R.b, "rtt %d 300", b);
		usleep(1500000);
		for (int b = 1; b <= 3; b++)
			t_broker_cmd(&R.b, "rtt %d 0", b);
		break;
	case F_TERMINATE:
		reconnect_driver();
		t_exec(R.pg,
		    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active AND slot_name = '%s'",
		    R.slot);
		break;
	case F_PG_RESTART:
		if (t_pg_ctl(&R.st, "restart -m immediate") != 0)
			fail_msg("could not restart PostgreSQL");
		reconnect_driver();
		break;
	default:
		break;
	}
}

static int
cmp_msg(const void *a, const void *b)
{
	const struct t_msg *x = a, *y = b;
	int c = strcmp(x->topic, y->topic);

	if (c != 0)
		return c;
	if (x->partition != y->partition)
		return x->partition < y->partition ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

struct tally {
	size_t committed, records, dups, restarts;
};

/* Drains, reads every topic back and checks invariants 1, 2, 3 and 6 (see the top); counts. */
static void
verify(struct tally *t, bool exactly_once)
{
	struct t_msg *all = NULL;
	size_t nall = 0;
	PGresult *res;
	char **ids;

	memset(t, 0, sizeof(*t));
	reconnect_driver();
	ensure_outboxd();
	if (!t_wait_confirmed_current(&R, 120000)) {
		t_log_dump(&R);
		fail_msg("outboxd did not catch up after the faults");
	}
	res = PQexec(R.pg, "SELECT event_id::text, agg, version FROM chaos_events ORDER BY event_id");
	t->committed = (size_t)PQntuples(res);
	for (int tp = 0; tp < TOPICS; tp++) {
		char topic[128];
		struct t_msg *m;
		size_t n;

		char *want = t_query1(R.pg, "SELECT count(*) FROM chaos_events WHERE agg %% %d = %d", TOPICS, tp);

		snprintf(topic, sizeof(topic), "outbox.event.%s.%d", R.db, tp);
		n = EXACTLY && REAL ? t_consume_committed(R.b.bootstrap, topic, 20000, &m) :
		                      t_consume_all(R.b.bootstrap, topic, 20000, &m);
		print_message("chaos: %s: %s committed, %zu records\n", topic, want, n);
		free(want);
		all = realloc(all, (nall + n + 1) * sizeof(*all));
		memcpy(all + nall, m, n * sizeof(*m));
		nall += n;
		free(m);
	}
	t->records = nall;

	/* 1 and 2: every committed event is there; nothing else is */
	ids = calloc(nall + 1, sizeof(char *));
	for (size_t i = 0; i < nall; i++)
		ids[i] = (char *)t_msg_header(&all[i], "id");
	qsort(ids, nall, sizeof(char *), cmp_str);
	{
		size_t j = 0;

		for (int i = 0; i < (int)t->committed; i++) {
			const char *want = PQgetvalue(res, i, 0);

			while (j < nall && strcmp(ids[j], want) < 0) {
				fail_msg("invented event %s: not committed (rolled back?)", ids[j]);
			}
			if (j >= nall || strcmp(ids[j], want) != 0)
				fail_msg("committed event %s (aggregate %s version %s) is missing", want,
				    PQgetvalue(res, i, 1), PQgetvalue(res, i, 2));
			j++;
			while (j < nall && strcmp(ids[j], want) == 0) {
				if (exactly_once)
					fail_msg("event %s (aggregate %s version %s) was published more than once",
					    want, PQgetvalue(res, i, 1), PQgetvalue(res, i, 2));
				t->dups++;
				j++;
			}
		}
		if (j < nall)
			fail_msg("invented event %s: not committed", ids[j]);
	}
	free(ids);
	PQclear(res);

	/* 3: per key, in partition order, a version continues by one or restarts lower (re-send) */
	qsort(all, nall, sizeof(*all), cmp_msg);
	{
		int last[AGGS + 1] = { 0 };

		for (size_t i = 0; i < nall; i++) {
			int k = atoi(all[i].key);
			const char *v = strstr(all[i].value, "\"version\": ");
			int ver = v ? atoi(v + 11) : -1;

			assert_true(k >= 1 && k <= AGGS);
			if (ver > last[k] + 1) {
				/* the key's records up to here, for the post-mortem */
				for (size_t j = 0, shown = 0; j <= i && shown < 40; j++) {
					const struct t_msg *x = &all[i - j];

					if (atoi(x->key) != k)
						continue;
					print_error("  %s [%d] @%lld: %s lsn %s seq %s\n", x->topic, x->partition,
					    (long long)x->offset, x->value, t_msg_header(x, "lsn"),
					    t_msg_header(x, "seq"));
					shown++;
				}
				fail_msg("aggregate %d: version %d after %d: order broken", k, ver, last[k]);
			}
			if (ver <= last[k])
				t->restarts++;
			last[k] = ver;
		}
	}
	t_msgs_free(all, nall);
	assert_true(t->committed > 0);
	if (exactly_once)
		assert_int_equal(t->restarts, 0);
}

/* Injects faults of the kinds below upto (each once first) for seconds and at least min_faults. */
static int
fault_phase(int counts[F_COUNT], enum fault upto, int seconds, int min_faults)
{
	pid_t writers[WRITERS];
	int total = 0, first = 0;

	for (int w = 0; w < WRITERS; w++) {
		writers[w] = fork();
		if (writers[w] == 0)
			writer(&R.st, R.db, (unsigned)random() + (unsigned)w * 7919u);
	}
	for (int64_t t0 = t_now_ms(); t_now_ms() - t0 < (int64_t)seconds * 1000 || total < min_faults;) {
		enum fault f;

		/* each kind this broker can be given once, then at random among them */
		while (first < (int)upto && !available((enum fault)first))
			first++;
		if (first < (int)upto)
			f = (enum fault)first++;
		else
			do
				f = (enum fault)(random() % upto);
			while (!available(f));
		inject(f);
		counts[f]++;
		total++;
		usleep((useconds_t)(500000 + random() % 1500000));
		ensure_outboxd();
	}
	for (int w = 0; w < WRITERS; w++) {
		kill(writers[w], SIGTERM);
		waitpid(writers[w], NULL, 0);
	}
	return total;
}

/* Log lines that say re-sent events were found in Kafka (restart de-duplication, or exactly-once's
 * replay against its progress record) and not sent again. */
static int
resent_found(void)
{
	return EXACTLY ? t_log_count(&R, "were in committed Kafka transactions already and were not sent again") :
	                 t_log_count(&R, "were in Kafka already and were not sent again");
}

static void
test_chaos(void **state)
{
	const char *secs = getenv("OBX_CHAOS_SECONDS");
	const char *seedenv = getenv("OBX_CHAOS_SEED");
	const char *minenv = getenv("OBX_CHAOS_MIN_FAULTS");
	int seconds = secs ? atoi(secs) : 90;
	int min_faults = minenv ? atoi(minenv) : 25, min_one, min_two;
	unsigned seed = seedenv ? (unsigned)strtoul(seedenv, NULL, 10) : (unsigned)time(NULL);
	int counts[F_COUNT] = { 0 }, total = 0, skipped;
	struct tally one, two;

	(void)state;
	REAL = getenv("OBX_CHAOS_BROKER") != NULL && strcmp(getenv("OBX_CHAOS_BROKER"), "kafka") == 0;
	EXACTLY = getenv("OBX_CHAOS_EXACTLY_ONCE") != NULL && strcmp(getenv("OBX_CHAOS_EXACTLY_ONCE"), "1") == 0;
	srandom(seed);
	min_one = min_faults / 2 > (int)F_DEDUPED ? min_faults / 2 : (int)F_DEDUPED;
	min_two = min_faults - min_one > (int)F_COUNT ? min_faults - min_one : (int)F_COUNT;
	min_faults = min_one + min_two;
	print_message("chaos: seed %u, %d s of faults, at least %d%s%s\n", seed, seconds, min_faults,
	    REAL ? ", against Apache Kafka" : "", EXACTLY ? ", exactly-once" : "");
	if (REAL) {
		struct t_kafka k;
		char conf[256];

		t_kafka_load(&k);
		snprintf(conf, sizeof(conf), "bootstrap.servers = %s", k.plaintext);
		t_relay_setup_kafka(&R, EXACTLY ? "chaoseos" : "chaoskafka", conf);
	} else {
		t_relay_setup(&R, "chaos", 0);
	}
	t_exec(R.pg, "CREATE TABLE agg (id int PRIMARY KEY, version int NOT NULL)");
	t_exec(R.pg, "INSERT INTO agg SELECT g, 0 FROM generate_series(1, %d) g", AGGS);
	t_exec(R.pg, "CREATE TABLE chaos_events (event_id uuid PRIMARY KEY, agg int, version int)");
	for (int t = 0; t < TOPICS; t++) {
		char topic[128];

		snprintf(topic, sizeof(topic), "outbox.event.%s.%d", R.db, t);
		if (REAL) {
			struct t_kafka k;

			t_kafka_load(&k);
			t_kafka_create_topic(&k, topic, 4, NULL);
		} else {
			assert_int_equal(t_broker_cmd(&R.b, "topic %s 4", topic), 0);
		}
	}
	/*
	 * The test broker checks idempotent sequence numbers only for transactional
	 * producers, so with Produce errors and more than one request in flight it
	 * could itself reorder or duplicate; one in flight keeps the test about outboxd.
	 * The real broker checks them: librdkafka's defaults stay.
	 */
	if (REAL)
		t_relay_config(&R, EXACTLY ? "[delivery]\nexactly_once = on\n" : NULL);
	else
		t_relay_config(&R, "[kafka]\nmax.in.flight.requests.per.connection = 1\n");
	setenv("OUTBOXD_LOG_LEVEL", "info", 1); /* the environment overrides the file */
	t_relay_start(&R, NULL, 1);

	/* phase one: faults whose re-sends de-duplication removes: exactly once */
	total += fault_phase(counts, F_DEDUPED, seconds / 2, min_one);
	verify(&one, true);
	skipped = resent_found();
	/* a short run (the compatibility set's 15 s) may end before any fault caught events in
	 * flight: more faults of the same kinds until one did, so the check below proves something */
	for (int more = 0; skipped == 0 && more < 4; more++) {
		print_message("chaos: no fault re-sent events yet; 5 s more\n");
		total += fault_phase(counts, F_DEDUPED, 5, (int)F_DEDUPED);
		verify(&one, true);
		skipped = resent_found();
	}
	print_message("chaos: phase one: %zu events committed, %zu records, %zu duplicates; %d topic "
	              "read-back(s) found re-sent events\n",
	    one.committed, one.records, one.dups, skipped);
	/* the faults re-sent events, and they were found: the check above proved something */
	assert_true(skipped > 0);

	/* phase two: every kind; exactly-once read as read_committed leaves no duplicate either */
	total += fault_phase(counts, F_COUNT, seconds - seconds / 2, min_two);
	verify(&two, EXACTLY && REAL);

	for (int f = 0; f < F_COUNT; f++)
		print_message("chaos: %-32s %d\n", fault_names[f], counts[f]);
	print_message("chaos: %d faults; %zu events committed, %zu records read, %zu duplicates "
	              "(phase one %zu), %zu re-sent runs; %d de-duplication fallback(s) logged\n",
	    total, two.committed, two.records, two.dups, one.dups, two.restarts,
	    t_log_count(&R, "(at-least-once)"));
	assert_true(total >= min_faults);
	for (int f = 0; f < F_COUNT; f++)
		assert_true(counts[f] > 0 || !available((enum fault)f));
	/* 6: duplicates come only from crashes and broker outages */
	if (two.dups > 0)
		assert_true(counts[F_KILL9] + counts[F_TERMINATE] + counts[F_PG_RESTART] + counts[F_BROKERS_DOWN] >
		    0);
}

static int
teardown(void **state)
{
	(void)state;
	t_relay_teardown(&R);
	return 0;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_chaos, teardown),
	};

	return T_RUN_TESTS(tests);
}
