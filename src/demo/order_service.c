/*
 * The demo's order service, written with liboutbox: it creates orders and
 * confirms them.  Confirming changes the order and writes an OrderConfirmed
 * event in ONE transaction (the outbox row is deleted again in that
 * transaction; outboxd publishes it from the WAL).  Confirming an order
 * that is already confirmed changes no row and writes no event.
 *
 *   order_service CONNINFO COUNT
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "outbox.h"

static int
exec_ok(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;

	if (!ok)
		fprintf(stderr, "order_service: %s: %s", sql, PQresultErrorMessage(r));
	PQclear(r);
	return ok;
}

/* Returns 1 when the order was confirmed now, 0 when it already was, -1 on error. */
static int
confirm(PGconn *c, outbox_writer *w, const char *order_id)
{
	const char *p[1] = { order_id };
	char payload[256], event_id[64], err[512];
	struct outbox_event ev = { "order", order_id, "OrderConfirmed", payload, NULL, 1 };
	PGresult *r;
	int changed;

	if (!exec_ok(c, "BEGIN"))
		return -1;
	r = PQexecParams(c,
	    "UPDATE orders SET status = 'confirmed', updated_at = now() "
	    "WHERE id = $1 AND status <> 'confirmed' RETURNING customer, total",
	    1, NULL, p, NULL, NULL, 0);
	if (PQresultStatus(r) != PGRES_TUPLES_OK) {
		fprintf(stderr, "order_service: %s", PQresultErrorMessage(r));
		PQclear(r);
		exec_ok(c, "ROLLBACK");
		return -1;
	}
	changed = PQntuples(r) == 1;
	if (changed)
		snprintf(payload, sizeof(payload), "{\"orderId\": %s, \"customer\": \"%s\", \"total\": %s}",
		    order_id, PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
	PQclear(r);
	if (changed && outbox_write(w, &ev, event_id, sizeof(event_id), err, sizeof(err)) != OUTBOX_OK) {
		fprintf(stderr, "order_service: %s\n", err);
		exec_ok(c, "ROLLBACK");
		return -1;
	}
	if (!exec_ok(c, "COMMIT"))
		return -1;
	if (changed)
		printf("   order_service| confirmed order %s (event %s)\n", order_id, event_id);
	else
		printf("   order_service| order %s was already confirmed: no event\n", order_id);
	return changed;
}

int
main(int argc, char **argv)
{
	struct outbox_writer_config cfg;
	outbox_writer *w;
	char err[512];
	PGconn *c;
	char *end;
	long n;
	int rc = 0;

	if (argc != 3) {
		fprintf(stderr, "usage: order_service CONNINFO COUNT\n");
		return 2;
	}
	errno = 0;
	n = strtol(argv[2], &end, 10);
	if (end == argv[2] || *end != '\0' || errno != 0 || n < 0 || n > INT_MAX) {
		fprintf(stderr, "order_service: COUNT must be a number from 0 to %d\n", INT_MAX);
		return 2;
	}
	c = PQconnectdb(argv[1]);
	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "order_service: %s", PQerrorMessage(c));
		return 1;
	}
	outbox_writer_config_init(&cfg);
	w = outbox_writer_new(c, &cfg, err, sizeof(err));
	if (w == NULL) {
		fprintf(stderr, "order_service: %s\n", err);
		return 1;
	}
	for (int i = 0; i < n && rc == 0; i++) {
		PGresult *r = PQexec(c,
		    "INSERT INTO orders (customer, total) "
		    "VALUES ('customer-' || (random() * 1000)::int, round((random() * 100)::numeric, 2)) RETURNING id");
		char id[32];

		if (PQresultStatus(r) != PGRES_TUPLES_OK) {
			fprintf(stderr, "order_service: %s", PQresultErrorMessage(r));
			PQclear(r);
			rc = 1;
			break;
		}
		snprintf(id, sizeof(id), "%s", PQgetvalue(r, 0, 0));
		PQclear(r);
		if (confirm(c, w, id) < 0)
			rc = 1;
		/* a retried request confirms the same order again: no second event */
		if (i == 0 && confirm(c, w, id) < 0)
			rc = 1;
	}
	outbox_writer_free(w);
	PQfinish(c);
	return rc;
}
