/*
 * [source] snapshot = pending against the real stack: the move from
 * polling mode to the log while the application keeps writing.  A backlog
 * of pending rows, writers committing throughout, a poller that publishes
 * part of it and stops with SIGTERM, then outboxd in logical mode creating
 * its slot and publishing the rows still pending from the slot's exported
 * snapshot before it streams.  Without a crash every committed row reaches
 * Kafka exactly once and each aggregate's versions arrive in order; with a
 * kill -9 in the middle of the snapshot the next start takes it again and
 * nothing is lost, also when a hot standby is the one that takes over.
 * Also a table without the polling columns, a restart that finds no
 * marker, SIGTERM during a snapshot, and the combinations the setting
 * refuses.
 *
 * The writers record, for every row, the server's WAL insert position
 * before and after their COMMIT: a row whose transaction ended below the
 * slot's start must come from the snapshot, one that began above it from
 * the stream, which checks the hand-over point without trusting outboxd's
 * own headers.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "obx/core/snapmark.h"

#define AGGS 200
#define TOPICS 4 /* outbox.event.snap0..3, 4 partitions each */
#define BACKLOG 5000
#define WRITERS 2
#define KILL_AFTER 1500

static struct t_relay R;
static struct t_relay P;  /* the poller (a twin of R, its own log) */
static struct t_relay L2; /* the second logical run after a kill -9 (its own log) */
static pid_t writer_pid[WRITERS];
static char writer_file[WRITERS][128];

static void free_all(void);

static void
stop_writers_hard(void)
{
	for (int w = 0; w < WRITERS; w++) {
		if (writer_pid[w] > 0) {
			kill(writer_pid[w], SIGKILL);
			waitpid(writer_pid[w], NULL, 0);
			writer_pid[w] = 0;
		}
		if (writer_file[w][0] != '\0')
			unlink(writer_file[w]);
		writer_file[w][0] = '\0';
	}
}

static int
teardown(void **state)
{
	(void)state;
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	stop_writers_hard();
	free_all();
	if (P.log[0] != '\0')
		t_relay_twin_stop(&P);
	if (L2.log[0] != '\0')
		t_relay_twin_stop(&L2);
	t_relay_teardown(&R);
	memset(&P, 0, sizeof(P));
	memset(&L2, 0, sizeof(L2));
	return 0;
}

/* ---- the writers ---- */

static volatile sig_atomic_t writer_stop;

static void
writer_on_term(int sig)
{
	(void)sig;
	writer_stop = 1;
}

/*
 * A writer process: until SIGTERM, transactions that each bump one
 * aggregate's version by k (1 to 3) under its row lock and insert k events
 * carrying versions v+1..v+k, so an aggregate's versions grow with its seq
 * and its commit order alike.  Every committed row goes to path as
 * "id pre post": the WAL insert position before and after the COMMIT.
 * Never returns; exits 0 when stopped by SIGTERM, 1 on any error.
 */
static void __attribute__((noreturn)) writer_main(int w, const char *path)
{
	struct sigaction sa;
	unsigned seed = (unsigned)getpid() * 7919u + (unsigned)w;
	char ci[512], sql[1024];
	PGconn *c;
	FILE *out;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = writer_on_term;
	sigaction(SIGTERM, &sa, NULL);
	t_conninfo(&R.st, R.db, ci, sizeof(ci));
	c = PQconnectdb(ci);
	out = fopen(path, "w");
	if (PQstatus(c) != CONNECTION_OK || out == NULL) {
		fprintf(stderr, "writer %d: could not start: %s", w, PQerrorMessage(c));
		_exit(1);
	}
	while (!writer_stop) {
		int a = (int)(rand_r(&seed) % AGGS) + 1, k = (int)(rand_r(&seed) % 3) + 1;
		PGresult *ins, *res;

		snprintf(sql, sizeof(sql),
		    "BEGIN; WITH v AS (UPDATE agg SET version = version + %d WHERE id = %d RETURNING version) "
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "SELECT 'snap%d', '%d', 'V', jsonb_build_object('version', v.version - %d + g) "
		    "FROM v, generate_series(1, %d) g ORDER BY g RETURNING id, pg_current_wal_insert_lsn()",
		    k, a, a % TOPICS, a, k, k);
		ins = PQexec(c, sql);
		if (PQresultStatus(ins) != PGRES_TUPLES_OK || PQntuples(ins) != k) {
			fprintf(stderr, "writer %d: insert failed: %s", w, PQerrorMessage(c));
			_exit(1);
		}
		res = PQexec(c, "COMMIT");
		if (PQresultStatus(res) != PGRES_COMMAND_OK) {
			fprintf(stderr, "writer %d: commit failed: %s", w, PQerrorMessage(c));
			_exit(1);
		}
		PQclear(res);
		res = PQexec(c, "SELECT pg_current_wal_insert_lsn()");
		if (PQresultStatus(res) != PGRES_TUPLES_OK) {
			fprintf(stderr, "writer %d: could not read the WAL position: %s", w, PQerrorMessage(c));
			_exit(1);
		}
		for (int i = 0; i < k; i++)
			fprintf(out, "%s %s %s\n", PQgetvalue(ins, i, 0), PQgetvalue(ins, i, 1),
			    PQgetvalue(res, 0, 0));
		PQclear(res);
		PQclear(ins);
		usleep(5000);
	}
	if (fclose(out) != 0)
		_exit(1);
	/* the parent's connection R.pg was inherited: leave it alone, end only ours */
	PQfinish(c);
	_exit(0);
}

static void
start_writers(void)
{
	for (int w = 0; w < WRITERS; w++) {
		snprintf(writer_file[w], sizeof(writer_file[w]), "/tmp/obx-test-%s.writer%d", R.db, w);
		writer_pid[w] = fork();
		if (writer_pid[w] < 0)
			fail_msg("fork failed");
		if (writer_pid[w] == 0)
			writer_main(w, writer_file[w]);
	}
}

/* Stops the writers with SIGTERM (each ends its transaction first); fails unless both exit 0. */
static void
stop_writers(void)
{
	for (int w = 0; w < WRITERS; w++) {
		int st;

		kill(writer_pid[w], SIGTERM);
		st = t_wait(writer_pid[w], 15000);
		if (st == -1)
			fail_msg("writer %d did not stop", w);
		writer_pid[w] = 0;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			fail_msg("writer %d failed (wait status %d)", w, st);
	}
}

/* ---- the rows and the records ---- */

struct row {
	char id[40];
	char payload[48]; /* payload::text, the record's value */
	int agg;
	int version;
	long long seq;              /* the table's ordering column */
	bool marked;                /* published_at set: the poller published it */
	uint64_t pre, post;         /* the writer's WAL bounds of its commit; 0 when not a writer's row */
	int polled, snap, streamed; /* deliveries by kind */
	int snap2;                  /* snapshot deliveries of the second logical run */
	int64_t last_offset;        /* of its last delivery (one key: one partition) */
	long long ordinal;          /* the snapshot's seq header (the last seen) */
};

static struct row *rows;
static size_t nrows;

static int
cmp_row(const void *a, const void *b)
{
	return strcmp(((const struct row *)a)->id, ((const struct row *)b)->id);
}

static struct row *
row_find(const char *id)
{
	struct row key;
	size_t n;

	/* an id longer than the field is no row's (and must not match one cut short) */
	if (id == NULL || (n = strlen(id)) >= sizeof(key.id))
		return NULL;
	memcpy(key.id, id, n + 1);
	return bsearch(&key, rows, nrows, sizeof(*rows), cmp_row);
}

