/*
 * poll.c - the loop of "outboxd run" in polling mode ([source] mode = poll):
 * one claimed batch (produce, delivery reports, the wait).  The cycle it
 * serves is docs/internals/design.md, "Polling mode".
 *
 * poll_mark.c records and marks the batch's rows; poll_session.c runs the
 * connections and the process.  pollcore.c (pure) decides each row's fate, what a delivery report does,
 * when the wait ends and what is marked; pollsql.c holds the SQL; this file performs it with libpq
 * and librdkafka.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/pg/util.h"
#include "obx/run/poll_int.h"
#include "obx/core/relaycore.h"
#include "obx/core/walmsg.h"

#define SLOW_ACK_MS 5000

/* ---- the delivery policy's actions (delivery.h), and what its outcomes do to a row ---- */

static enum obx_produce_result
poll_produce(void *ctx, const struct obx_record *rec, uint64_t opaque, char *errbuf, size_t errlen)
{
	struct poller *p = ctx;
	enum obx_produce_result res;
	const char *name;
	char text[512];

#ifdef OBX_TEST_HOOKS
	/* test builds only: a producer fatal error raised before the Nth produce call of the process
	 * (OBX_TEST_FATAL_BEFORE), so that the call meets it with nothing in flight */
	if (p->test_fatal_before > 0 && ++p->test_produced == p->test_fatal_before) {
		obx_log_warn("test hook: raising a producer fatal error");
		rd_kafka_test_fatal_error(p->kf.rk, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, "test hook");
	}
#endif
	res = obx_kafka_produce(&p->kf, rec->topic, RD_KAFKA_PARTITION_UA, rec->key, rec->keylen, rec->value,
	    rec->len, rec->timestamp_ms, rec->headers, rec->nheaders, NULL, NULL, opaque, &name, text,
	    sizeof(text));
	if (res != OBX_PRODUCE_OK && res != OBX_PRODUCE_QUEUE_FULL) {
		obx_metrics_kafka_error(&p->m, name);
		snprintf(errbuf, errlen, "%s: %s", name, text);
	}
	return res;
}

static void
poll_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	(void)ctx;
	obx_log_f(level, f, "%s", line);
}

/*
 * Before each produce: a record that waited in the pending queue behind a
 * row of its key that failed meanwhile stays pending (per-key order).
 */
static enum obx_dlv_gate
poll_gate(void *ctx, const struct obx_record *rec, uint64_t ticket, bool dl, char *errbuf, size_t errlen)
{
	struct poller *p = ctx;

	(void)rec, (void)errbuf, (void)errlen;
	if (dl || !obx_pollcore_key_held(&p->pc, (size_t)ticket))
		return OBX_DLV_GATE_SEND;
	obx_pollcore_unsent(&p->pc, (size_t)ticket);
	return OBX_DLV_GATE_SETTLED;
}

const struct obx_delivery_ops obx_poll_dlv_ops = { poll_gate, poll_produce, NULL, poll_note };

/* A row's record (or its copy) acknowledged, as pollcore counts it. */
static void
acked(struct poller *p, uint64_t opaque)
{
	switch (obx_pollcore_report(&p->pc, opaque, NULL, NULL)) {
	case OBX_POLL_REPORT_DEAD_LETTERED:
		p->m.events_dead_lettered++;
		break;
	case OBX_POLL_REPORT_ACKED:
		obx_metrics_published(&p->m, p->m.events_published + 1, obx_unix_seconds());
		break;
	default:
		return; /* an abandoned batch's report */
	}
#ifdef OBX_TEST_HOOKS
	if (p->test_kill_after > 0 && ++p->test_acks == p->test_kill_after) {
		obx_log_info("test hook: killing myself after %ld acknowledgement(s)", p->test_acks);
		raise(SIGKILL);
	}
#endif
}

/*
 * What an outcome of the delivery policy does to row res->ticket: with the
 * producer, waiting for its topic (pending, no attempt), or failed (an
 * attempt).  in_flight: the row was counted in flight already (a report,
 * a pending record produced later).  Returns 0 or OBX_ENOMEM.
 */
