/*
 * The core relay against the real stack: what is published, what is not,
 * order, and what the slot confirms, with the broker down, outboxd killed,
 * and outboxd stopped.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "harness.h"

static struct t_relay R;
static char service_file[64]; /* test_service_file's, removed at teardown */

static int
teardown(void **state)
{
	(void)state;
	if (R.pid > 0)
		t_log_dump(&R);
	t_relay_teardown(&R);
	if (service_file[0] != '\0') {
		unlink(service_file);
		service_file[0] = '\0';
		unsetenv("PGSERVICEFILE");
	}
	return 0;
}

/* 1. One INSERT -> one record with the right topic, key, value bytes, headers and partition. */
static void
test_one_insert(void **state)
{
	struct t_msg *m;
	size_t n;
	char *id, *lsn_before, *xid;
	const char *payload = "{\"total\": 12.5, \"note\": \"caf\\u00e9 \\ud83d\\ude00\"}";
	char *stored;

	(void)state;
	t_relay_setup(&R, "one", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	lsn_before = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	t_exec(R.pg, "BEGIN");
	xid = t_query1(R.pg, "SELECT txid_current()::text");
	id = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('order', 'order-1', 'OrderCreated', '%s') RETURNING id",
	    payload);
	t_exec(R.pg, "COMMIT");
	stored = t_query1(R.pg, "SELECT payload::text FROM outbox WHERE id = '%s'", id);

	n = t_consume(R.b.bootstrap, "outbox.event.order", 1, 15000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	assert_string_equal(m[0].topic, "outbox.event.order");
	assert_string_equal(m[0].key, "order-1");
	assert_string_equal(m[0].value, stored); /* jsonb text exactly as the server renders it */
	assert_string_equal(t_msg_header(&m[0], "id"), id);
	assert_string_equal(t_msg_header(&m[0], "type"), "OrderCreated");
	assert_string_equal(t_msg_header(&m[0], "seq"), "0");
	assert_string_equal(t_msg_header(&m[0], "xid"), xid);
	assert_true(t_lsn(t_msg_header(&m[0], "lsn")) > t_lsn(lsn_before));
	assert_non_null(strstr(t_msg_header(&m[0], "commit_ts"), "Z"));
	/* the partition Kafka's Java client would pick for the key (murmur2) */
	assert_int_equal(m[0].partition, rd_kafka_msg_partitioner_murmur2(NULL, "order-1", 7, 4, NULL, NULL));
	t_msgs_free(m, n);

	/* the slot confirms past the event once it is acknowledged */
	assert_true(t_wait_confirmed_current(&R, 10000));
	free(id);
	free(stored);
	free(xid);
	free(lsn_before);
}

/*
 * A libpq service file (PGSERVICEFILE) holds the connection: two hosts, the
 * first refusing, target_session_attrs=read-write, and the database, which the
 * config's conninfo does not name.  That conninfo, one line of over 1,000
 * characters, adds TLS (preferred; the test server has none) with a CA path.
 * outboxd connects through the service and relays an event.
 */
static void
test_service_file(void **state)
{
	char svc[512], conf[4096], ca[1100];
	struct t_msg *m;
	size_t n, o;
	char *id;

	(void)state;
	t_relay_setup(&R, "svc", 0);
	snprintf(svc, sizeof(svc),
	    "# outboxd's database\n[obx_relay]\nhost=127.0.0.1,%s\nport=1,%s\n"
	    "target_session_attrs=read-write\nuser=%s\ndbname=%s\n",
	    R.st.host, R.st.port, R.st.user, R.db);
	t_write_file(service_file, sizeof(service_file), svc);
	setenv("PGSERVICEFILE", service_file, 1);
	o = (size_t)snprintf(ca, sizeof(ca), "/etc/outboxd/tls");
	for (; o < 1000; o += 10)
		memcpy(ca + o, "/subdir.d/", 11);
	snprintf(ca + o, sizeof(ca) - o, "ca.pem");
	t_relay_config(&R, NULL);
	snprintf(conf, sizeof(conf),
	    "[source]\nconninfo = service=obx_relay sslmode=prefer sslrootcert=%s "
	    "connect_timeout=5\nslot = %s\nstatus_interval = 1s\n[kafka]\nbootstrap.servers = %s\n"
	    "[metrics]\nlisten = 127.0.0.1:0\n[log]\nformat = text\nlevel = debug\n",
	    ca, R.slot, R.b.bootstrap);
	assert_true(strchr(strstr(conf, "conninfo"), '\n') - strstr(conf, "conninfo") > 1000);
	{
		FILE *fp = fopen(R.conf, "w");

		assert_non_null(fp);
		fputs(conf, fp);
		fclose(fp);
	}
	t_relay_start(&R, NULL, 1);
	id = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('svc', 'svc-1', 'Created', '{}') RETURNING id");
	n = t_consume(R.b.bootstrap, "outbox.event.svc", 1, 15000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	assert_string_equal(t_msg_header(&m[0], "id"), id);
	assert_string_equal(m[0].key, "svc-1");
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 10000));
	free(id);
}