/* Every committed row, with the writers' WAL bounds where they wrote it. */
static void
load_rows(void)
{
	PGresult *res = PQexec(R.pg,
	    "SELECT id::text, aggregateid::int, (payload->>'version')::int, seq, "
	    "published_at IS NOT NULL, payload::text FROM outbox");

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		fail_msg("could not read the outbox: %s", PQerrorMessage(R.pg));
	nrows = (size_t)PQntuples(res);
	rows = calloc(nrows ? nrows : 1, sizeof(*rows));
	for (size_t i = 0; i < nrows; i++) {
		snprintf(rows[i].id, sizeof(rows[i].id), "%s", PQgetvalue(res, (int)i, 0));
		rows[i].agg = atoi(PQgetvalue(res, (int)i, 1));
		rows[i].version = atoi(PQgetvalue(res, (int)i, 2));
		rows[i].seq = atoll(PQgetvalue(res, (int)i, 3));
		rows[i].marked = PQgetvalue(res, (int)i, 4)[0] == 't';
		snprintf(rows[i].payload, sizeof(rows[i].payload), "%s", PQgetvalue(res, (int)i, 5));
		rows[i].ordinal = -1;
		rows[i].last_offset = -1;
	}
	PQclear(res);
	qsort(rows, nrows, sizeof(*rows), cmp_row);
	for (int w = 0; w < WRITERS; w++) {
		FILE *fp = fopen(writer_file[w], "r");
		char id[64], pre[32], post[32];

		if (fp == NULL)
			fail_msg("could not open %s", writer_file[w]);
		while (fscanf(fp, "%63s %31s %31s", id, pre, post) == 3) {
			struct row *r = row_find(id);

			if (r == NULL)
				fail_msg("writer %d committed %s, which is not in the table", w, id);
			r->pre = t_lsn(pre);
			r->post = t_lsn(post);
		}
		fclose(fp);
	}
}

static struct t_msg *msgs[TOPICS];
static size_t nmsgs[TOPICS];
static const struct t_msg **all; /* every record, sorted (all_records) */
static int *last;                /* per aggregate, the last version delivered */
static long long *by_ordinal;    /* the snapshot's seq header -> the row's seq */

static void
free_all(void)
{
	for (int t = 0; t < TOPICS; t++) {
		t_msgs_free(msgs[t], nmsgs[t]);
		msgs[t] = NULL;
		nmsgs[t] = 0;
	}
	free(rows);
	rows = NULL;
	nrows = 0;
	free(all);
	all = NULL;
	free(last);
	last = NULL;
	free(by_ordinal);
	by_ordinal = NULL;
}

static void
consume_topics(void)
{
	for (int t = 0; t < TOPICS; t++) {
		char topic[64];

		snprintf(topic, sizeof(topic), "outbox.event.snap%d", t);
		t_msgs_free(msgs[t], nmsgs[t]);
		nmsgs[t] = t_consume_all(R.b.bootstrap, topic, 15000, &msgs[t]);
	}
}

static int
cmp_msg(const void *a, const void *b)
{
	const struct t_msg *x = *(const struct t_msg *const *)a, *y = *(const struct t_msg *const *)b;
	int c = strcmp(x->topic, y->topic);

	if (c != 0)
		return c;
	if (x->partition != y->partition)
		return x->partition < y->partition ? -1 : 1;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Every record of the four topics, in (topic, partition, offset) order, into all. */
static void
all_records(size_t *n)
{
	size_t k = 0;

	*n = 0;
	for (int t = 0; t < TOPICS; t++)
		*n += nmsgs[t];
	all = calloc(*n ? *n : 1, sizeof(*all));
	for (int t = 0; t < TOPICS; t++)
		for (size_t i = 0; i < nmsgs[t]; i++)
			all[k++] = &msgs[t][i];
	qsort(all, *n, sizeof(*all), cmp_msg);
}

static size_t
count_snapshot_records(void)
{
	size_t c = 0;

	for (int t = 0; t < TOPICS; t++)
		for (size_t i = 0; i < nmsgs[t]; i++)
			c += t_msg_header(&msgs[t][i], "snapshot") != NULL;
	return c;
}

/* ---- logs, slots ---- */

/*
 * The last line of r's log saying a snapshot is done, "snapshot of slot S
 * at LSN: N row(s) published in T s": its LSN and N go to *lsn and *n.
 * Returns how many such lines the log holds.
 */
static int
snapshot_line(const struct t_relay *r, uint64_t *lsn, long *n)
{
	FILE *fp = fopen(r->log, "r");
	char line[4096];
	int found = 0;

	*lsn = 0;
	*n = -1;
	while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
		const char *p = strstr(line, "snapshot of slot ");
		const char *at, *colon;

		if (p == NULL || strstr(p, " row(s) published in ") == NULL)
			continue;
		found++;
		at = strstr(p, " at ");
		colon = at != NULL ? strstr(at, ": ") : NULL;
		if (at == NULL || colon == NULL)
			fail_msg("a snapshot line without its position: %s", line);
		*lsn = t_lsn(at + 4);
		*n = strtol(colon + 2, NULL, 10);
	}
	if (fp != NULL)
		fclose(fp);
	return found;
}

/* The type of the slot named name ("logical", "physical"), or "" when there is none; caller frees. */
static char *
slot_type(const char *name)
{
	return t_query1(R.pg,
	    "SELECT coalesce((SELECT slot_type FROM pg_replication_slots WHERE slot_name = '%s'), '')", name);
}

static void
assert_slot(const char *name, const char *want)
{
	char *type = slot_type(name);

	if (strcmp(type, want) != 0)
		fail_msg("slot %s: type '%s', want '%s'", name, type, want);
	free(type);
}

/* Waits until r logs "streaming from slot" (after its snapshot); fails if it exits or takes over timeout_ms. */
static void
wait_streaming(struct t_relay *r, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (t_log_count(r, "streaming from slot") == 0) {
		if (t_now_ms() > deadline || waitpid(r->pid, NULL, WNOHANG) == r->pid) {
			t_log_dump(r);
			fail_msg("outboxd did not start streaming within %d ms", timeout_ms);
		}
		usleep(20000);
	}
}

/* Runs outboxd cmd -c conf, its output to out; returns the exit status. */
static int
run_capture(const char *cmd, const char *conf, char *out, size_t len)
{
	char line[1024];

	snprintf(line, sizeof(line), "%s %s -c %s 2>&1", getenv("OBX_OUTBOXD"), cmd, conf);
	return t_run_capture(line, out, len);
}

/* ---- the scene ---- */

/*
 * A database with the polling columns and the NOTIFY trigger, AGGS
 * aggregates at version BACKLOG/AGGS and their BACKLOG events pending,
 * writers started, a poller that publishes part of the backlog and stops
 * with SIGTERM; then R's config for logical mode with snapshot = pending.
 * Returns the rows the poller published.
 */