static int
delivered(struct poller *p, enum obx_dlv_outcome o, const struct obx_dlv_result *res, bool in_flight,
    const char *err_name)
{
	size_t i = (size_t)res->ticket;
	uint64_t opaque = obx_pollcore_opaque(&p->pc, i, res->dead_letter);

	switch (o) {
	case OBX_DLV_IGNORED:
	case OBX_DLV_SETTLED:
		return 0;
	case OBX_DLV_SENT:
		if (!in_flight)
			obx_pollcore_sent(&p->pc, i, res->dead_letter);
		return 0;
	case OBX_DLV_ACKED:
		acked(p, opaque);
		return 0;
	case OBX_DLV_WAIT_TOPIC:
		obx_log_debug("row %zu of the batch stays pending: %s", i, res->reason);
		return obx_pollcore_wait_topic(&p->pc, i);
	case OBX_DLV_RETRY:
	case OBX_DLV_REJECTED:
	case OBX_DLV_SOLO: /* not asked for (find_alone): the stream's alone */
	case OBX_DLV_STOP:
		break;
	}
	if (in_flight) {
		/* a failure: err_name is never NULL here (NULL would be an acknowledgement) */
		(void)obx_pollcore_report(&p->pc, opaque, err_name != NULL ? err_name : "", res->reason);
		return 0;
	}
	return obx_pollcore_failed(&p->pc, i,
	    res->dead_letter ? OBX_POLL_FAILED_DEAD_LETTER : OBX_POLL_FAILED_PRODUCE, res->reason);
}

void
obx_poll_on_delivery(void *ctx, uint64_t opaque, const rd_kafka_message_t *km)
{
	struct poller *p = ctx;
	struct obx_header hs[OBX_DLV_MAX_HEADERS];
	struct obx_report rep;
	struct obx_dlv_result res;

	obx_kafka_report(km, opaque, hs, OBX_DLV_MAX_HEADERS, &rep);
	(void)delivered(p, obx_dlv_report(&p->dlv, &rep, obx_mono_ms(), &res), &res, true, rep.error_name);
}

/* Produces what the producer's queue refused before, in order. */
static int
pump(struct poller *p)
{
	struct obx_dlv_result res;

	return delivered(p, obx_dlv_pump(&p->dlv, obx_mono_ms(), &res), &res, true, NULL);
}

/* ---- one batch ---- */

/*
 * Sends the dead-letter copy of row i: the record with its headers plus
 * original_topic and error (delivery.h), or (when the row cannot become a
 * record) the row as JSON with seq and error.  Returns 0 or OBX_ENOMEM.
 */
static int
dead_letter(struct poller *p, size_t i, const struct obx_event *ev, bool built, const char *seq)
{
	const struct obx_prow *row = obx_pollcore_row(&p->pc, i);
	const char *last = row->error != NULL ? row->error : "unknown";
	struct obx_dlv_result res;
	struct obx_record rec;
	enum obx_dlv_outcome o;
	char pgerr[400], errbuf[512];
	PGresult *jr;
	size_t nh;

	if (built) {
		if (obx_poll_headers(p, ev, seq, &nh) != 0)
			return OBX_ENOMEM;
		rec = (struct obx_record){ ev->topic, ev->key, ev->keylen, ev->value, ev->len, ev->timestamp_ms,
			p->hdrs, nh };
		o = obx_dlv_dead_letter(&p->dlv, &rec, i, last, obx_mono_ms(), &res);
		return delivered(p, o, &res, false, NULL);
	}
	jr = PQexecParams(p->pg, p->sql.row_json, 1, NULL, (const char *[]){ seq }, NULL, NULL, 0);
	if (PQresultStatus(jr) != PGRES_TUPLES_OK || PQntuples(jr) != 1) {
		snprintf(errbuf, sizeof(errbuf), "could not read the row as JSON: %s",
		    obx_pg_result_error_line(jr, pgerr, sizeof(pgerr)));
		PQclear(jr);
		return obx_pollcore_failed(&p->pc, i, OBX_POLL_FAILED_DEAD_LETTER, errbuf);
	}
	{
		/* several tables: the copy says its table (each table's seq is its own) */
		char table[2 * 64 + 2];
		struct obx_header hs[3] = { { "seq", seq, strlen(seq) }, { "error", last, strlen(last) } };

		snprintf(table, sizeof(table), "%s.%s", p->cfg->table_schema, p->cfg->table_name);
		hs[2] = (struct obx_header){ OBX_TABLE_HEADER, table, strlen(table) };
		rec = (struct obx_record){ p->cfg->dead_letter_topic, NULL, 0, PQgetvalue(jr, 0, 0),
			(size_t)PQgetlength(jr, 0, 0), 0, hs, p->eb.table_header ? 3 : 2 };
		o = obx_dlv_send(&p->dlv, &rec, i, true, obx_mono_ms(), &res);
	}
	PQclear(jr);
	return delivered(p, o, &res, false, NULL);
}

