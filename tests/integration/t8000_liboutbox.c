/*
 * liboutbox through outboxd and the test broker: the writer's contract, and
 * the three classic scenarios of the pattern.
 *   1 confirming an already confirmed order writes no event;
 *   2 broker down: the event is kept, published when it returns, and never
 *     again after more commits and a clean restart; the effect happens once;
 *   3 a message delivered twice has its effect once; a failing handler
 *     leaves no mark and the redelivery succeeds;
 *   4 a handler that swallows an SQL error and returns success: COMMIT
 *     rolls back, so the call fails, nothing is marked and the offset is
 *     not stored (the event comes again).
 * And delete_after deletes through the outbox's primary key index.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "outbox.h"

static struct t_relay R;
static outbox_writer *W;

static void
schema(void)
{
	const char *src = getenv("OBX_SOURCE_DIR");
	char cmd[2048];

	snprintf(cmd, sizeof(cmd),
	    "psql -X -q -v ON_ERROR_STOP=1 -h %s -p %s -U %s -d %s -f %s/sql/007_inbox.sql "
	    "-f %s/sql/demo/orders.sql -c 'ALTER TABLE outbox ADD COLUMN headers jsonb' "
	    "-c 'CREATE TABLE invoices (order_id bigint, amount numeric)' >/dev/null",
	    R.st.host, R.st.port, R.st.user, R.db, src, src);
	assert_int_equal(system(cmd), 0);
}

static int
setup(void **state)
{
	struct outbox_writer_config cfg;
	char err[512];

	(void)state;
	t_relay_setup(&R, "lib", 0);
	schema();
	t_relay_config(&R, "[outbox]\nheaders = headers\n");
	t_relay_start(&R, NULL, 1);
	outbox_writer_config_init(&cfg);
	cfg.col_headers = "headers";
	W = outbox_writer_new(R.pg, &cfg, err, sizeof(err));
	if (W == NULL)
		fail_msg("%s", err);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	outbox_writer_free(W);
	W = NULL;
	t_relay_teardown(&R);
	return 0;
}

/* The order service: confirm an order; an event only when the UPDATE changed a row. */
static int
confirm_order(long order_id, char *event_id, size_t idlen)
{
	char sql[256], payload[256], key[32], err[512];
	PGresult *r;
	int changed;

	t_exec(R.pg, "BEGIN");
	snprintf(sql, sizeof(sql),
	    "UPDATE orders SET status = 'confirmed', updated_at = now() "
	    "WHERE id = %ld AND status <> 'confirmed'",
	    order_id);
	r = PQexec(R.pg, sql);
	assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
	changed = strcmp(PQcmdTuples(r), "1") == 0;
	PQclear(r);
	if (changed) {
		struct outbox_event ev = { "order", key, "OrderConfirmed", payload, NULL, 1 };

		snprintf(key, sizeof(key), "%ld", order_id);
		snprintf(payload, sizeof(payload), "{\"orderId\": %ld}", order_id);
		if (outbox_write(W, &ev, event_id, idlen, err, sizeof(err)) != OUTBOX_OK)
			fail_msg("%s", err);
	}
	t_exec(R.pg, "COMMIT");
	return changed;
}

static long
new_order(void)
{
	char *v = t_query1(R.pg, "INSERT INTO orders (customer, total) VALUES ('c', 42.5) RETURNING id");
	long id = atol(v);

	free(v);
	return id;
}

