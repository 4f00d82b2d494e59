/*
 * Micro-benchmarks of the pure hot path, in seconds: the pgoutput decoder
 * (with the relation cache and the event builder, as the relay uses them)
 * on a fixture mix, and the ack tracker with 1e6 events outstanding.
 * Prints MB/s, messages/s and operations/s.  Figures, not pass/fail: the
 * machines are shared; compare runs on one machine.
 * A third run decodes the messages a real server emitted (the captured
 * fixtures of tests/fixtures/pgoutput: streaming, two-phase, every kind).
 *   bench_micro [seconds per benchmark, default 1] [fixture.hex ...]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "obx/core/acktrack.h"
#include "obx/core/config.h"
#include "obx/core/event.h"
#include "obx/core/pgoutput.h"
#include "obx/core/relcache.h"

#include "../tests/unit/fixture_file.h"

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct buf {
	uint8_t b[4096];
	size_t n;
};

static void
put(struct buf *w, const void *p, size_t n)
{
	memcpy(w->b + w->n, p, n);
	w->n += n;
}

static void
put32(struct buf *w, uint32_t v)
{
	uint8_t b[4] = { (uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v };

	put(w, b, 4);
}

static void
put16(struct buf *w, uint16_t v)
{
	uint8_t b[2] = { (uint8_t)(v >> 8), (uint8_t)v };

	put(w, b, 2);
}

static void
text(struct buf *w, const char *s)
{
	put(w, "t", 1);
	put32(w, (uint32_t)strlen(s));
	put(w, s, strlen(s));
}

static void
bench_decoder(double seconds)
{
	static const char *const names[] = { "id", "aggregatetype", "aggregateid", "type", "payload" };
	static const uint32_t oids[] = { 2950, 25, 25, 25, 3802 };
	struct buf rel = { .n = 0 }, ins = { .n = 0 }, beg = { .n = 0 }, com = { .n = 0 };
	char payload[301];
	struct obx_config cfg;
	struct obx_pgoutput dec;
	struct obx_relcache rc;
	struct obx_event_builder eb;
	struct obx_pgmsg m;
	struct obx_event ev;
	struct obx_txninfo txn = { 0x1000, 7, 0 };
	char errbuf[128];
	double t0, el;
	uint64_t msgs = 0, bytes = 0;

	memset(payload, 'x', 300);
	payload[0] = '{';
	payload[1] = '"';
	payload[2] = 'a';
	payload[3] = '"';
	payload[4] = ':';
	payload[5] = '"';
	payload[298] = '"';
	payload[299] = '}';
	payload[300] = '\0';
	put(&rel, "R", 1);
	put32(&rel, 16384);
	put(&rel, "public", 7);
	put(&rel, "outbox", 7);
	put(&rel, "d", 1);
	put16(&rel, 5);
	for (int i = 0; i < 5; i++) {
		put(&rel, "\0", 1);
		put(&rel, names[i], strlen(names[i]) + 1);
		put32(&rel, oids[i]);
		put32(&rel, 0xffffffff);
	}
	put(&ins, "I", 1);
	put32(&ins, 16384);
	put(&ins, "N", 1);
	put16(&ins, 5);
	text(&ins, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11");
	text(&ins, "order");
	text(&ins, "order-12345");
	text(&ins, "OrderCreated");
	text(&ins, payload);
	put(&beg, "B", 1);
	put32(&beg, 0);
	put32(&beg, 0x1000);
	put32(&beg, 0);
	put32(&beg, 0);
	put32(&beg, 7);
	put(&com, "C\0", 2);
	for (int i = 0; i < 6; i++)
		put32(&com, 0x1000);

	obx_config_init(&cfg);
	obx_pgoutput_init(&dec, 1);
	obx_relcache_init(&rc);
	if (obx_event_builder_init(&eb, &cfg) != 0 || obx_pgoutput_decode(&dec, rel.b, rel.n, &m) != 0 ||
	    obx_relcache_update(&rc, &m) != 0) {
		fprintf(stderr, "bench: set-up failed\n");
		exit(1);
	}
	t0 = now_s();
	do {
		/* the mix of workload a: Begin, one Insert, Commit */
		for (int i = 0; i < 1000; i++) {
			const struct obx_rel *r;

			if (obx_pgoutput_decode(&dec, beg.b, beg.n, &m) != 0 ||
			    obx_pgoutput_decode(&dec, ins.b, ins.n, &m) != 0)
				exit(1);
			r = obx_relcache_get(&rc, m.u.insert.relid);
			if (obx_event_build(&eb, r, &m.u.insert.tuple, &txn, 0, &ev, errbuf, sizeof(errbuf)) !=
			        0 ||
			    obx_pgoutput_decode(&dec, com.b, com.n, &m) != 0)
				exit(1);
			msgs += 3;
			bytes += beg.n + ins.n + com.n;
		}
		el = now_s() - t0;
	} while (el < seconds);
	printf("decoder+event builder: %.1f MB/s, %.0f messages/s, %.0f events/s (300-byte payloads)\n",
	    (double)bytes / el / 1e6, (double)msgs / el, (double)msgs / 3 / el);
	obx_event_builder_reset(&eb);
	obx_relcache_reset(&rc);
	obx_pgoutput_reset(&dec);
	obx_config_reset(&cfg);
}