/* The warning for an exhausted row: dead-lettered (dl), or marked without a send. */
static void
log_exhausted(const struct poller *p, const struct obx_prow *row, const struct obx_event *ev, const char *seq,
    bool dl)
{
	struct obx_logfields lf = { .event_id = ev != NULL ? ev->id : NULL,
		.topic = ev != NULL ? ev->topic : NULL };
	const char *last = row->error != NULL ? row->error : "unknown";

	if (dl)
		obx_log_f(OBX_LOG_WARN, &lf,
		    "row seq %s (id %s) failed %lld time(s): dead-lettering it to "
		    "%s: %s",
		    seq, ev != NULL ? ev->id : "?", row->attempts, p->cfg->dead_letter_topic, last);
	else
		obx_log_f(OBX_LOG_WARN, &lf,
		    "row seq %s (id %s) failed %lld time(s): marked published "
		    "without sending ([poll] exhausted = mark): %s",
		    seq, ev != NULL ? ev->id : "?", row->attempts, last);
}

/*
 * Builds row i of res and performs what pollcore decides for it: produce
 * its record or its dead-letter copy, give it up, or record its failure.
 * Returns 0 or OBX_ENOMEM.
 */
static int
produce_row(struct poller *p, const PGresult *res, size_t i)
{
	const struct obx_prow *row = obx_pollcore_row(&p->pc, i);
	int k = (int)i, nf = PQnfields(res), r;
	struct obx_pg_tuple t = { (uint16_t)nf, p->datums };
	struct obx_txninfo txn = { 0, 0, 0 };
	struct obx_event ev;
	const char *seq = PQgetvalue(res, k, 0);
	struct obx_record rec;
	struct obx_dlv_result dres;
	char errbuf[512];
	size_t nh;

	for (int f = 0; f < nf; f++) {
		p->datums[f].kind = PQgetisnull(res, k, f) ? 'n' : 't';
		p->datums[f].data = (const uint8_t *)PQgetvalue(res, k, f);
		p->datums[f].len = (uint32_t)PQgetlength(res, k, f);
	}
	/* no commit time here: the row's created_at, else now, unless [outbox] timestamp says */
	if (obx_pg_int64(res, k, 3, &txn.commit_time) == 0)
		txn.commit_time -= OBX_PG_EPOCH_OFFSET_US;
	else
		txn.commit_time = (int64_t)time(NULL) * 1000000 - OBX_PG_EPOCH_OFFSET_US;
	if ((r = obx_event_build(&p->eb, &p->rel, &t, &txn, 0, &ev, errbuf, sizeof(errbuf))) == OBX_ENOMEM)
		return r;
	switch (obx_pollcore_decide(&p->pc, i, r == 0)) {
	case OBX_POLL_HOLD: /* never: obx_pollcore_next() passed the held rows over */
		return 0;
	case OBX_POLL_GIVE_UP:
		log_exhausted(p, row, r == 0 ? &ev : NULL, seq, false);
		obx_pollcore_give_up(&p->pc, i);
		return 0;
	case OBX_POLL_DEAD_LETTER:
		log_exhausted(p, row, r == 0 ? &ev : NULL, seq, true);
		return dead_letter(p, i, &ev, r == 0, seq);
	case OBX_POLL_FAIL:
		return obx_pollcore_failed(&p->pc, i, OBX_POLL_FAILED_BUILD, errbuf);
	case OBX_POLL_SEND:
		break;
	}
	if ((r = obx_poll_headers(p, &ev, seq, &nh)) != 0)
		return r;
	rec = (struct obx_record){ ev.topic, ev.key, ev.keylen, ev.value, ev.len, ev.timestamp_ms, p->hdrs, nh };
	/* a full producer queue keeps it pending in the delivery policy: wait_acks() moves it on */
	return delivered(p, obx_dlv_send(&p->dlv, &rec, i, false, obx_mono_ms(), &dres), &dres, false, NULL);
}

/*
 * Starts the batch of res's rows and produces them, in seq order, as
 * pollcore decides: a row that cannot be built or whose produce call fails
 * holds back the later rows of its key in this batch (they stay pending and
 * are claimed after it); a stop signal leaves the rest unsent.  Returns 0,
 * OBX_ENOMEM, or OBX_EPROTO with p->reason filled (a row's seq is NULL or
 * not a number).
 */