/*
 * The default status_interval (10s) against a server whose wal_sender_timeout
 * is 10s (the test stack's): not a reason to refuse; status updates go out at
 * a third of the timeout, said once, and the connection survives a quiet spell
 * longer than the timeout.
 */
static void
test_default_status_interval_short_sender_timeout(void **state)
{
	struct t_msg *m;
	size_t n;
	int64_t quiet_until;
	char *pid_before, *pid_after;

	(void)state;
	t_relay_setup(&R, "sti", 0);
	t_relay_config(&R, NULL);
	setenv("OUTBOXD_SOURCE_STATUS_INTERVAL", "10s", 1);
	t_relay_start(&R, NULL, 1);
	unsetenv("OUTBOXD_SOURCE_STATUS_INTERVAL");
	assert_int_equal(t_log_count(&R,
	                     "status updates every 3333 ms: a third of the server's "
	                     "wal_sender_timeout (10000 ms), sooner than [source] status_interval (10000 ms)"),
	    1);
	pid_before = t_query1(R.pg, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '%s'",
	    R.slot);
	quiet_until = t_now_ms() + 12000;
	while (t_now_ms() < quiet_until)
		usleep(200000);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('sti', 'k', 'T', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.sti", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	assert_true(t_wait_confirmed_current(&R, 10000));
	pid_after = t_query1(R.pg, "SELECT active_pid::text FROM pg_replication_slots WHERE slot_name = '%s'",
	    R.slot);
	assert_string_equal(pid_before, pid_after); /* the same walsender: never timed out */
	assert_int_equal(t_log_count(&R, "retrying"), 0);
	free(pid_before);
	free(pid_after);
}

/* 2 and 3. Insert+delete in one transaction is published; a rollback is not. */
static void
test_deleted_published_rolled_back_not(void **state)
{
	struct t_msg *m;
	size_t n;
	char *kept, *rolled;

	(void)state;
	t_relay_setup(&R, "del", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg, "BEGIN");
	rolled = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('acct', 'a1', 'Opened', '{}') RETURNING id");
	t_exec(R.pg, "ROLLBACK");
	t_exec(R.pg, "BEGIN");
	kept = t_query1(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "VALUES ('acct', 'a1', 'Closed', '{\"n\": 2}') RETURNING id");
	t_exec(R.pg, "DELETE FROM outbox WHERE id = '%s'", kept);
	t_exec(R.pg, "COMMIT");
	{
		char *left = t_query1(R.pg, "SELECT count(*) FROM outbox");

		assert_string_equal(left, "0");
		free(left);
	}
	n = t_consume(R.b.bootstrap, "outbox.event.acct", 1, 15000, &m);
	assert_int_equal(n, 1);
	assert_int_equal(t_count_header(m, n, "id", kept), 1);
	assert_int_equal(t_count_header(m, n, "id", rolled), 0);
	assert_string_equal(m[0].value, "{\"n\": 2}");
	t_msgs_free(m, n);
	free(kept);
	free(rolled);
}

/* 9. Other column names through [outbox] mapping alone, bytea payload, extra headers. */
static void
test_other_column_names(void **state)
{
	struct t_msg *m;
	size_t n;

	(void)state;
	t_relay_setup(&R, "names", 1);
	t_exec(R.pg, "CREATE SCHEMA billing");
	t_exec(R.pg,
	    "CREATE TABLE billing.eventos (event_id bigserial PRIMARY KEY, aggregate_id text NOT NULL, "
	    "tipo text NOT NULL, cuerpo bytea, meta jsonb, origen text)");
	t_relay_config(&R,
	    "[source]\ntable = billing.eventos\n"
	    "[outbox]\nid = event_id\nkey = aggregate_id\ntype = tipo\npayload = cuerpo\n"
	    "topic = ${tipo}\nheaders = meta\nheader.source = origen\n");
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO billing.eventos (aggregate_id, tipo, cuerpo, meta, origen) VALUES "
	    "('inv-7', 'factura', '\\x00ff0102'::bytea, '{\"tenant\": \"acme\"}', 'erp')");
	n = t_consume(R.b.bootstrap, "factura", 1, 15000, &m);
	if (n != 1)
		t_log_dump(&R);
	assert_int_equal(n, 1);
	assert_string_equal(m[0].key, "inv-7");
	assert_int_equal(m[0].len, 4);
	assert_memory_equal(m[0].value, "\x00\xff\x01\x02", 4);
	assert_string_equal(t_msg_header(&m[0], "id"), "1");
	assert_string_equal(t_msg_header(&m[0], "type"), "factura");
	assert_string_equal(t_msg_header(&m[0], "tenant"), "acme");
	assert_string_equal(t_msg_header(&m[0], "source"), "erp");
	t_msgs_free(m, n);
}