static long
scene(const char *prefix)
{
	int64_t deadline;
	long published;
	int st;

	t_relay_setup(&R, prefix, 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	t_exec_file(R.pg, "sql/009_polling_notify.sql");
	t_exec(R.pg, "CREATE TABLE agg (id int PRIMARY KEY, version int NOT NULL)");
	/* one transaction: versions 1..25 of every aggregate, in seq order, all pending */
	t_exec(R.pg,
	    "INSERT INTO agg SELECT g, %d FROM generate_series(1, %d) g;"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'snap' || (a %% %d), a::text, 'V', jsonb_build_object('version', v) "
	    "FROM generate_series(1, %d) v, generate_series(1, %d) a ORDER BY v, a",
	    BACKLOG / AGGS, AGGS, TOPICS, BACKLOG / AGGS, AGGS);
	assert_int_equal(t_pending_rows(R.pg), BACKLOG);

	/* small batches, so the poller is stopped part-way through the backlog */
	t_relay_config(&R, "[source]\nmode = poll\n[poll]\npoll_interval = 100ms\nbatch = 50\n");
	t_relay_twin(&R, &P, "poll");
	start_writers();
	t_relay_start(&P, NULL, 0);
	deadline = t_now_ms() + 30000;
	for (;;) {
		char *v = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL");

		published = atol(v);
		free(v);
		if (published >= 1000)
			break;
		if (t_now_ms() > deadline || waitpid(P.pid, NULL, WNOHANG) == P.pid) {
			t_log_dump(&P);
			fail_msg("the poller published %ld row(s), not 1000", published);
		}
		usleep(20000);
	}
	/* a graceful stop: every row it sent is marked, none is sent twice */
	st = t_relay_signal(&P, SIGTERM, 30000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		t_log_dump(&P);
		fail_msg("the poller did not stop cleanly on SIGTERM (wait status %d)", st);
	}
	{
		char *v = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE published_at IS NOT NULL");

		published = atol(v);
		free(v);
	}
	print_message("the poller published %ld row(s) and stopped; %ld pending\n", published,
	    t_pending_rows(R.pg));
	if (t_pending_rows(R.pg) < KILL_AFTER + 1000)
		fail_msg("only %ld row(s) pending after the poller: the snapshot would be too small",
		    t_pending_rows(R.pg));

	t_relay_config(&R, "[source]\nsnapshot = pending\n");
	return published;
}

/*
 * What holds for every run: each committed row is in Kafka (none
 * missing); a record's topic, key, value, id and type are its row's; each
 * record is of one kind, by its headers: the poller's (no lsn), a
 * snapshot's (snapshot, lsn 0/0, seq, no xid or commit_ts, of a row the
 * poller had not marked) or the stream's (an lsn at or above snap_lsn, of
 * a row not marked), and in each partition the poller's records come
 * first, then the snapshots', then the stream's; per aggregate, the last deliveries of its rows carry versions 1, 2, 3, ... in
 * partition order, up to the aggregate's final version.  Fills the
 * rows' delivery counts.  Records of partition offset >= from[topic][p]
 * (when from is not NULL) count as the second run's snapshot records
 * (snap2).
 */
static void
check_records(uint64_t snap_lsn, int64_t from[TOPICS][4])
{
	size_t n;
	PGresult *res;

	static const char *const kinds[] = { "the poller's", "a snapshot's", "the stream's" };
	int kind_seen = 0;

	last = calloc(AGGS + 1, sizeof(int));
	all_records(&n);
	for (size_t i = 0; i < n; i++) {
		const struct t_msg *m = all[i];
		struct row *r = row_find(t_msg_header(m, "id"));
		const char *snap = t_msg_header(m, "snapshot"), *lsn = t_msg_header(m, "lsn");
		int kind = snap != NULL ? 1 : lsn != NULL ? 2 : 0;
		char topic[64];

		if (r == NULL)
			fail_msg("%s [%d] @%lld: id %s is no committed row", m->topic, m->partition,
			    (long long)m->offset, t_msg_header(m, "id"));
		snprintf(topic, sizeof(topic), "outbox.event.snap%d", r->agg % TOPICS);
		assert_string_equal(m->topic, topic);
		assert_int_equal(atoi(m->key), r->agg);
		if (m->value == NULL || strcmp(m->value, r->payload) != 0)
			fail_msg("row %s: value %s, payload %s", r->id, m->value ? m->value : "(null)",
			    r->payload);
		assert_string_equal(t_msg_header(m, "type"), "V");
		if (i == 0 || m->partition != all[i - 1]->partition || strcmp(m->topic, all[i - 1]->topic) != 0)
			kind_seen = 0;
		if (kind < kind_seen)
			fail_msg("%s [%d] @%lld: %s record after %s", m->topic, m->partition, (long long)m->offset,
			    kinds[kind], kinds[kind_seen]);
		kind_seen = kind;
		if (snap != NULL) {
			const char *seq = t_msg_header(m, "seq");

			if (t_lsn(snap) != snap_lsn)
				fail_msg("snapshot record %s: snapshot header %s, the slot started at %X/%X",
				    r->id, snap, (unsigned)(snap_lsn >> 32), (unsigned)snap_lsn);
			if (lsn == NULL || strcmp(lsn, "0/0") != 0)
				fail_msg("snapshot record %s: lsn header %s, want 0/0", r->id,
				    lsn ? lsn : "(none)");
			assert_non_null(seq);
			assert_null(t_msg_header(m, "xid"));
			assert_null(t_msg_header(m, "commit_ts"));
			if (r->marked)
				fail_msg("row %s (seq %lld) was published by the poller and again by the snapshot",
				    r->id, r->seq);
			r->snap++;
			r->ordinal = atoll(seq);
			if (from != NULL && m->offset >= from[r->agg % TOPICS][m->partition])
				r->snap2++;
		} else if (lsn != NULL) {
			if (t_lsn(lsn) < snap_lsn)
				fail_msg("streamed record %s: lsn %s below the slot's start %X/%X", r->id, lsn,
				    (unsigned)(snap_lsn >> 32), (unsigned)snap_lsn);
			if (r->marked)
				fail_msg("row %s (seq %lld) was published by the poller and again by the stream",
				    r->id, r->seq);
			assert_non_null(t_msg_header(m, "xid"));
			r->streamed++;
		} else {
			if (!r->marked)
				fail_msg("row %s has a record without lsn (the poller's) but is not marked",
				    r->id);
			r->polled++;
		}
	}
	for (size_t i = 0; i < nrows; i++)
		if (rows[i].polled + rows[i].snap + rows[i].streamed == 0)
			fail_msg("row %s (aggregate %d, version %d, seq %lld%s) was committed but never published",
			    rows[i].id, rows[i].agg, rows[i].version, rows[i].seq,
			    rows[i].marked ? ", marked by the poller" : "");
	/* per aggregate, the last delivery of each row, in partition order: 1, 2, 3, ... */
	for (size_t i = 0; i < n; i++) {
		struct row *r = row_find(t_msg_header(all[i], "id"));

		if (all[i]->offset > r->last_offset)
			r->last_offset = all[i]->offset;
	}
	for (size_t i = 0; i < n; i++) {
		const struct t_msg *m = all[i];
		struct row *r = row_find(t_msg_header(m, "id"));

		if (m->offset != r->last_offset)
			continue;
		if (r->version != last[r->agg] + 1)
			fail_msg("aggregate %d: version %d (%s [%d] @%lld, %s) after version %d", r->agg,
			    r->version, m->topic, m->partition, (long long)m->offset,
			    t_msg_header(m, "snapshot") ? "snapshot" :
			        t_msg_header(m, "lsn")  ? "stream" :
			                                  "poller",
			    last[r->agg]);
		last[r->agg] = r->version;
	}
	res = PQexec(R.pg, "SELECT id, version FROM agg");
	assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
	for (int i = 0; i < PQntuples(res); i++)
		if (last[atoi(PQgetvalue(res, i, 0))] != atoi(PQgetvalue(res, i, 1)))
			fail_msg("aggregate %s: last version delivered %d, committed %s", PQgetvalue(res, i, 0),
			    last[atoi(PQgetvalue(res, i, 0))], PQgetvalue(res, i, 1));
	PQclear(res);
}

/*
 * The rows against the slot's start: the backlog the poller left, and a
 * writer's transaction whose COMMIT ended below it, were in the snapshot
 * (so each such row is a snapshot record); a writer's transaction that
 * had not begun its COMMIT before it is decoded from the stream.  Counts
 * the writers' rows on each side in *before and *after, so the caller can
 * tell that the writers really straddled the hand-over.
 */
static void
check_boundary(uint64_t snap_lsn, size_t *before, size_t *after)
{
	*before = *after = 0;
	for (size_t i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];

		if (r->marked)
			continue;
		if (r->post == 0) {
			if (r->snap == 0)
				fail_msg("backlog row %s (seq %lld) is not among the snapshot's records", r->id,
				    r->seq);
		} else if (r->post <= snap_lsn) {
			(*before)++;
			if (r->snap == 0)
				fail_msg("row %s committed below the slot's start (COMMIT ended by %X/%X) is not "
				         "among the snapshot's records",
				    r->id, (unsigned)(r->post >> 32), (unsigned)r->post);
		} else if (r->pre >= snap_lsn) {
			(*after)++;
			if (r->streamed == 0)
				fail_msg(
				    "row %s committed above the slot's start (COMMIT began after %X/%X) was not "
				    "streamed",
				    r->id, (unsigned)(r->pre >> 32), (unsigned)r->pre);
		}
	}
}