static void
test_writer_contract(void **state)
{
	struct outbox_event ev = { "lib", "k1", "Created", "{\"a\": 1}", "{\"tenant\": \"t9\"}", 0 };
	char id[64], err[512], *n;
	struct t_msg *m;
	size_t cnt;

	(void)state;
	/* outside a transaction: refused, nothing written */
	assert_int_equal(outbox_write(W, &ev, id, sizeof(id), err, sizeof(err)), OUTBOX_ERR_NOT_IN_TRANSACTION);
	assert_non_null(strstr(err, "not inside a transaction block"));
	n = t_query1(R.pg, "SELECT count(*) FROM outbox");
	assert_string_equal(n, "0");
	free(n);

	t_exec(R.pg, "BEGIN");
	/* bad JSON: refused before anything reaches the server; the transaction goes on */
	ev.payload = "{not json";
	assert_int_equal(outbox_write(W, &ev, id, sizeof(id), err, sizeof(err)), OUTBOX_ERR_INVALID);
	assert_non_null(strstr(err, "payload is not valid JSON"));
	ev.payload = "{\"a\": 1}";
	ev.headers = "[1]";
	assert_int_equal(outbox_write(W, &ev, id, sizeof(id), err, sizeof(err)), OUTBOX_ERR_INVALID);
	assert_non_null(strstr(err, "headers must be a JSON object"));
	ev.headers = "{\"tenant\": \"t9\"}";
	assert_int_equal(outbox_write(W, &ev, id, sizeof(id), err, sizeof(err)), OUTBOX_OK);
	assert_int_equal(strlen(id), 36);
	t_exec(R.pg, "COMMIT");

	/* delete in the same transaction: the table stays empty, the event is published */
	{
		struct outbox_event ev2 = { "lib", "k2", "Deleted", "{\"b\": 2}", NULL, 1 };
		char id2[64];

		t_exec(R.pg, "BEGIN");
		assert_int_equal(outbox_write(W, &ev2, id2, sizeof(id2), err, sizeof(err)), OUTBOX_OK);
		t_exec(R.pg, "COMMIT");
		n = t_query1(R.pg, "SELECT count(*) FROM outbox WHERE id = '%s'", id2);
		assert_string_equal(n, "0");
		free(n);
		cnt = t_consume(R.b.bootstrap, "outbox.event.lib", 2, 15000, &m);
		assert_int_equal(cnt, 2);
		assert_string_equal(t_msg_header(&m[0], "id"), id);
		assert_string_equal(t_msg_header(&m[0], "tenant"), "t9");
		assert_string_equal(m[0].key, "k1");
		assert_string_equal(t_msg_header(&m[1], "id"), id2);
		t_msgs_free(m, cnt);
	}
}

static void
test_scenario1_already_confirmed_writes_nothing(void **state)
{
	long order = new_order();
	char id[64];
	struct t_msg *m;
	size_t n;

	(void)state;
	assert_int_equal(confirm_order(order, id, sizeof(id)), 1);
	assert_int_equal(confirm_order(order, id, sizeof(id)), 0); /* already confirmed */
	assert_int_equal(confirm_order(order, id, sizeof(id)), 0);
	assert_true(t_wait_confirmed_current(&R, 10000));
	n = t_consume_all(R.b.bootstrap, "outbox.event.order", 15000, &m);
	assert_int_equal(n, 1);
	t_msgs_free(m, n);
}

/* The billing consumer's effect: one invoice per confirmed order. */
static int
issue_invoice(PGconn *conn, const rd_kafka_message_t *msg, void *arg)
{
	char key[64], sql[256];
	PGresult *r;
	int *fail_next = arg;

	if (fail_next != NULL && *fail_next > 0) {
		(*fail_next)--;
		return -1;
	}
	snprintf(key, sizeof(key), "%.*s", (int)msg->key_len, (const char *)msg->key);
	snprintf(sql, sizeof(sql), "INSERT INTO invoices SELECT id, total FROM orders WHERE id = %ld", atol(key));
	r = PQexec(conn, sql);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return 0;
}

static rd_kafka_t *
group_consumer(const char *group, const char *topic)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_topic_partition_list_t *t;
	char err[512];
	rd_kafka_t *rk;

	rd_kafka_conf_set(conf, "bootstrap.servers", R.b.bootstrap, err, sizeof(err));
	rd_kafka_conf_set(conf, "group.id", group, err, sizeof(err));
	rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err));
	rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, sizeof(err));
	rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err));
	rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err));
	/* a member that vanished is noticed quickly when the next one joins */
	rd_kafka_conf_set(conf, "session.timeout.ms", "6000", err, sizeof(err));
	rd_kafka_conf_set(conf, "heartbeat.interval.ms", "500", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	assert_non_null(rk);
	rd_kafka_poll_set_consumer(rk);
	t = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(t, topic, RD_KAFKA_PARTITION_UA);
	assert_int_equal(rd_kafka_subscribe(rk, t), 0);
	rd_kafka_topic_partition_list_destroy(t);
	return rk;
}