/* 7. A quiet outbox on a busy database does not pin WAL. */
static void
test_quiet_outbox_follows_wal(void **state)
{
	char *end;
	int64_t t0, deadline;

	(void)state;
	t_relay_setup(&R, "quiet", 0);
	t_exec(R.pg, "CREATE TABLE busy (id serial, v text)");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t0 = t_now_ms();
	while (t_now_ms() - t0 < 3000)
		t_exec(R.pg, "INSERT INTO busy (v) SELECT repeat('x', 100) FROM generate_series(1, 50)");
	end = t_query1(R.pg, "SELECT pg_current_wal_lsn()");
	deadline = t_now_ms() + 3 * 1000 + 500; /* 3 status intervals (+ scheduling slack) */
	while (t_slot_confirmed(&R) < t_lsn(end) && t_now_ms() < deadline)
		usleep(50000);
	if (t_slot_confirmed(&R) < t_lsn(end))
		t_log_dump(&R);
	assert_true(t_slot_confirmed(&R) >= t_lsn(end));
	free(end);
}

/*
 * 8. SIGTERM with events in flight: exit 0, nothing lost, nothing acked re-sent after restart.
 * The transaction is large enough (and the broker slow enough) that the signal lands while it
 * is still being streamed: stopping inside it would leave acknowledged events unconfirmed.
 */
static void
test_sigterm_drains(void **state)
{
	struct t_msg *m;
	size_t n;
	int st;

	(void)state;
	t_relay_setup(&R, "term", 0);
	t_relay_config(&R, "[delivery]\nmax_inflight = 2000\n");
	t_relay_start(&R, NULL, 1);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 300", b), 0);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
	    "SELECT 'term', 'k' || (i %% 16), 'T', jsonb_build_object('i', i) FROM generate_series(1, 12000) i");
	usleep(300000);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(st != -1);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);
	n = t_consume_all(R.b.bootstrap, "outbox.event.term", 15000, &m);
	assert_int_equal(n, 12000);
	t_msgs_free(m, n);

	/* restart: one more event, and not one of the 12,000 again */
	t_relay_start(&R, NULL, 1);
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('term', 'k', 'T', '{}')");
	assert_true(t_wait_confirmed_current(&R, 15000));
	n = t_consume_all(R.b.bootstrap, "outbox.event.term", 15000, &m);
	assert_int_equal(n, 12001);
	t_msgs_free(m, n);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* 6. kill -9 mid-stream, restart: every committed event at least once; duplicates only above the confirmed LSN. */