/*
 * The snapshot records of one run (second: the second run's, else every
 * one) carry seq 0..n-1, once each, in the order of the table's seq column.
 */
static void
check_ordinals(long n, bool second)
{
	long long prev_seq = -1;
	size_t counted = 0;

	by_ordinal = calloc((size_t)n + 1, sizeof(*by_ordinal));
	for (size_t i = 0; i < nrows; i++) {
		if ((second ? rows[i].snap2 : rows[i].snap) == 0)
			continue;
		if (rows[i].ordinal < 0 || rows[i].ordinal >= n || by_ordinal[rows[i].ordinal] != 0)
			fail_msg("row %s: snapshot seq %lld is out of 0..%ld or taken twice", rows[i].id,
			    rows[i].ordinal, n - 1);
		by_ordinal[rows[i].ordinal] = rows[i].seq;
		counted++;
	}
	if (counted != (size_t)n)
		fail_msg("%zu row(s) have snapshot records, the log says %ld", counted, n);
	for (long i = 0; i < n; i++) {
		if (by_ordinal[i] <= prev_seq)
			fail_msg("snapshot seq %ld is the row of seq %lld, after seq %lld", i, by_ordinal[i],
			    prev_seq);
		prev_seq = by_ordinal[i];
	}
	free(by_ordinal);
	by_ordinal = NULL;
}

/*
 * 1. The hand-over without a crash: the poller publishes part of the
 * backlog and stops; outboxd with snapshot = pending creates the slot,
 * publishes the rows pending in its snapshot in seq order, then streams;
 * the writers never stop meanwhile.  Every row is in Kafka exactly once;
 * the snapshot published as many rows as were pending at the slot's
 * start, numbered 0..N-1 in seq order; the marker slot is gone.
 */
static void
test_handover_once(void **state)
{
	char marker[128];
	uint64_t snap_lsn;
	long n_logged, polled;
	size_t nsnap, before, after;
	int st;

	(void)state;
	polled = scene("snaphand");
	t_relay_start(&R, NULL, 0);
	wait_streaming(&R, 40000);
	/* the writers go on into the stream */
	sleep(2);
	stop_writers();
	if (!t_wait_confirmed_current(&R, 30000)) {
		t_log_dump(&R);
		fail_msg("the slot did not confirm the writers' last transactions");
	}
	st = t_relay_signal(&R, SIGTERM, 30000);
	assert_int_equal(st, 0);

	assert_int_equal(snapshot_line(&R, &snap_lsn, &n_logged), 1);
	snprintf(marker, sizeof(marker), "%s_snapshot", R.slot);
	assert_slot(marker, "");
	assert_slot(R.slot, "logical");

	load_rows();
	consume_topics();
	check_records(snap_lsn, NULL);
	nsnap = count_snapshot_records();
	print_message("the snapshot at %X/%X published %ld row(s) (%zu snapshot record(s)); %ld published "
	              "by the poller, %zu rows in all\n",
	    (unsigned)(snap_lsn >> 32), (unsigned)snap_lsn, n_logged, nsnap, polled, nrows);
	if ((size_t)n_logged != nsnap)
		fail_msg("the log says %ld row(s), Kafka holds %zu snapshot record(s)", n_logged, nsnap);
	/* exactly once: no crash, no duplicate of any kind */
	for (size_t i = 0; i < nrows; i++) {
		int c = rows[i].polled + rows[i].snap + rows[i].streamed;

		if (c != 1)
			fail_msg(
			    "row %s (seq %lld) published %d time(s): %d by the poller, %d by the snapshot, %d "
			    "by the stream",
			    rows[i].id, rows[i].seq, c, rows[i].polled, rows[i].snap, rows[i].streamed);
	}
	check_ordinals(n_logged, false);
	/* the backlog the poller left is in the snapshot, and the writers straddled the slot */
	check_boundary(snap_lsn, &before, &after);
	print_message("writer rows: %zu committed below the slot's start, %zu above\n", before, after);
	assert_true(before > 0);
	assert_true(after > 0);
	assert_true(n_logged >= BACKLOG - polled);
	free_all();
}

/*
 * 2. The same hand-over with outboxd killed (SIGKILL, from the test
 * hook) after KILL_AFTER acknowledgements, in the middle of the snapshot:
 * the logical slot and the marker stay (check says the snapshot did not
 * finish); the next start takes a snapshot again, publishes it and streams from the slot's start.  Nothing is
 * missing; duplicates only of rows pending when the second run took its
 * snapshot; each aggregate's last deliveries in version order; the marker
 * is gone and the second run logged its snapshot.
 */