static rd_kafka_message_t *
next_message(rd_kafka_t *rk, int timeout_ms)
{
	int64_t deadline = t_now_ms() + timeout_ms;

	while (t_now_ms() < deadline) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);

		if (m == NULL)
			continue;
		if (m->err == 0)
			return m;
		rd_kafka_message_destroy(m);
	}
	return NULL;
}

static void
close_consumer(rd_kafka_t *rk)
{
	rd_kafka_commit(rk, NULL, 0); /* commits what was stored */
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
}

static void
test_scenario2_broker_down(void **state)
{
	long order = new_order();
	char id[64], *n, err[512];
	struct t_msg *m;
	size_t cnt;
	rd_kafka_t *rk;
	rd_kafka_message_t *msg;
	outbox_consumer *c;
	int st;

	(void)state;
	/* the topic exists and the producer is warm */
	assert_int_equal(t_broker_cmd(&R.b, "topic outbox.event.order 4"), 0);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "down %d", b), 0);
	assert_int_equal(confirm_order(order, id, sizeof(id)), 1); /* the business commits regardless */
	sleep(2);
	n = t_query1(R.pg, "SELECT status FROM orders WHERE id = %ld", order);
	assert_string_equal(n, "confirmed");
	free(n);
	for (int b = 1; b <= 3; b++)
		assert_int_equal(t_broker_cmd(&R.b, "up %d", b), 0);
	assert_true(t_wait_confirmed_current(&R, 30000));

	/* later relay activity: more commits, a clean restart, more commits */
	confirm_order(new_order(), NULL, 0);
	st = t_relay_signal(&R, SIGTERM, 40000);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	t_relay_start(&R, NULL, 1);
	confirm_order(new_order(), NULL, 0);
	assert_true(t_wait_confirmed_current(&R, 15000));
	cnt = t_consume_all(R.b.bootstrap, "outbox.event.order", 15000, &m);
	{
		size_t seen = 0;

		for (size_t i = 0; i < cnt; i++)
			if (strcmp(t_msg_header(&m[i], "id"), id) == 0)
				seen++;
		assert_int_equal(seen, 1); /* published once, never again */
	}
	assert_int_equal(cnt, 3);
	t_msgs_free(m, cnt);

	/* the billing consumer: one invoice for the order */
	rk = group_consumer("billing-2", "outbox.event.order");
	c = outbox_consumer_new(R.pg, rk, "billing", NULL, err, sizeof(err));
	assert_non_null(c);
	for (int i = 0; i < 3; i++) {
		msg = next_message(rk, 15000);
		assert_non_null(msg);
		assert_int_equal(outbox_consume(c, msg, issue_invoice, NULL, err, sizeof(err)), OUTBOX_OK);
		rd_kafka_message_destroy(msg);
	}
	n = t_query1(R.pg, "SELECT count(*) FROM invoices WHERE order_id = %ld", order);
	assert_string_equal(n, "1");
	free(n);
	outbox_consumer_free(c);
	close_consumer(rk);
}

