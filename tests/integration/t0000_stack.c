/*
 * The test stack itself: the PostgreSQL fixture is logical-replication
 * ready, a logical slot can be created with pgoutput, and the test broker
 * accepts produce/consume from librdkafka and kcat and obeys fault commands.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "harness.h"

static void
test_postgres_ready_for_logical_replication(void **state)
{
	struct t_stack st;
	char db[64];
	PGconn *c;
	char *v;

	(void)state;
	t_stack_load(&st);
	t_create_db(&st, "stack", db, sizeof(db));
	c = t_pg(&st, db, 0);
	v = t_query1(c, "SHOW wal_level");
	assert_string_equal(v, "logical");
	free(v);
	v = t_query1(c, "SHOW wal_sender_timeout");
	assert_string_equal(v, "10s");
	free(v);
	v = t_query1(c,
	    "SELECT current_setting('max_replication_slots')::int >= 10 "
	    "AND current_setting('max_wal_senders')::int >= 10");
	assert_string_equal(v, "t");
	free(v);

	t_exec(c, "CREATE TABLE t (id int)");
	t_exec(c, "CREATE PUBLICATION p FOR TABLE t");
	t_exec(c, "SELECT pg_create_logical_replication_slot('stack_slot', 'pgoutput')");
	t_exec(c, "INSERT INTO t VALUES (1)");
	/* the slot decodes the insert through pgoutput */
	v = t_query1(c,
	    "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('stack_slot', NULL, NULL, "
	    "'proto_version', '1', 'publication_names', 'p') WHERE substr(data, 1, 1) = 'I'");
	assert_string_equal(v, "1");
	free(v);
	t_exec(c, "SELECT pg_drop_replication_slot('stack_slot')");
	PQfinish(c);

	/* a replication connection answers IDENTIFY_SYSTEM */
	c = t_pg(&st, db, 1);
	{
		PGresult *r = PQexec(c, "IDENTIFY_SYSTEM");

		assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
		assert_string_equal(PQgetvalue(r, 0, 3), db);
		PQclear(r);
	}
	PQfinish(c);
}

static void
produce(const char *bootstrap, const char *topic, int n)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char err[512];
	rd_kafka_t *rk;

	rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap, err, sizeof(err));
	rd_kafka_conf_set(conf, "enable.idempotence", "true", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	assert_non_null(rk);
	for (int i = 0; i < n; i++) {
		char key[16], val[32];

		snprintf(key, sizeof(key), "k%d", i % 5);
		snprintf(val, sizeof(val), "value-%d", i);
		assert_int_equal(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_KEY(key, strlen(key)),
		                     RD_KAFKA_V_VALUE(val, strlen(val)), RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
		                     RD_KAFKA_V_HEADER("id", val, (ssize_t)strlen(val)), RD_KAFKA_V_END),
		    0);
	}
	assert_int_equal(rd_kafka_flush(rk, 20000), 0);
	rd_kafka_destroy(rk);
}

static void
test_broker_produce_consume_and_faults(void **state)
{
	struct t_broker b;
	struct t_msg *msgs;
	size_t n;
	int seen[100] = { 0 };

	(void)state;
	t_broker_start(&b, 3);
	assert_int_equal(t_broker_cmd(&b, "topic stack.t 4"), 0);
	produce(b.bootstrap, "stack.t", 100);
	n = t_consume(b.bootstrap, "stack.t", 100, 10000, &msgs);
	assert_int_equal(n, 100);
	for (size_t i = 0; i < n; i++) {
		int v = atoi(msgs[i].value + 6);

		assert_true(v >= 0 && v < 100);
		seen[v]++;
		assert_string_equal(t_msg_header(&msgs[i], "id"), msgs[i].value);
	}
	for (int i = 0; i < 100; i++)
		assert_int_equal(seen[i], 1);
	t_msgs_free(msgs, n);

	/* fault commands are accepted, bad ones refused */
	assert_int_equal(t_broker_cmd(&b, "rtt 1 50"), 0);
	assert_int_equal(t_broker_cmd(&b, "produce-errors 2 NOT_ENOUGH_REPLICAS"), 0);
	assert_int_equal(t_broker_cmd(&b, "down 2"), 0);
	assert_int_equal(t_broker_cmd(&b, "up 2"), 0);
	assert_int_equal(t_broker_cmd(&b, "clear"), 0);
	assert_int_not_equal(t_broker_cmd(&b, "down 9"), 0);
	assert_int_not_equal(t_broker_cmd(&b, "produce-errors 1 NO_SUCH_ERROR"), 0);
	assert_int_not_equal(t_broker_cmd(&b, "frobnicate"), 0);

	/* retriable produce errors are retried through by an idempotent producer */
	assert_int_equal(t_broker_cmd(&b, "produce-errors 3 NOT_ENOUGH_REPLICAS"), 0);
	produce(b.bootstrap, "stack.u", 10);
	n = t_consume(b.bootstrap, "stack.u", 10, 10000, &msgs);
	assert_int_equal(n, 10);
	t_msgs_free(msgs, n);

	{
		pid_t pid = b.pid;

		t_broker_stop(&b);
		assert_int_equal(kill(pid, 0), -1); /* reaped, gone */
	}
}

static void
test_kcat_talks_to_the_broker(void **state)
{
	struct t_broker b;
	char cmd[3072], out[256];
	FILE *p;
	int lines = 0;

	(void)state;
	t_broker_start(&b, 1);
	assert_int_equal(t_broker_cmd(&b, "topic kcat.t 1"), 0);
	snprintf(cmd, sizeof(cmd),
	    "printf 'a\\nb\\nc\\n' | kcat -q -b %s -P -t kcat.t && kcat -q -b %s -C -t kcat.t -e -o beginning",
	    b.bootstrap, b.bootstrap);
	p = popen(cmd, "r");
	assert_non_null(p);
	while (fgets(out, sizeof(out), p) != NULL) {
		assert_true(strcmp(out, "a\n") == 0 || strcmp(out, "b\n") == 0 || strcmp(out, "c\n") == 0);
		lines++;
	}
	assert_int_equal(WEXITSTATUS(pclose(p)), 0);
	assert_int_equal(lines, 3);
	t_broker_stop(&b);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_postgres_ready_for_logical_replication),
		cmocka_unit_test(test_broker_produce_consume_and_faults),
		cmocka_unit_test(test_kcat_talks_to_the_broker),
	};

	return T_RUN_TESTS(tests);
}