static void
test_handover_kill9(void **state)
{
	char marker[128], kill_after[16], *v, out[8192], want[256];
	uint64_t snap_lsn, slot_start, streaming_at;
	int64_t from[TOPICS][4];
	long n2, polled;
	size_t nsnap1, dups = 0, snap2 = 0, before, after;
	int st;

	(void)state;
	polled = scene("snapkill");
	snprintf(marker, sizeof(marker), "%s_snapshot", R.slot);
	snprintf(kill_after, sizeof(kill_after), "%d", KILL_AFTER);
	setenv("OBX_TEST_KILL_AFTER_ACKS", kill_after, 1);
	t_relay_start(&R, NULL, 0);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	st = t_wait(R.pid, 40000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("outboxd did not kill itself after %d acknowledgements (wait status %d)", KILL_AFTER, st);
	}
	R.pid = 0;
	t_slot_wait_inactive(&R, 15000);
	/* killed inside the snapshot: not finished, not streaming; both slots stay */
	if (t_log_count(&R, "streaming from slot") != 0 || snapshot_line(&R, &snap_lsn, &n2) != 0) {
		t_log_dump(&R);
		fail_msg("outboxd finished its snapshot before the %d-th acknowledgement", KILL_AFTER);
	}
	assert_slot(R.slot, "logical");
	assert_slot(marker, "physical");
	run_capture("check", R.conf, out, sizeof(out));
	snprintf(want, sizeof(want), "snapshot: the snapshot of slot %s did not finish (slot %s exists)", R.slot,
	    marker);
	if (strstr(out, want) == NULL)
		fail_msg("check does not say \"%s\":\n%s", want, out);
	v = t_query1(R.pg, "SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);
	slot_start = t_lsn(v);
	free(v);
	/* what the first run left in Kafka; the second run's records come after it */
	consume_topics();
	nsnap1 = count_snapshot_records();
	print_message("killed after %zu snapshot record(s); the slot starts at %X/%X\n", nsnap1,
	    (unsigned)(slot_start >> 32), (unsigned)slot_start);
	assert_true(nsnap1 >= KILL_AFTER);
	memset(from, 0, sizeof(from));
	for (int t = 0; t < TOPICS; t++)
		for (size_t i = 0; i < nmsgs[t]; i++) {
			assert_true(msgs[t][i].partition >= 0 && msgs[t][i].partition < 4);
			if (msgs[t][i].offset + 1 > from[t][msgs[t][i].partition])
				from[t][msgs[t][i].partition] = msgs[t][i].offset + 1;
		}

	/* the second run, its own log: snapshot again, then the stream, the writers still going */
	t_relay_twin(&R, &L2, "resume");
	t_relay_start(&L2, NULL, 0);
	wait_streaming(&L2, 40000);
	v = t_query1(R.pg, "SELECT pg_current_wal_insert_lsn()");
	streaming_at = t_lsn(v);
	free(v);
	sleep(2);
	stop_writers();
	if (!t_wait_confirmed_current(&L2, 30000)) {
		t_log_dump(&L2);
		fail_msg("the slot did not confirm the writers' last transactions");
	}
	st = t_relay_signal(&L2, SIGTERM, 30000);
	assert_int_equal(st, 0);
	if (snapshot_line(&L2, &snap_lsn, &n2) != 1) {
		t_log_dump(&L2);
		fail_msg("the second run did not log its snapshot");
	}
	print_message("the second run's snapshot at %X/%X published %ld row(s)\n", (unsigned)(snap_lsn >> 32),
	    (unsigned)snap_lsn, n2);
	assert_true(snap_lsn == slot_start);
	assert_slot(marker, "");
	assert_slot(R.slot, "logical");

	load_rows();
	consume_topics();
	check_records(snap_lsn, from);
	for (size_t i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		int c = r->polled + r->snap + r->streamed;

		snap2 += (size_t)r->snap2;
		if (c > 1)
			dups += (size_t)(c - 1);
		/* the poller stopped cleanly: its rows once */
		if (r->marked && c != 1)
			fail_msg("row %s, published by the poller, was delivered %d times", r->id, c);
		/* a row committed after the second run began streaming was in no snapshot: once */
		if (r->pre >= streaming_at && c != 1)
			fail_msg("row %s committed after the second run streamed was delivered %d times", r->id,
			    c);
		if (r->snap2 > 1)
			fail_msg("row %s: %d records in the second run's snapshot", r->id, r->snap2);
	}
	print_message("%zu row(s), %zu re-delivered; %zu record(s) of the second run's snapshot; %ld by the "
	              "poller\n",
	    nrows, dups, snap2, polled);
	/* the second run published its whole snapshot, numbered in seq order */
	if (snap2 != (size_t)n2)
		fail_msg("the second run's snapshot wrote %zu record(s), its log says %ld", snap2, n2);
	check_ordinals(n2, true);
	/* every row pending at the slot's creation was in it: the backlog the poller left, and the
	 * writers' rows committed below the slot's start */
	for (size_t i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];

		if (!r->marked && (r->post == 0 || r->post <= slot_start) && r->snap2 != 1)
			fail_msg("row %s (seq %lld), pending at the slot's creation, has %d record(s) in the "
			         "second run's snapshot",
			    r->id, r->seq, r->snap2);
	}
	check_boundary(snap_lsn, &before, &after);
	print_message("writer rows: %zu committed below the slot's start, %zu above\n", before, after);
	assert_true(before > 0);
	assert_true(after > 0);
	free_all();
}

/*
 * 3. Two instances, as a Deployment runs them (one active, one hot
 * standby), with the writers going on: the second starts while the first
 * publishes the snapshot (a slower broker), finds the marker, cannot take
 * the snapshot's lock and waits; the first kills itself (SIGKILL) in the
 * middle of the snapshot; the standby takes over, publishes the pending
 * rows and streams.  Nothing is missing, each aggregate's last deliveries
 * are in order, the marker is gone, and only the standby finished a
 * snapshot.
 */
static void
test_standby_takes_over(void **state)
{
	char marker[128], kill_after[16], *v;
	uint64_t snap_lsn, streaming_at;
	int64_t deadline;
	size_t before, after;
	long n, polled;
	int st;

	(void)state;
	polled = scene("snapstby");
	snprintf(marker, sizeof(marker), "%s_snapshot", R.slot);
	/* each fetch of 500 rows waits until at most 100 are outstanding: at least 300 ms */
	t_relay_config(&R, "[source]\nsnapshot = pending\n[delivery]\nmax_inflight = 100\n");
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 300", b), 0);
	snprintf(kill_after, sizeof(kill_after), "%d", KILL_AFTER);
	setenv("OBX_TEST_KILL_AFTER_ACKS", kill_after, 1);
	t_relay_start(&R, NULL, 0);
	unsetenv("OBX_TEST_KILL_AFTER_ACKS");
	deadline = t_now_ms() + 60000;
	while (t_log_count(&R, ": publishing the rows of public.outbox") == 0) {
		if (t_now_ms() > deadline || waitpid(R.pid, NULL, WNOHANG) == R.pid) {
			t_log_dump(&R);
			fail_msg("the first instance did not begin its snapshot");
		}
		usleep(20000);
	}
	t_relay_twin(&R, &L2, "standby");
	t_relay_start(&L2, NULL, 0);
	deadline = t_now_ms() + 20000;
	while (t_log_count(&L2, "another instance is publishing the") == 0) {
		if (t_now_ms() > deadline || waitpid(L2.pid, NULL, WNOHANG) == L2.pid) {
			t_log_dump(&L2);
			fail_msg("the second instance did not wait for the first one's snapshot");
		}
		usleep(20000);
	}
	if (waitpid(R.pid, &st, WNOHANG) == R.pid)
		fail_msg("the first instance ended before the second one waited for it (wait status %d)", st);
	st = t_wait(R.pid, 40000);
	if (st == -1 || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
		t_log_dump(&R);
		fail_msg("the first instance did not kill itself after %d acknowledgements (wait status %d)",
		    KILL_AFTER, st);
	}
	R.pid = 0;
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);
	wait_streaming(&L2, 40000);
	v = t_query1(R.pg, "SELECT pg_current_wal_insert_lsn()");
	streaming_at = t_lsn(v);
	free(v);
	sleep(2);
	stop_writers();
	if (!t_wait_confirmed_current(&L2, 30000)) {
		t_log_dump(&L2);
		fail_msg("the slot did not confirm the writers' last transactions");
	}
	assert_int_equal(t_relay_signal(&L2, SIGTERM, 30000), 0);
	assert_int_equal(snapshot_line(&R, &snap_lsn, &n), 0);
	assert_int_equal(snapshot_line(&L2, &snap_lsn, &n), 1);
	print_message("the standby's snapshot at %X/%X published %ld row(s); %ld by the poller\n",
	    (unsigned)(snap_lsn >> 32), (unsigned)snap_lsn, n, polled);
	assert_slot(marker, "");

	load_rows();
	consume_topics();
	check_records(snap_lsn, NULL);
	for (size_t i = 0; i < nrows; i++) {
		const struct row *r = &rows[i];
		int c = r->polled + r->snap + r->streamed;

		if (r->marked && c != 1)
			fail_msg("row %s, published by the poller, was delivered %d times", r->id, c);
		if (r->pre >= streaming_at && c != 1)
			fail_msg("row %s committed after the standby streamed was delivered %d times", r->id, c);
	}
	check_boundary(snap_lsn, &before, &after);
	assert_true(before > 0);
	assert_true(after > 0);
	free_all();
}

/*
 * 3b. What a snapshot holds is bounded by bytes, not rows: 100 pending rows
 * of 512 KiB each (50 MiB) with [delivery] max_inflight_bytes = 1 MiB.  Each
 * FETCH is read a row at a time, so the process's peak resident set (a build
 * without sanitizers) stays far below what one FETCH of 500 rows held.
 */