static int
produce_batch(struct poller *p, const PGresult *res)
{
	int n = PQntuples(res), kcol, r;
	char quoted[256] = "";
	size_t i;

	obx_poll_quote_ident(p->cfg->col_key, quoted, sizeof(quoted));
	kcol = PQfnumber(res, quoted);
	if ((r = obx_pollcore_begin(&p->pc, p->cfg, (size_t)n)) != 0)
		return r;
	obx_dlv_begin(&p->dlv, p->pc.gen, false); /* what an earlier batch left pending is dropped */
	for (int k = 0; k < n; k++) {
		const char *key = kcol >= 0 && !PQgetisnull(res, k, kcol) ? PQgetvalue(res, k, kcol) : NULL;
		int64_t seq, attempts = 0;

		if (obx_pg_int64(res, k, 0, &seq) != 0) {
			snprintf(p->reason, sizeof(p->reason),
			    "claimed row %d: [outbox] seq (%s) is NULL or not an integer", k + 1, p->cfg->col_seq);
			return OBX_EPROTO;
		}
		/* a NULL attempts column (a nullable column mapped to [outbox] attempts) counts as none */
		if (!PQgetisnull(res, k, 1) && obx_pg_int64(res, k, 1, &attempts) != 0) {
			snprintf(p->reason, sizeof(p->reason),
			    "claimed row %d (seq %" PRId64 "): [outbox] attempts (%s) is not an integer", k + 1,
			    seq, p->cfg->col_attempts);
			return OBX_EPROTO;
		}
		if ((r = obx_pollcore_add(&p->pc, seq, attempts, key,
		         key != NULL ? (size_t)PQgetlength(res, k, kcol) : 0,
		         PQgetisnull(res, k, 2) ? NULL : PQgetvalue(res, k, 2))) != 0)
			return r;
	}
	obx_pollcore_stop(&p->pc, p->signals, p->stop_ms);
	while (obx_pollcore_next(&p->pc, &i)) {
		if ((r = produce_row(p, res, i)) != 0)
			return r;
		obx_pollcore_stop(&p->pc, p->signals, p->stop_ms);
	}
	return 0;
}

/*
 * After a fatal error the producer refuses every record at once, each as a
 * failure of its row: none of them is the row's fault, so the batch ends
 * before anything is recorded (its transaction rolls back, every row stays
 * pending with its attempts) and the session with it (a new producer).
 * Returns OBX_ESTATE with reason filled, or 0.
 */
static int
producer_failed(struct poller *p)
{
	if (!p->kf.fatal)
		return 0;
	snprintf(p->reason, sizeof(p->reason), "the Kafka producer failed: %s", p->kf.fatal_reason);
	return OBX_ESTATE;
}

/*
 * Whether the wait for the batch's reports goes on after one turn: 1 yes,
 * 0 it ends at the drain deadline (what was acknowledged is marked, the
 * rest stays pending), or OBX_ESTATE when a second stop signal abandons the
 * batch or the producer failed fatally (reason filled).
 */
static int
wait_goes_on(struct poller *p)
{
	obx_pollcore_stop(&p->pc, p->signals, p->stop_ms);
	switch (obx_pollcore_drain(&p->pc, obx_mono_ms())) {
	case OBX_POLL_DRAIN_ABANDON:
		snprintf(p->reason, sizeof(p->reason),
		    "stopped: %zu event(s) of the batch unacknowledged, "
		    "their rows stay pending",
		    p->pc.outstanding);
		return OBX_ESTATE;
	case OBX_POLL_DRAIN_DEADLINE:
		obx_log_warn("stopping at the drain deadline: %zu event(s) of the batch unacknowledged, "
		             "their rows stay pending; the acknowledged ones are marked",
		    p->pc.outstanding);
		return 0;
	case OBX_POLL_DRAIN_WAIT:
		break;
	}
	if (producer_failed(p) != 0)
		return OBX_ESTATE;
	return 1;
}

/* The broker is slow to acknowledge: said once per batch, and in the state gauge. */
static void
slow_broker(struct poller *p)
{
	char errbuf[160];

	snprintf(errbuf, sizeof(errbuf), "waiting for the broker to acknowledge %zu event(s)", p->pc.outstanding);
	obx_log_warn("%s; the claimed rows stay locked until then", errbuf);
	obx_poll_set_state(p, OBX_STATE_BACKPRESSURED, OBX_NOT_READY_NONE, errbuf);
}

/*
 * Waits for every delivery report of the batch, moving on what the
 * producer's queue refused and running early marking UPDATEs meanwhile.
 * Returns 0, or OBX_ESTATE (wait_goes_on()) or OBX_EIO with reason filled.
 */