static void
test_scenario3_duplicates_and_failures(void **state)
{
	long order = new_order();
	char id[64], err[512], got[64], *n;
	rd_kafka_t *rk;
	rd_kafka_message_t *msg, *again;
	outbox_consumer *c;
	int fail_once = 1;
	int64_t offset;

	(void)state;
	assert_int_equal(confirm_order(order, id, sizeof(id)), 1);
	rk = group_consumer("billing-3", "outbox.event.order");
	c = outbox_consumer_new(R.pg, rk, "billing", NULL, err, sizeof(err));
	assert_non_null(c);

	/* a handler failure: rolled back, no mark, no invoice; the message comes again */
	msg = next_message(rk, 15000);
	assert_non_null(msg);
	assert_string_equal(outbox_header(msg, "id", got, sizeof(got)), id);
	assert_non_null(outbox_header(msg, "lsn", got, sizeof(got)));
	assert_string_equal(outbox_header(msg, "seq", got, sizeof(got)), "0");
	assert_string_equal(outbox_header(msg, "type", got, sizeof(got)), "OrderConfirmed");
	assert_null(outbox_header(msg, "no-such-header", got, sizeof(got)));
	offset = msg->offset;
	assert_int_equal(outbox_consume(c, msg, issue_invoice, &fail_once, err, sizeof(err)), OUTBOX_ERR_HANDLER);
	rd_kafka_message_destroy(msg);
	n = t_query1(R.pg, "SELECT count(*) FROM inbox WHERE message_id = '%s'", id);
	assert_string_equal(n, "0");
	free(n);
	n = t_query1(R.pg, "SELECT count(*) FROM invoices WHERE order_id = %ld", order);
	assert_string_equal(n, "0");
	free(n);
	msg = next_message(rk, 15000);
	assert_non_null(msg);
	assert_int_equal(msg->offset, offset); /* redelivered */
	assert_int_equal(outbox_consume(c, msg, issue_invoice, &fail_once, err, sizeof(err)), OUTBOX_OK);

	/* the same message again (at-least-once delivery): no second invoice */
	assert_int_equal(outbox_consume(c, msg, issue_invoice, NULL, err, sizeof(err)), OUTBOX_DUPLICATE);
	rd_kafka_message_destroy(msg);
	assert_int_equal(outbox_consume_id(c, id, issue_invoice, NULL, err, sizeof(err)), OUTBOX_DUPLICATE);
	n = t_query1(R.pg, "SELECT count(*) FROM invoices WHERE order_id = %ld", order);
	assert_string_equal(n, "1");
	free(n);
	close_consumer(rk);

	/* a crash between poll and processing redelivers: the offset was never stored */
	confirm_order(new_order(), id, sizeof(id));
	rk = group_consumer("billing-3", "outbox.event.order");
	outbox_consumer_free(c);
	c = outbox_consumer_new(R.pg, rk, "billing", NULL, err, sizeof(err));
	msg = next_message(rk, 30000);
	assert_non_null(msg);
	assert_string_equal(outbox_header(msg, "id", got, sizeof(got)), id);
	rd_kafka_message_destroy(msg); /* "crash": polled, never processed */
	close_consumer(rk);
	rk = group_consumer("billing-3", "outbox.event.order");
	again = next_message(rk, 30000);
	assert_non_null(again);
	assert_string_equal(outbox_header(again, "id", got, sizeof(got)), id);
	rd_kafka_message_destroy(again);
	close_consumer(rk);
	outbox_consumer_free(c);
}

/*
 * delete_after deletes by the primary key: the library's own prepared
 * DELETE (found in pg_prepared_statements of its session) plans an Index
 * Scan on the uuid key, even with sequential scans priced out, where a
 * comparison of id::text could only scan the table.
 */
static void
test_delete_after_uses_the_primary_key(void **state)
{
	struct outbox_event ev = { "lib", "k1", "Created", "{\"a\": 1}", NULL, 1 };
	char id[64], err[512], sql[256], *name;
	PGresult *r;
	int index_scan = 0, seq_scan = 0;

	(void)state;
	t_exec(R.pg, "BEGIN");
	assert_int_equal(outbox_write(W, &ev, id, sizeof(id), err, sizeof(err)), OUTBOX_OK);
	name = t_query1(R.pg, "SELECT name FROM pg_prepared_statements WHERE statement LIKE 'DELETE %%'");
	assert_true(name[0] != '\0');
	t_exec(R.pg, "SET LOCAL enable_seqscan = off");
	snprintf(sql, sizeof(sql), "EXPLAIN (COSTS OFF) EXECUTE \"%s\"('%s')", name, id);
	r = PQexec(R.pg, sql);
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	for (int i = 0; i < PQntuples(r); i++) {
		const char *line = PQgetvalue(r, i, 0);

		index_scan += strstr(line, "Index Scan using outbox_pkey on outbox") != NULL;
		seq_scan += strstr(line, "Seq Scan") != NULL;
		printf("# %s\n", line);
	}
	PQclear(r);
	free(name);
	t_exec(R.pg, "ROLLBACK");
	assert_int_equal(index_scan, 1);
	assert_int_equal(seq_scan, 0);
}

/*
 * A handler that does the effect, then runs a statement that fails,
 * swallows the error and reports success: the transaction is aborted.
 */