static void
test_snapshot_memory_bound(void **state)
{
	const long bound_kb = 40 * 1024;
	uint64_t snap_lsn;
	long logged, hwm;

	(void)state;
	t_relay_setup(&R, "snapmem", 0);
	R.bin = getenv("OBX_OUTBOXD_PLAIN"); /* RSS of a build without sanitizers */
	assert_non_null(R.bin);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'snapmem', 'k' || g, 'Big', jsonb_build_object('pad', "
	    "(SELECT string_agg(md5(random()::text || x || g), '') FROM generate_series(1, 16384) x)) "
	    "FROM generate_series(1, 100) g");
	t_relay_config(&R, "[source]\nsnapshot = pending\n[delivery]\nmax_inflight_bytes = 1MiB\n");
	t_relay_start(&R, NULL, 0);
	wait_streaming(&R, 120000);
	hwm = t_vm_hwm_kb(R.pid);
	assert_int_equal(t_relay_signal(&R, SIGTERM, 20000), 0);
	assert_int_equal(snapshot_line(&R, &snap_lsn, &logged), 1);
	assert_int_equal(logged, 100);
	print_message("peak RSS through a snapshot of 100 rows of 512 KiB: %ld KiB (bound %ld KiB)\n", hwm,
	    bound_kb);
	assert_true(hwm > 0 && hwm < bound_kb);
}

/*
 * 3c. A topic the cluster does not have during the snapshot: one of 1,001
 * pending rows goes to a topic the broker answers UNKNOWN_TOPIC_OR_PART
 * for.  The snapshot follows [delivery] missing_topic_timeout (5 s) like the
 * stream, then on_error = dead_letter: the row's record goes to the
 * dead-letter topic naming its topic, the others are published, the
 * marker goes and streaming begins (it never did: the snapshot started over
 * for ever).  The snapshot holds while it waits and reads its rows again
 * from the one that waited: no row is published more than twice (it was
 * once published again at each of a few restarts from the start).
 */
static void
test_missing_topic_during_snapshot(void **state)
{
	struct t_msg *m;
	size_t n;
	uint64_t snap_lsn;
	long logged;

	(void)state;
	t_relay_setup(&R, "snapmiss", 0);
	assert_int_equal(t_broker_cmd(&R.b, "topic outbox.event.gone 2"), 0);
	assert_int_equal(t_broker_cmd(&R.b, "topic-error outbox.event.gone UNKNOWN_TOPIC_OR_PART"), 0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT CASE WHEN g = 500 THEN 'gone' ELSE 'there' END, 'k' || (g %% 7), 'T', "
	    "jsonb_build_object('i', g) FROM generate_series(0, 1000) g");
	t_relay_config(&R,
	    "[kafka]\ntopic.metadata.propagation.max.ms = 1000\n[source]\nsnapshot = pending\n"
	    "[delivery]\nmissing_topic_timeout = 5s\non_error = dead_letter\n");
	t_relay_start(&R, NULL, 0);
	wait_streaming(&R, 90000);
	assert_true(t_log_count(&R, "topic outbox.event.gone does not exist (yet): waiting up to 5 s") >= 1);
	assert_int_equal(snapshot_line(&R, &snap_lsn, &logged), 1);
	n = t_consume(R.b.bootstrap, "outbox.dead_letter", 1, 20000, &m);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "original_topic"), "outbox.event.gone");
	t_msgs_free(m, n);
	n = t_consume_all(R.b.bootstrap, "outbox.event.there", 20000, &m);
	/* every other row, at least once and at most twice, however long the wait: the snapshot
	 * held and read its rows again from the one that waited, never from the start */
	{
		int seen[1001] = { 0 };

		for (size_t i = 0; i < n; i++) {
			const char *v = m[i].value != NULL ? strstr(m[i].value, "\"i\": ") : NULL;
			int g = v != NULL ? atoi(v + 5) : -1;

			assert_true(g >= 0 && g <= 1000 && g != 500);
			seen[g]++;
		}
		for (int g = 0; g <= 1000; g++)
			if (g != 500 && (seen[g] < 1 || seen[g] > 2))
				fail_msg("row %d published %d times", g, seen[g]);
	}
	t_msgs_free(m, n);
	assert_true(t_log_count(&R, "the snapshot holds") >= 1);
	assert_int_equal(t_log_count(&R, "the snapshot starts again"), 0);
	assert_int_equal(t_relay_signal(&R, SIGTERM, 20000), 0);
}

/*
 * 4. A table without the polling columns (sql/001_outbox.sql alone): the
 * default filter takes every row, in created_at order (ctid for ties), as
 * check says beforehand.  The snapshot publishes each row once, numbered
 * in that order, then the stream follows; a restart finds the slot without its
 * marker and publishes nothing again (check says so too).
 */
static void
test_plain_table(void **state)
{
	struct t_msg *m;
	size_t n;
	uint64_t snap_lsn;
	long logged;
	PGresult *res;
	char out[8192];
	int lines;

	(void)state;
	t_relay_setup(&R, "snapplain", 0);
	/* the rows inserted last are the oldest by created_at, and rows updated and deleted move
	 * physical order further from either */
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload, created_at) "
	    "SELECT 'plain', 'k' || (g %% 3), 'T', jsonb_build_object('i', g), "
	    "CASE WHEN g < 150 THEN '2026-01-02' ELSE '2026-01-01' END::timestamptz "
	    "FROM generate_series(0, 299) g");
	t_exec(R.pg, "DELETE FROM outbox WHERE (payload->>'i')::int %% 10 = 0");
	t_exec(R.pg, "UPDATE outbox SET type = 'U' WHERE (payload->>'i')::int %% 7 = 0");
	t_relay_config(&R, "[source]\nsnapshot = pending\n");
	run_capture("check", R.conf, out, sizeof(out));
	if (strstr(out, "will publish the 270 row(s) WHERE true first, ORDER BY \"created_at\", ctid") == NULL)
		fail_msg("check does not say what the snapshot will publish:\n%s", out);
	t_relay_start(&R, NULL, 0);
	wait_streaming(&R, 30000);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'plain', 'k' || (g %% 3), 'S', jsonb_build_object('i', g) FROM generate_series(300, 309) g");
	assert_true(t_wait_confirmed_current(&R, 20000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 20000), 0);
	assert_int_equal(snapshot_line(&R, &snap_lsn, &logged), 1);
	assert_int_equal(logged, 270);

	n = t_consume_all(R.b.bootstrap, "outbox.event.plain", 15000, &m);
	assert_int_equal(n, 280);
	res = PQexec(R.pg, "SELECT id::text, type FROM outbox ORDER BY created_at, ctid");
	assert_int_equal(PQntuples(res), 280);
	for (int r = 0, ordinal = 0; r < PQntuples(res); r++) {
		const char *id = PQgetvalue(res, r, 0);
		const struct t_msg *hit = NULL;

		for (size_t i = 0; i < n; i++)
			if (strcmp(t_msg_header(&m[i], "id"), id) == 0) {
				if (hit != NULL)
					fail_msg("row %s published twice", id);
				hit = &m[i];
			}
		if (hit == NULL)
			fail_msg("row %s was never published", id);
		if (strcmp(PQgetvalue(res, r, 1), "S") == 0) {
			/* committed after the slot: streamed */
			assert_null(t_msg_header(hit, "snapshot"));
			assert_true(t_lsn(t_msg_header(hit, "lsn")) >= snap_lsn);
			continue;
		}
		if (t_msg_header(hit, "snapshot") == NULL || atoi(t_msg_header(hit, "seq")) != ordinal)
			fail_msg("row %s, number %d in (created_at, ctid) order: snapshot %s, seq %s", id, ordinal,
			    t_msg_header(hit, "snapshot") ? t_msg_header(hit, "snapshot") : "(none)",
			    t_msg_header(hit, "seq"));
		assert_string_equal(t_msg_header(hit, "type"), PQgetvalue(res, r, 1));
		ordinal++;
	}
	PQclear(res);
	t_msgs_free(m, n);

	/* the slot exists without its marker: no snapshot again, as check says */
	run_capture("check", R.conf, out, sizeof(out));
	if (strstr(out, "snapshot: pending, but slot ") == NULL ||
	    strstr(out, " exists: nothing is published before the stream") == NULL)
		fail_msg("check does not say that nothing precedes the stream:\n%s", out);
	lines = t_log_count(&R, "snapshot of slot");
	t_relay_start(&R, NULL, 1);
	assert_int_equal(t_relay_signal(&R, SIGTERM, 20000), 0);
	assert_int_equal(t_log_count(&R, "snapshot of slot"), lines);
	n = t_consume_all(R.b.bootstrap, "outbox.event.plain", 15000, &m);
	assert_int_equal(n, 280);
	t_msgs_free(m, n);
}