static int
wait_acks(struct poller *p)
{
	int64_t start = obx_mono_ms();
	bool slow = false;
	int r = 1;

	obx_kafka_poll(&p->kf, 0);
	while (!obx_pollcore_finished(&p->pc)) {
		struct pollfd fds[3] = {
			{ obx_kafka_fd(&p->kf), POLLIN, 0 },
			{ p->opts->signal_fd, POLLIN, 0 },
			{ -1, POLLIN, 0 },
		};

		if ((r = obx_poll_mark_early(p)) != 0)
			return r;
		if (p->pg_busy)
			fds[2].fd = PQsocket(p->pg);
		/* nothing wakes the loop when the producer's queue has room again */
		if (poll(fds, 3, obx_dlv_pending(&p->dlv) ? 50 : 1000) < 0 && errno != EINTR) {
			snprintf(p->reason, sizeof(p->reason), "could not poll: %s", strerror(errno));
			return OBX_EIO;
		}
		obx_kafka_poll(&p->kf, 0);
		if ((r = pump(p)) != 0)
			return r;
		if ((fds[2].revents & (POLLIN | POLLERR | POLLHUP)) && (r = obx_poll_mark_result(p, false)) != 0)
			return r;
		if (fds[1].revents & POLLIN)
			obx_runner_read_signals(&p->run);
		if ((r = wait_goes_on(p)) <= 0)
			break;
		if (!slow && (slow = obx_mono_ms() - start > SLOW_ACK_MS))
			slow_broker(p);
		p->m.inflight_events = p->pc.outstanding;
		obx_runner_publish(&p->run);
	}
	p->m.inflight_events = 0;
	if (slow && obx_pollcore_finished(&p->pc)) {
		obx_log_info("the broker acknowledged the batch after %.1f s",
		    (double)(obx_mono_ms() - start) / 1000.0);
		obx_poll_set_state(p, OBX_STATE_STREAMING, OBX_NOT_READY_NONE, NULL);
	}
	return r < 0 ? r : 0;
}

/*
 * One cycle.  Returns the number of rows claimed (>= 0), or a negative
 * OBX_E* code with p->reason filled (the session ends).
 */
int
obx_poll_cycle(struct poller *p)
{
	PGresult *res = obx_poll_exec(p, p->sql.claim);
	size_t count[OBX_PROW_NSTATES];
	char err[512];
	int n, r;

	if (res == NULL)
		return p->signals > 0 ? 0 : OBX_EIO; /* stopped while claiming: nothing was claimed */
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		return obx_poll_claim_failed(p, res);
	p->tables[p->round.cur].out = false; /* its turn came */
	n = PQntuples(res);
	if (n == 0) {
		PQclear(res);
		res = PQexec(p->pg, "COMMIT");
		r = PQresultStatus(res) == PGRES_COMMAND_OK ? 0 : OBX_EIO;
		if (r != 0)
			snprintf(p->reason, sizeof(p->reason), "could not end the claim: %s",
			    obx_pg_result_error_line(res, err, sizeof(err)));
		PQclear(res);
		return r;
	}
	obx_log_debug("claimed %d row(s), seq %s to %s", n, PQgetvalue(res, 0, 0), PQgetvalue(res, n - 1, 0));
	if (!p->rel_built && (r = obx_poll_build_rel(p, res)) != 0) {
		PQclear(res);
		snprintf(p->reason, sizeof(p->reason), "out of memory");
		return r;
	}
	p->m.poll_batches++;
	r = produce_batch(p, res);
	PQclear(res);
	if (r == 0)
		r = wait_acks(p);
	if (r == 0)
		r = producer_failed(p); /* also when nothing was in flight to wait for */
	if (r == 0)
		r = obx_poll_mark_result(p, true); /* an early marking UPDATE still running */
	if (r == 0)
		r = obx_poll_record_rows(p, p->sql.fail, OBX_PROW_FAILED, true);
	if (r == 0)
		r = obx_poll_record_rows(p, p->sql.give_up, OBX_PROW_GIVEN_UP, false);
	if (r == 0)
		r = obx_poll_mark_and_commit(p);
	obx_pollcore_count(&p->pc, count);
	if (r == 0)
		obx_log_debug("committed: %zu published, %zu failed, %zu given up, %zu held back",
		    count[OBX_PROW_ACKED], count[OBX_PROW_FAILED], count[OBX_PROW_GIVEN_UP],
		    count[OBX_PROW_SKIPPED]);
	if (r == OBX_ENOMEM)
		snprintf(p->reason, sizeof(p->reason), "out of memory");
	obx_pollcore_end(&p->pc);
	if (r < 0)
		return r;
	/* a batch that moved no row (each waits for its topic, say) is idle: the next claim after the
	 * poll interval or a NOTIFY, not at once and again */
	return count[OBX_PROW_ACKED] + count[OBX_PROW_FAILED] + count[OBX_PROW_GIVEN_UP] > 0 ? n : 0;
}