static void
test_kill9_resends_unconfirmed(void **state)
{
	struct t_msg *m;
	size_t n;
	uint64_t confirmed;
	PGresult *res;
	char *total;

	(void)state;
	t_relay_setup(&R, "kill", 0);
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	/* a first batch that is acknowledged and confirmed before the kill */
	for (int i = 0; i < 20; i++)
		t_exec(R.pg,
		    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
		    "VALUES ('kill', 'early-%d', 'E', '{}')",
		    i);
	assert_true(t_wait_confirmed_current(&R, 10000));
	/* slow the broker so the COPY's events are still unacknowledged at the kill */
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 3000", b), 0);
	t_exec(R.pg, "BEGIN");
	res = PQexec(R.pg, "COPY outbox (aggregatetype, aggregateid, type, payload) FROM STDIN");
	assert_int_equal(PQresultStatus(res), PGRES_COPY_IN);
	PQclear(res);
	for (int i = 0; i < 1000; i++) {
		char line[128];
		int len = snprintf(line, sizeof(line), "kill\tcopy-%d\tC\t{\"i\": %d}\n", i % 37, i);

		assert_int_equal(PQputCopyData(R.pg, line, len), 1);
	}
	assert_int_equal(PQputCopyEnd(R.pg, NULL), 1);
	res = PQgetResult(R.pg);
	assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
	PQclear(res);
	while ((res = PQgetResult(R.pg)) != NULL)
		PQclear(res);
	t_exec(R.pg, "COMMIT");
	usleep(700000);
	assert_int_equal(t_relay_signal(&R, SIGKILL, 10000) != -1, 1);
	t_slot_wait_inactive(&R, 15000);
	confirmed = t_slot_confirmed(&R);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "rtt %d 0", b), 0);

	t_relay_start(&R, NULL, 1);
	total = t_query1(R.pg, "SELECT count(*) FROM outbox");
	assert_string_equal(total, "1020");
	free(total);
	assert_true(t_wait_confirmed_current(&R, 30000));
	n = t_consume_all(R.b.bootstrap, "outbox.event.kill", 20000, &m);
	assert_true(n >= 1020);
	res = PQexec(R.pg, "SELECT id::text FROM outbox");
	assert_int_equal(PQntuples(res), 1020);
	for (int i = 0; i < PQntuples(res); i++) {
		size_t c = t_count_header(m, n, "id", PQgetvalue(res, i, 0));

		if (c == 0)
			fail_msg("event %s was committed but never published", PQgetvalue(res, i, 0));
	}
	PQclear(res);
	/* duplicates only of events whose commit LSN is not below the confirmed LSN */
	{
		size_t dups = 0, copy_seen = 0;

		for (size_t i = 0; i < n; i++) {
			const char *id = t_msg_header(&m[i], "id");

			if (strncmp(m[i].key, "copy-", 5) == 0)
				copy_seen++;
			if (t_count_header(m, n, "id", id) > 1) {
				dups++;
				assert_true(t_lsn(t_msg_header(&m[i], "lsn")) >= confirmed);
				assert_int_equal(strncmp(m[i].key, "copy-", 5), 0);
			}
		}
		/* the COPY was not acknowledged before the kill: all 1,000 come again */
		assert_true(copy_seen >= 1000);
		print_message("kill -9: %zu records, %zu duplicate deliveries, confirmed %llX\n", n, dups,
		    (unsigned long long)confirmed);
	}
	t_msgs_free(m, n);
}