/*
 * 5. SIGTERM in the middle of the snapshot (a slow broker, each fetch of
 * rows waiting for it): outboxd stops soon with status 0, leaving the slot and the
 * marker; the next start publishes the pending rows again and streams.
 * Every row is in Kafka; only the rows published before the stop twice.
 */
static void
test_sigterm_during_snapshot(void **state)
{
	char marker[128];
	struct t_msg *m;
	size_t n, first;
	uint64_t snap_lsn;
	long logged;
	int64_t t0;
	int st;

	(void)state;
	t_relay_setup(&R, "snapterm", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'term', 'k' || (g %% 20), 'T', jsonb_build_object('i', g) FROM generate_series(1, 4000) g");
	snprintf(marker, sizeof(marker), "%s_snapshot", R.slot);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 500", b), 0);
	t_relay_config(&R, "[source]\nsnapshot = pending\n[delivery]\nmax_inflight = 50\n");
	t_relay_start(&R, NULL, 0);
	/* the snapshot is under way, far from its end: each fetch of 500 rows waits for the broker
	 * until at most max_inflight are outstanding, at least one round trip of 500 ms */
	/* the slot is created first: on a busy server that waits for its running transactions */
	t0 = t_now_ms() + 60000;
	while (t_log_count(&R, ": publishing the rows of public.outbox") == 0) {
		if (t_now_ms() > t0) {
			t_log_dump(&R);
			fail_msg("outboxd did not begin its snapshot");
		}
		usleep(20000);
	}
	usleep(2000000);
	t0 = t_now_ms();
	st = t_relay_signal(&R, SIGTERM, 15000);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		t_log_dump(&R);
		fail_msg("outboxd did not stop with status 0 on SIGTERM during the snapshot (wait status %d)", st);
	}
	print_message("stopped %lld ms after SIGTERM\n", (long long)(t_now_ms() - t0));
	assert_int_equal(snapshot_line(&R, &snap_lsn, &logged), 0);
	assert_int_equal(t_log_count(&R, "streaming from slot"), 0);
	assert_slot(R.slot, "logical");
	assert_slot(marker, "physical");
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);
	first = t_consume_all(R.b.bootstrap, "outbox.event.term", 5000, &m);
	t_msgs_free(m, first);
	assert_true(first < 4000);
	t_relay_start(&R, NULL, 0);
	wait_streaming(&R, 30000);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('term', 'k1', 'S', '{\"i\": 4001}')");
	assert_true(t_wait_confirmed_current(&R, 20000));
	assert_int_equal(t_relay_signal(&R, SIGTERM, 20000), 0);
	assert_int_equal(snapshot_line(&R, &snap_lsn, &logged), 1);
	assert_int_equal(logged, 4000);
	assert_slot(marker, "");
	n = t_consume_all(R.b.bootstrap, "outbox.event.term", 15000, &m);
	print_message("%zu record(s) before the stop, %zu in all for 4,001 rows\n", first, n);
	assert_int_equal(n, first + 4001);
	{
		PGresult *res = PQexec(R.pg, "SELECT id::text FROM outbox");

		for (int r = 0; r < PQntuples(res); r++) {
			size_t c = 0;

			for (size_t i = 0; i < n; i++)
				c += strcmp(t_msg_header(&m[i], "id"), PQgetvalue(res, r, 0)) == 0;
			if (c == 0)
				fail_msg("row %s was never published", PQgetvalue(res, r, 0));
		}
		PQclear(res);
	}
	t_msgs_free(m, n);
}

/*
 * 6. snapshot = pending where it cannot work: with polling mode and with
 * exactly-once delivery, check and run stop at the configuration with one
 * line naming the key and what it conflicts with, exit status 2, and
 * create no slot.  In logical mode alone the key is accepted (check gets
 * past the configuration), so the refusals are about the combinations.
 */
static void
test_snapshot_refused(void **state)
{
	static const struct {
		const char *conf, *names;
	} bad[] = {
		{ "[source]\nmode = poll\nsnapshot = pending\n", "mode" },
		{ "[source]\nsnapshot = pending\n[delivery]\nexactly_once = on\n", "exactly_once" },
	};
	char out[4096], *n;

	(void)state;
	t_relay_setup(&R, "snaprefused", 0);
	t_exec_file(R.pg, "sql/008_polling.sql");
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		const char *cmds[] = { "check", "run" };

		t_relay_config(&R, bad[i].conf);
		for (int c = 0; c < 2; c++) {
			const char *key;
			char *nl;

			assert_int_equal(run_capture(cmds[c], R.conf, out, sizeof(out)), 2);
			nl = strchr(out, '\n');
			key = strstr(out, "key 'snapshot'");
			if (key == NULL || strstr(key, bad[i].names) == NULL ||
			    strstr(out, "unknown key") != NULL || nl == NULL || nl[1] != '\0')
				fail_msg("%s with\n%swant one line naming key 'snapshot' and %s, got: %s", cmds[c],
				    bad[i].conf, bad[i].names, out);
		}
	}
	n = t_query1(R.pg, "SELECT count(*) FROM pg_replication_slots WHERE database = '%s'", R.db);
	assert_string_equal(n, "0");
	free(n);
	/* the key itself is known: logical mode takes it */
	t_relay_config(&R, "[source]\nsnapshot = pending\n");
	if (run_capture("check", R.conf, out, sizeof(out)) == 2 || strstr(out, "key 'snapshot'") != NULL)
		fail_msg("check refused snapshot = pending in logical mode: %s", out);
}

/*
 * 7. A snapshot_filter that tries to end the snapshot's read-only
 * transaction and run a statement of its own: the configuration refuses it
 * (check and run, exit status 2, one line naming the key), and when it
 * reaches the server anyway (a test hook puts it in place of the filter)
 * the server runs nothing of it: the snapshot's statement is one statement.
 * The table it drops is there after both.
 */
static void
test_filter_one_condition(void **state)
{
	static const char attack[] = "true); COMMIT; DROP TABLE victim; SELECT 1 FROM public.outbox "
	                             "WHERE (true";
	char conf[512], out[4096], *v;
	int st;

	(void)state;
	t_relay_setup(&R, "snapfilter", 0);
	t_exec(R.pg, "CREATE TABLE victim (i int)");
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('filter', 'k', 'T', '{}')");
	snprintf(conf, sizeof(conf), "[source]\nsnapshot = pending\nsnapshot_filter = %s\n", attack);
	t_relay_config(&R, conf);
	t_relay_start(&R, NULL, 0);
	st = t_wait(R.pid, 30000);
	if (st == -1)
		t_relay_signal(&R, SIGKILL, 5000);
	R.pid = 0;
	v = t_query1(R.pg, "SELECT count(*) FROM pg_class WHERE relname = 'victim'");
	assert_string_equal(v, "1");
	free(v);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 2 ||
	    t_log_count(&R, "key 'snapshot_filter': must be one SQL condition") != 1) {
		t_log_dump(&R);
		fail_msg("run did not stop at the filter (wait status %d)", st);
	}
	st = run_capture("check", R.conf, out, sizeof(out));
	if (st != 2 || strstr(out, "key 'snapshot_filter': must be one SQL condition, without ';'") == NULL)
		fail_msg("check took the filter (status %d): %s", st, out);