static int
invoice_and_swallow_sql_error(PGconn *conn, const rd_kafka_message_t *msg, void *arg)
{
	PGresult *r;

	if (issue_invoice(conn, msg, arg) != 0)
		return -1;
	r = PQexec(conn, "INSERT INTO no_such_table VALUES (1)");
	PQclear(r); /* the error is ignored */
	return 0;
}

/* A handler that issues the invoice, rolls the transaction back itself and reports success. */
static int
invoice_and_roll_back(PGconn *conn, const rd_kafka_message_t *msg, void *arg)
{
	PGresult *r;

	if (issue_invoice(conn, msg, arg) != 0)
		return -1;
	r = PQexec(conn, "ROLLBACK");
	PQclear(r);
	return 0;
}

/*
 * handler returns 0 but its transaction did not commit: outbox_consume
 * reports an error whose text holds needle, keeps neither the effect nor
 * the inbox row, and the group's next member gets the event again.
 */
static void
not_committed_is_an_error(outbox_handler handler, const char *group, const char *needle)
{
	long order = new_order();
	char id[64], err[512], got[64], *n;
	rd_kafka_t *rk;
	rd_kafka_message_t *msg;
	outbox_consumer *c;
	int64_t offset;
	int rc;

	assert_int_equal(confirm_order(order, id, sizeof(id)), 1);
	rk = group_consumer(group, "outbox.event.order");
	c = outbox_consumer_new(R.pg, rk, "billing", NULL, err, sizeof(err));
	assert_non_null(c);
	msg = next_message(rk, 15000);
	assert_non_null(msg);
	assert_string_equal(outbox_header(msg, "id", got, sizeof(got)), id);
	offset = msg->offset;

	/* COMMIT answered ROLLBACK: an error, not done */
	err[0] = '\0';
	rc = outbox_consume(c, msg, handler, NULL, err, sizeof(err));
	rd_kafka_message_destroy(msg);
	printf("# %s\n", err);
	assert_int_equal(rc, OUTBOX_ERR_DB);
	assert_non_null(strstr(err, needle));
	assert_int_equal(PQtransactionStatus(R.pg), PQTRANS_IDLE);
	n = t_query1(R.pg, "SELECT count(*) FROM inbox WHERE message_id = '%s'", id);
	assert_string_equal(n, "0");
	free(n);
	n = t_query1(R.pg, "SELECT count(*) FROM invoices WHERE order_id = %ld", order);
	assert_string_equal(n, "0");
	free(n);

	/* the offset was not stored: the group's next member gets the event again */
	close_consumer(rk);
	rk = group_consumer(group, "outbox.event.order");
	outbox_consumer_free(c);
	c = outbox_consumer_new(R.pg, rk, "billing", NULL, err, sizeof(err));
	assert_non_null(c);
	msg = next_message(rk, 30000);
	assert_non_null(msg);
	assert_int_equal(msg->offset, offset);
	assert_string_equal(outbox_header(msg, "id", got, sizeof(got)), id);
	assert_int_equal(outbox_consume(c, msg, issue_invoice, NULL, err, sizeof(err)), OUTBOX_OK);
	rd_kafka_message_destroy(msg);
	n = t_query1(R.pg, "SELECT count(*) FROM invoices WHERE order_id = %ld", order);
	assert_string_equal(n, "1");
	free(n);
	n = t_query1(R.pg, "SELECT count(*) FROM inbox WHERE message_id = '%s'", id);
	assert_string_equal(n, "1");
	free(n);
	outbox_consumer_free(c);
	close_consumer(rk);
}

static void
test_scenario4_swallowed_sql_error(void **state)
{
	(void)state;
	not_committed_is_an_error(invoice_and_swallow_sql_error, "billing-4", "COMMIT answered ROLLBACK");
}

static void
test_scenario5_handler_rolled_back(void **state)
{
	(void)state;
	not_committed_is_an_error(invoice_and_roll_back, "billing-5", "ended the transaction itself");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_writer_contract, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scenario1_already_confirmed_writes_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scenario2_broker_down, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scenario3_duplicates_and_failures, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scenario4_swallowed_sql_error, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scenario5_handler_rolled_back, setup, teardown),
		cmocka_unit_test_setup_teardown(test_delete_after_uses_the_primary_key, setup, teardown),
	};

	return T_RUN_TESTS(tests);
}
