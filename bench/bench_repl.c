/*
 * bench_repl - the server's own send rate, the throughput reference of
 * bench/run.py: the smallest logical replication client that does the
 * relay's reading and nothing else.
 *
 *   bench_repl CONNINFO SLOT PUBLICATION PROTO EVENTS
 *
 * Streams SLOT with pgoutput (proto_version PROTO, publication_names
 * PUBLICATION: what outboxd asks for), counts Insert messages, acknowledges
 * the received position to the server every 100 ms and when asked, and
 * stops at the Commit that follows the EVENTS-th Insert, after a last
 * status update.  Prints "events=... seconds=... events_per_s=...".  No
 * decoding beyond the message type, no copies, no broker: whatever outboxd
 * does on top of this is its own cost.
 */
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

/* PostgreSQL's epoch (2000-01-01) in Unix microseconds */
#define PG_EPOCH_US 946684800000000LL

static int64_t
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static double
mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t
get64(const char *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | (uint8_t)p[i];
	return v;
}

static void
put64(char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (char)(v >> (56 - 8 * i));
}

static void
die(PGconn *c, const char *what)
{
	fprintf(stderr, "bench_repl: %s: %s", what, c ? PQerrorMessage(c) : "\n");
	PQfinish(c);
	exit(1);
}

/* Standby status update: write = flush = apply = pos. */
static void
status(PGconn *c, uint64_t pos, int reply)
{
	char m[34];

	m[0] = 'r';
	put64(m + 1, pos);
	put64(m + 9, pos);
	put64(m + 17, pos);
	put64(m + 25, (uint64_t)(now_us() - PG_EPOCH_US));
	m[33] = (char)reply;
	if (PQputCopyData(c, m, sizeof(m)) <= 0 || PQflush(c) != 0)
		die(c, "could not send a status update");
}

int
main(int argc, char **argv)
{
	char ci[2048], sql[1024];
	long long want, inserts = 0;
	uint64_t received = 0;
	double t0, last_status;
	int done = 0;
	PGresult *res;
	PGconn *c;

	if (argc != 6) {
		fprintf(stderr, "usage: bench_repl CONNINFO SLOT PUBLICATION PROTO EVENTS\n");
		return 2;
	}
	want = atoll(argv[5]);
	t0 = mono_s();
	snprintf(ci, sizeof(ci), "%s replication=database", argv[1]);
	c = PQconnectdb(ci);
	if (PQstatus(c) != CONNECTION_OK)
		die(c, "could not connect");
	snprintf(sql, sizeof(sql),
	    "START_REPLICATION SLOT \"%s\" LOGICAL 0/0 (proto_version '%s', "
	    "publication_names '%s')",
	    argv[2], argv[4], argv[3]);
	res = PQexec(c, sql);
	if (PQresultStatus(res) != PGRES_COPY_BOTH)
		die(c, "could not start replication");
	PQclear(res);
	last_status = mono_s();
	while (!done) {
		char *buf = NULL;
		int len = PQgetCopyData(c, &buf, 1);

		if (len == 0) {
			struct pollfd pfd = { PQsocket(c), POLLIN, 0 };

			if (poll(&pfd, 1, 100) < 0 || PQconsumeInput(c) == 0)
				die(c, "could not read");
			continue;
		}
		if (len < 0)
			die(c, "the stream ended");
		if (buf[0] == 'w' && len >= 26) {
			uint64_t start = get64(buf + 1);
			char type = buf[25];

			if (start > received)
				received = start;
			if (type == 'I')
				inserts++;
			else if (type == 'C' && inserts >= want)
				done = 1;
		} else if (buf[0] == 'k' && len >= 18 && buf[17]) {
			status(c, received, 0);
			last_status = mono_s();
		}
		PQfreemem(buf);
		if (mono_s() - last_status >= 0.1) {
			status(c, received, 0);
			last_status = mono_s();
		}
	}
	status(c, received, 0);
	PQfinish(c);
	printf("events=%lld seconds=%.3f events_per_s=%.1f\n", inserts, mono_s() - t0,
	    (double)inserts / (mono_s() - t0));
	return 0;
}