#ifdef OBX_TEST_HOOKS
	t_relay_config(&R, "[source]\nsnapshot = pending\n");
	setenv("OBX_TEST_SNAPSHOT_FILTER", attack, 1);
	t_relay_start(&R, NULL, 0);
	unsetenv("OBX_TEST_SNAPSHOT_FILTER");
	st = t_wait(R.pid, 30000);
	if (st == -1)
		t_relay_signal(&R, SIGKILL, 5000);
	R.pid = 0;
	v = t_query1(R.pg, "SELECT count(*) FROM pg_class WHERE relname = 'victim'");
	assert_string_equal(v, "1");
	free(v);
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) == 0 ||
	    t_log_count(&R, "cannot insert multiple commands into a prepared statement") == 0) {
		t_log_dump(&R);
		fail_msg("the server was not asked for one statement (wait status %d)", st);
	}
#endif
}

/* The long slot names of test_long_slot_names: 54 characters in common, then _a_001 or _b_001. */
static char long_prefix[64];

static int
long_names_teardown(void **state)
{
	/* markers have no database: the cluster-wide cleanup does not take them */
	if (R.pg != NULL && long_prefix[0] != '\0')
		PQclear(PQexec(R.pg,
		    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
		    "WHERE slot_type = 'physical' AND NOT active AND slot_name LIKE 'snaplong%'"));
	return teardown(state);
}

/* Runs r until it streams, then stops it; returns how many snapshot lines it logged. */
static int
run_to_stream(struct t_relay *r)
{
	uint64_t lsn;
	long n;
	int before = snapshot_line(r, &lsn, &n);

	/* waits for "streaming from slot" like t_relay_start, a new one in a log that has some */
	t_relay_start(r, NULL, 1);
	assert_int_equal(t_relay_signal(r, SIGTERM, 20000), 0);
	return snapshot_line(r, &lsn, &n) - before;
}

/*
 * 8. Two slots whose names (60 characters) share their first 54 have a
 * marker each: A's snapshot stops half-way, B's runs to its end and drops
 * its own marker, and A's next start still finds A's and publishes the
 * pending rows.  A marker an earlier version left under the old name (the
 * slot's first 54 characters) is A's when no other slot shares them: A
 * publishes its rows again and drops it; with B's slot there it may be B's:
 * A publishes again and leaves it.
 */
static void
test_long_slot_names(void **state)
{
	char slot_a[64], slot_b[64], mark_a[64], mark_b[64], legacy[64];
	struct t_relay B;
	struct t_msg *m;
	size_t n, first;
	int64_t t0;

	(void)state;
	t_relay_setup(&R, "snaplong", 0);
	snprintf(long_prefix, sizeof(long_prefix), "snaplong_%d_", (int)getpid());
	while (strlen(long_prefix) < 54)
		strcat(long_prefix, "x");
	snprintf(slot_a, sizeof(slot_a), "%.54s_a_001", long_prefix);
	snprintf(slot_b, sizeof(slot_b), "%.54s_b_001", long_prefix);
	obx_snapmark_name(slot_a, mark_a, sizeof(mark_a));
	obx_snapmark_name(slot_b, mark_b, sizeof(mark_b));
	assert_true(obx_snapmark_legacy_name(slot_a, legacy, sizeof(legacy)));
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'long', 'k' || (g %% 20), 'T', jsonb_build_object('i', g) "
	    "FROM generate_series(1, 4000) g");

	/* A's snapshot stops half-way: each fetch waits for a slow broker */
	snprintf(R.slot, sizeof(R.slot), "%s", slot_a);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 500", b), 0);
	t_relay_config(&R, "[source]\nsnapshot = pending\n[delivery]\nmax_inflight = 50\n");
	t_relay_start(&R, NULL, 0);
	/* the slot is created first: on a busy server that waits for its running transactions */
	t0 = t_now_ms() + 60000;
	while (t_log_count(&R, ": publishing the rows of public.outbox") == 0) {
		if (t_now_ms() > t0) {
			t_log_dump(&R);
			fail_msg("outboxd did not begin its snapshot");
		}
		usleep(20000);
	}
	usleep(1500000);
	assert_int_equal(t_relay_signal(&R, SIGTERM, 15000), 0);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);
	assert_slot(mark_a, "physical");
	first = t_consume_all(R.b.bootstrap, "outbox.event.long", 5000, &m);
	t_msgs_free(m, first);
	assert_true(first < 4000);

	/* B, to topics of its own, runs its snapshot to the end: its marker goes, A's stays */
	t_relay_twin(&R, &B, "b");
	snprintf(B.slot, sizeof(B.slot), "%s", slot_b);
	B.conf[0] = '\0';
	t_relay_config(&B, "[source]\nsnapshot = pending\n[outbox]\ntopic = b.${aggregatetype}\n");
	assert_int_equal(run_to_stream(&B), 1);
	assert_slot(mark_b, "");
	assert_slot(mark_a, "physical");

	/* A's next start publishes the pending rows, then drops its marker */
	assert_int_equal(run_to_stream(&R), 1);
	assert_slot(mark_a, "");
	n = t_consume_all(R.b.bootstrap, "outbox.event.long", 15000, &m);
	assert_int_equal(n, first + 4000);
	t_msgs_free(m, n);

	/* an earlier version's marker, B's slot gone: A's, published again and dropped */
	t_exec(R.pg, "SELECT pg_drop_replication_slot('%s')", slot_b);
	t_exec(R.pg, "SELECT pg_create_physical_replication_slot('%s')", legacy);
	assert_int_equal(run_to_stream(&R), 1);
	assert_slot(legacy, "");
	/* with B's slot there it may be B's: published again and left */
	t_exec(R.pg, "SELECT pg_create_physical_replication_slot('%s')", legacy);
	t_exec(R.pg, "SELECT pg_create_logical_replication_slot('%s', 'pgoutput')", slot_b);
	assert_int_equal(run_to_stream(&R), 1);
	assert_slot(legacy, "physical");
	assert_true(t_log_count(&R, "may be slot ") >= 1);
	n = t_consume_all(R.b.bootstrap, "outbox.event.long", 15000, &m);
	assert_int_equal(n, first + 3 * 4000);
	t_msgs_free(m, n);
	unlink(B.conf);
	t_relay_twin_stop(&B);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_snapshot_refused, teardown),
		cmocka_unit_test_teardown(test_handover_once, teardown),
		cmocka_unit_test_teardown(test_handover_kill9, teardown),
		cmocka_unit_test_teardown(test_standby_takes_over, teardown),
		cmocka_unit_test_teardown(test_plain_table, teardown),
		cmocka_unit_test_teardown(test_snapshot_memory_bound, teardown),
		cmocka_unit_test_teardown(test_missing_topic_during_snapshot, teardown),
		cmocka_unit_test_teardown(test_sigterm_during_snapshot, teardown),
		cmocka_unit_test_teardown(test_filter_one_condition, teardown),
		cmocka_unit_test_teardown(test_long_slot_names, long_names_teardown),
	};

	return T_RUN_TESTS(tests);
}