static void
bench_acktrack(double seconds)
{
	const uint64_t n = 1000000;
	uint64_t *tickets = malloc(n * sizeof(*tickets));
	struct obx_acktrack a;
	double t0, el;
	uint64_t ops = 0;
	int rounds = 0;

	t0 = now_s();
	do {
		obx_ack_init(&a, 0);
		for (uint64_t i = 0; i < n; i++) {
			obx_ack_begin(&a);
			obx_ack_add_event(&a, &tickets[i]);
			obx_ack_commit(&a, (i + 1) * 16);
		}
		/* acks arrive out of order across partitions: every other one first */
		for (uint64_t i = 1; i < n; i += 2)
			obx_ack_ack(&a, tickets[i]);
		for (uint64_t i = 0; i < n; i += 2)
			obx_ack_ack(&a, tickets[i]);
		if (obx_ack_flushable(&a) != n * 16) {
			fprintf(stderr, "bench: ack tracker lost track\n");
			exit(1);
		}
		obx_ack_reset(&a);
		ops += 4 * n;
		rounds++;
		el = now_s() - t0;
	} while (el < seconds);
	printf("ack tracker: %.1f M operations/s with %llu events outstanding (%d rounds)\n",
	    (double)ops / el / 1e6, (unsigned long long)n, rounds);
	free(tickets);
}

/* Decodes the captured messages of path (protocol version from its name) over and over. */
static int
bench_fixtures(const char *path, double seconds)
{
	struct fx_msg *fx = NULL;
	long n = fx_load(path, &fx);
	struct obx_pgoutput dec;
	double t0, el;
	uint64_t bytes = 0, msgs = 0;
	int rounds = 0;

	if (n <= 0) {
		fprintf(stderr, "bench: could not read fixture %s\n", path);
		return 1;
	}
	obx_pgoutput_init(&dec, strstr(path, "-v3") != NULL ? 3 : 1);
	t0 = now_s();
	do {
		for (long i = 0; i < n; i++) {
			struct obx_pgmsg m;

			if (obx_pgoutput_decode(&dec, fx[i].data, fx[i].len, &m) != 0) {
				fprintf(stderr, "bench: %s message %ld does not decode\n", path, i);
				return 1;
			}
			bytes += fx[i].len;
		}
		msgs += (uint64_t)n;
		rounds++;
	} while ((el = now_s() - t0) < seconds);
	printf("decoder on %s: %.1f MB/s, %.0f messages/s (%ld captured messages, %d rounds)\n",
	    strrchr(path, '/') ? strrchr(path, '/') + 1 : path, (double)bytes / el / 1e6, (double)msgs / el, n,
	    rounds);
	obx_pgoutput_reset(&dec);
	fx_free(fx, n);
	return 0;
}

int
main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 1.0;
	int rc = 0;

	bench_decoder(seconds);
	bench_acktrack(seconds);
	for (int i = 2; i < argc; i++)
		rc |= bench_fixtures(argv[i], seconds);
	return rc;
}
