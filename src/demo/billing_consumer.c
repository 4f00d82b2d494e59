/*
 * The demo's billing consumer, written with liboutbox: one invoice per
 * confirmed order, through the inbox, so a message delivered twice has its
 * effect once.  With --duplicate it handles every message twice, as a
 * broker redelivery after a lost offset commit would.
 *
 *   billing_consumer CONNINFO BOOTSTRAP GROUP WANT_INVOICES [--duplicate]
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "outbox.h"

static int
issue_invoice(PGconn *conn, const rd_kafka_message_t *msg, void *arg)
{
	char key[64];
	const char *p[1] = { key };
	PGresult *r;

	(void)arg;
	snprintf(key, sizeof(key), "%.*s", (int)msg->key_len, (const char *)msg->key);
	r = PQexecParams(conn,
	    "INSERT INTO invoices (order_id, amount) SELECT id, total FROM orders WHERE id = $1::bigint", 1, NULL,
	    p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_COMMAND_OK) {
		fprintf(stderr, "billing_consumer: %s", PQresultErrorMessage(r));
		PQclear(r);
		return -1;
	}
	PQclear(r);
	return 0;
}

static long
invoices(PGconn *c)
{
	PGresult *r = PQexec(c, "SELECT count(*) FROM invoices");
	const char *s = PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "";
	char *end;
	long n;

	errno = 0;
	n = strtol(s, &end, 10);
	if (end == s || *end != '\0' || errno != 0)
		n = -1;

	PQclear(r);
	return n;
}

int
main(int argc, char **argv)
{
	rd_kafka_topic_partition_list_t *topics;
	rd_kafka_conf_t *conf;
	outbox_consumer *oc;
	rd_kafka_t *rk;
	char err[512];
	PGconn *c;
	long want;
	char *end;
	int duplicate;
	time_t deadline = time(NULL) + 60;

	if (argc < 5) {
		fprintf(stderr, "usage: billing_consumer CONNINFO BOOTSTRAP GROUP WANT_INVOICES [--duplicate]\n");
		return 2;
	}
	errno = 0;
	want = strtol(argv[4], &end, 10);
	if (end == argv[4] || *end != '\0' || errno != 0 || want < 0) {
		fprintf(stderr, "billing_consumer: WANT_INVOICES must be a number\n");
		return 2;
	}
	duplicate = argc > 5 && strcmp(argv[5], "--duplicate") == 0;
	c = PQconnectdb(argv[1]);
	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "billing_consumer: %s", PQerrorMessage(c));
		return 1;
	}
	conf = rd_kafka_conf_new();
	rd_kafka_conf_set(conf, "bootstrap.servers", argv[2], err, sizeof(err));
	rd_kafka_conf_set(conf, "group.id", argv[3], err, sizeof(err));
	rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err));
	/* the offset is stored by liboutbox only after the inbox transaction committed */
	rd_kafka_conf_set(conf, "enable.auto.offset.store", "false", err, sizeof(err));
	rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err));
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
	if (rk == NULL) {
		fprintf(stderr, "billing_consumer: %s\n", err);
		return 1;
	}
	rd_kafka_poll_set_consumer(rk);
	topics = rd_kafka_topic_partition_list_new(1);
	rd_kafka_topic_partition_list_add(topics, "outbox.event.order", RD_KAFKA_PARTITION_UA);
	rd_kafka_subscribe(rk, topics);
	rd_kafka_topic_partition_list_destroy(topics);
	oc = outbox_consumer_new(c, rk, "billing", NULL, err, sizeof(err));
	if (oc == NULL) {
		fprintf(stderr, "billing_consumer: %s\n", err);
		return 1;
	}
	while (invoices(c) < want && time(NULL) < deadline) {
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 500);
		char id[64] = "";
		int rounds = duplicate ? 2 : 1;

		if (m == NULL)
			continue;
		if (m->err) {
			rd_kafka_message_destroy(m);
			continue;
		}
		outbox_header(m, "id", id, sizeof(id));
		for (int i = 0; i < rounds; i++) {
			int rc = outbox_consume(oc, m, issue_invoice, NULL, err, sizeof(err));

			printf("   billing| order %.*s event %s: %s\n", (int)m->key_len, (const char *)m->key, id,
			    rc == OUTBOX_OK            ? "invoice issued" :
			        rc == OUTBOX_DUPLICATE ? "duplicate delivery, skipped" :
			                                 err);
		}
		rd_kafka_message_destroy(m);
	}
	rd_kafka_commit(rk, NULL, 0);
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	outbox_consumer_free(oc);
	{
		long got = invoices(c);

		PQfinish(c);
		if (got < want) {
			fprintf(stderr, "billing_consumer: %ld invoice(s), expected %ld\n", got, want);
			return 1;
		}
	}
	return 0;
}