/* 5. Broker down while the application commits: nothing confirmed past the first unacked transaction. */
static void
test_broker_down(void **state)
{
	struct t_msg *m;
	size_t n;
	char *pid_before, *before_lsn = NULL;
	uint64_t max_confirmed = 0;
	int64_t t0;

	(void)state;
	t_relay_setup(&R, "down", 0);
	t_exec(R.pg, "CREATE TABLE busy (id serial, v text)");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	/* warm up: the topic exists and the producer knows the leaders */
	t_exec(R.pg,
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('down', 'w', 'W', '{}')");
	n = t_consume(R.b.bootstrap, "outbox.event.down", 1, 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
	pid_before = t_query1(R.pg, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '%s'", R.slot);

	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	t0 = t_now_ms();
	for (int i = 0; t_now_ms() - t0 < 25000; i++) {
		char *pid;
		uint64_t c;

		if (i == 0)
			before_lsn = t_exec_commit_bound(R.pg, NULL,
			    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
			    "VALUES ('down', 'k0', 'D', '{\"i\": 0}')");
		else
			t_exec(R.pg,
			    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) "
			    "VALUES ('down', 'k%d', 'D', '{\"i\": %d}')",
			    i % 5, i);
		t_exec(R.pg, "INSERT INTO busy (v) SELECT repeat('y', 200) FROM generate_series(1, 20)");
		c = t_slot_confirmed(&R);
		if (c > max_confirmed)
			max_confirmed = c;
		pid = t_query1(R.pg,
		    "SELECT coalesce(active_pid::text, 'none') FROM pg_replication_slots "
		    "WHERE slot_name = '%s'",
		    R.slot);
		assert_string_equal(pid, pid_before); /* same walsender: no timeout, no reconnect */
		free(pid);
		usleep(500000);
	}
	/* never past the first unacknowledged transaction, whose commit record follows before_lsn */
	assert_true(max_confirmed <= t_lsn(before_lsn));
	assert_int_equal(t_log_count(&R, "retrying"), 0);

	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	{
		char *cnt = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE aggregatetype = 'down'");
		size_t want = (size_t)atoi(cnt);

		n = t_consume(R.b.bootstrap, "outbox.event.down", want, 60000, &m);
		assert_true(n >= want);
		assert_true(t_wait_confirmed_current(&R, 15000));
		t_msgs_free(m, n);
		free(cnt);
	}
	free(pid_before);
	free(before_lsn);
}

/* 4. Concurrent writers: every event exactly once, per-key order = commit order (version oracle). */
static void
test_concurrent_writers_order(void **state)
{
	struct t_msg *m;
	size_t n, want;
	char s1[64], s2[64], cmd[2048], *cnt;
	PGresult *res;
	int rc;

	(void)state;
	t_relay_setup(&R, "conc", 0);
	t_exec(R.pg, "CREATE TABLE agg (id int PRIMARY KEY, version int NOT NULL)");
	t_exec(R.pg, "INSERT INTO agg SELECT g, 0 FROM generate_series(1, 50) g");
	t_relay_config(&R, NULL);
	t_relay_start(&R, NULL, 1);
	t_write_file(s1, sizeof(s1),
	    "\\set a random(1, 50)\n"
	    "BEGIN;\n"
	    "UPDATE agg SET version = version + 1 WHERE id = :a RETURNING version AS v \\gset\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('conc', :a, 'V', jsonb_build_object('version', :v));\n"
	    "COMMIT;\n");
	t_write_file(s2, sizeof(s2),
	    "\\set a random(1, 25)\n"
	    "\\set b random(26, 50)\n"
	    "BEGIN;\n"
	    "UPDATE agg SET version = version + 1 WHERE id = :a RETURNING version AS va \\gset\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('conc', :a, 'V', jsonb_build_object('version', :va));\n"
	    "UPDATE agg SET version = version + 1 WHERE id = :b RETURNING version AS vb \\gset\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('conc', :b, 'V', jsonb_build_object('version', :vb));\n"
	    "UPDATE agg SET version = version + 1 WHERE id = :a RETURNING version AS vc \\gset\n"
	    "INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('conc', :a, 'V', jsonb_build_object('version', :vc));\n"
	    "COMMIT;\n");
	snprintf(cmd, sizeof(cmd),
	    "%s/pgbench -n -h %s -p %s -U %s -c 8 -j 2 -t 500 -f %s@3 -f %s@1 %s "
	    ">/dev/null 2>&1",
	    R.st.pgbin, R.st.host, R.st.port, R.st.user, s1, s2, R.db);
	rc = system(cmd);
	assert_int_equal(rc, 0);
	unlink(s1);
	unlink(s2);
	cnt = t_query1(R.pg, "SELECT count(*) FROM outbox");
	want = (size_t)atoi(cnt);
	free(cnt);
	assert_true(want >= 5000);
	n = t_consume(R.b.bootstrap, "outbox.event.conc", want, 60000, &m);
	assert_int_equal(n, want);
	/* every id exactly once */
	res = PQexec(R.pg, "SELECT id::text FROM outbox ORDER BY id");
	{
		char **ids = calloc(n, sizeof(char *));

		for (size_t i = 0; i < n; i++)
			ids[i] = (char *)t_msg_header(&m[i], "id");
		qsort(ids, n, sizeof(char *), t_cmp_str);
		for (size_t i = 0; i < n; i++)
			assert_string_equal(ids[i], PQgetvalue(res, (int)i, 0));
		free(ids);
	}
	PQclear(res);
	/* per key, versions strictly increase by one in the partition's order */
	{
		int last[51] = { 0 };

		for (size_t i = 0; i < n; i++) {
			int key = atoi(m[i].key);
			const char *v = strstr(m[i].value, "\"version\": ");
			int ver = v ? atoi(v + 11) : -1;

			assert_true(key >= 1 && key <= 50);
			if (ver != last[key] + 1)
				fail_msg("key %d: version %d after %d", key, ver, last[key]);
			last[key] = ver;
		}
	}
	t_msgs_free(m, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_teardown(test_one_insert, teardown),
		cmocka_unit_test_teardown(test_service_file, teardown),
		cmocka_unit_test_teardown(test_default_status_interval_short_sender_timeout, teardown),
		cmocka_unit_test_teardown(test_deleted_published_rolled_back_not, teardown),
		cmocka_unit_test_teardown(test_other_column_names, teardown),
		cmocka_unit_test_teardown(test_quiet_outbox_follows_wal, teardown),
		cmocka_unit_test_teardown(test_sigterm_drains, teardown),
		cmocka_unit_test_teardown(test_kill9_resends_unconfirmed, teardown),
		cmocka_unit_test_teardown(test_concurrent_writers_order, teardown),
		cmocka_unit_test_teardown(test_broker_down, teardown),
	};

	return T_RUN_TESTS(tests);
}
