/*
 * A randomized model test of the relay core.
 *
 * A small "server" writes transactions into a WAL of its own (plain ones,
 * sent whole at their commit; large ones, streamed in blocks that
 * interleave with the rest and end with Stream Commit or Stream Abort;
 * rolled-back savepoints; transactional and other logical decoding
 * messages; rows of a table that is not the outbox; keepalives) and puts
 * the decoded messages on a wire that the core reads only while
 * obx_core_can_read() says so.  A fake producer answers produce calls
 * (sometimes with a full queue, rarely with a refusal) and keeps what it
 * accepted until the test serves a delivery report for it (mostly OK,
 * rarely a transient or permanent failure).  Sessions end and start again
 * as the relay's loop would do it: the server then sends again, from the
 * confirmed position, every committed transaction after it.
 *
 * After every step the reference model checks:
 *   - the flush position never passes the end of a committed transaction
 *     with an event the broker has not acknowledged in this session
 *     (docs/internals/design.md, invariant 4), never goes back within a session, and
 *     is the session's start, the end of a transaction read, or the WAL end
 *     of a keepalive read while nothing was open or outstanding (5);
 *   - nothing of a rolled-back (sub)transaction, of another table, of
 *     another prefix or of a non-transactional message is ever produced (2);
 *   - within a session no event is produced twice (except for its one
 *     dead-letter copy after a permanent failure), and events of one
 *     aggregate id are produced in commit and insertion order (3, 6);
 *   - every record carries the topic, key, value and headers of its event;
 *   - the records and bytes in flight respect [delivery] max_inflight and
 *     max_inflight_bytes (7);
 *   - reports of an earlier session change nothing (8);
 *   - a session ends only for a reason the test caused: a transient
 *     failure, a savepoint's Stream Abort in a streamed transaction holding
 *     messages (which must end it, with streaming off from then on), a full
 *     stream buffer, a stop signal (a drained stop confirms everything read
 *     and never stops inside a transaction).
 * At the end of each seed everything is drained: every committed event
 * must have reached the broker at least once (1), the flush position must
 * have reached the last commit, and then follow an idle keepalive.
 *
 * The seeds are fixed (1..200).  OBX_MODEL_SEEDS=N runs seeds 1..N,
 * OBX_MODEL_SEED=S only seed S, OBX_MODEL_STEPS=K K steps per seed, and
 * OBX_MODEL_TRACE=1 prints every step.
 */
#include <inttypes.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"

#define DEFAULT_SEEDS 200
#define DEFAULT_STEPS 500
#define RELID_OUTBOX 16384
#define RELID_AUDIT 16385 /* audit.outbox: same columns, not the configured table */
#define DL_TOPIC "outbox.dead_letter"
#define NKEYS 5
#define MAXSUB 6
#define MAXHDR 16
#define TRACE_LINES 60
#define WIRE_MAX 300
#define MAX_OPEN_BIG 3

/* ---- random numbers (splitmix64: the same sequence everywhere) ---- */

static uint64_t rng;

static uint64_t
rnd(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static uint32_t
below(uint32_t n)
{
	return n ? (uint32_t)(rnd() % n) : 0;
}

/* True with probability pm per mille. */
static bool
chance(uint32_t pm)
{
	return below(1000) < pm;
}

/* ---- the model ---- */

/* What the seeds exercised, printed at the end: a model that checks nothing proves nothing. */
enum model_stat {
	ST_STREAM_COMMIT,
	ST_STREAM_ABORT,
	ST_SAVEPOINT_ABORT,
	ST_MSG_FALLBACK,
	ST_BUFFER_FALLBACK,
	ST_QUEUE_FULL,
	ST_PERMANENT,
	ST_TRANSIENT,
	ST_DEAD_LETTER,
	ST_LATE_REPORT,
	ST_SIGNAL_STOP,
	ST_CRASH_REWIND,
	ST_BACKPRESSURE,
	ST_MESSAGES,
	ST_DRAIN_TIMEOUT,
	ST_NSTATS
};
static const char *const stat_names[ST_NSTATS] = {
	"stream commits",
	"stream aborts",
	"savepoint aborts",
	"message fallbacks",
	"buffer fallbacks",
	"queue-full answers",
	"permanent failures",
	"transient failures",
	"dead-letter copies",
	"late reports",
	"signal stops",
	"rewinds",
	"backpressure pauses",
	"messages published",
	"drain timeouts",
};
static long stats[ST_NSTATS];

enum ev_kind {
	EV_ROW,       /* a row of public.outbox */
	EV_MSG,       /* a transactional message with prefix outboxd */
	EV_NOISE_ROW, /* a row of audit.outbox */
	EV_NOISE_MSG, /* a transactional message with another prefix */
	EV_NONTX_MSG, /* a non-transactional message with prefix outboxd */
};

struct mev {
	char id[16];
	char atype[8];
	char key[4];
	char type[8];
	char payload[192];
	char content[320]; /* a message's JSON object */
	enum ev_kind kind;
	int txn;         /* -1: none (non-transactional message) */
	int ord;         /* position among its transaction's changes */
	uint32_t subxid; /* the (sub)transaction that wrote it */
	int key_i;
	obx_lsn lsn;
	bool aborted;  /* its subtransaction or transaction rolled back */
	bool expected; /* the core must publish it once its transaction commits */
	int seq;       /* its ordinal among the published events of its transaction */
	/* per session (session ids; 0: never) */
	int orig_sess;   /* the record was accepted by the producer */
	int dl_sess;     /* a dead-letter copy was accepted */
	int perm_sess;   /* the record was refused for good (produce or report) */
	int dlperm_sess; /* the dead-letter copy was refused at produce */
	int acked_sess;  /* the core got an OK report for it or its copy */
	bool kafka;      /* an OK report was served for it (any session) */
};

enum { T_OPEN, T_COMMITTED, T_ABORTED };

struct mtxn {
	uint32_t xid;
	int state;
	bool big; /* streamed when the session streams */
	int *ops;
	size_t nops, cap;
	uint32_t subs[MAXSUB];
	bool sub_aborted[MAXSUB];
	int nsubs;
	obx_lsn commit_lsn, end_lsn;
	int64_t commit_time;
	int npub;          /* events the core must publish */
	int streamed_sess; /* a block of it went on the wire in this session */
	size_t sent;       /* ops handled by blocks in streamed_sess */
	int rel_sess;      /* relations announced inside its stream in rel_sess */
	bool rel_sent[2];
	int msgs_sess; /* our messages the core buffered for it in msgs_sess */
	int msgs_fed;
	int fed_sess;    /* its Commit or Stream Commit was read in this session */
	int stream_sess; /* a Stream Start of it was read, no Stream Commit/Abort yet */
};

/* One message on the wire. */
struct witem {
	char type;   /* pgoutput type, or 'k' for a keepalive */
	bool stream; /* inside a Stream Start block */
	bool flag;   /* 'k': reply requested; 'S': first segment */
	int ev;
	int txn;
	int rel;    /* 'R': 0 outbox, 1 audit */
	int layout; /* 'R', 'I': the columns of the relation (see relcols) */
	uint32_t xid, sub;
	obx_lsn lsn;
};

/* A record the fake producer accepted, until its delivery report. */
struct outrec {
	uint64_t opaque;
	int ev;
	bool dl;
	int sess;
	char topic[64];
	char key[16];
	bool has_key;
	size_t keylen;
	char value[256];
	bool has_value;
	size_t len;
	size_t nh;
	char hname[MAXHDR][24];
	char hval[MAXHDR][96];
	size_t hlen[MAXHDR];
	bool hnull[MAXHDR];
};

struct model {
	uint64_t seed;
	int step;
	bool failed;
	bool quiet; /* draining: no refusals, no failures */

	struct mev *ev;
	size_t nev, evcap;
	struct mtxn *tx;
	size_t ntx, txcap;
	int *corder; /* committed transactions in commit order */
	size_t ncorder, cocap;
	struct witem *wire;
	size_t whead, wn, wcap;
	struct outrec *out;
	size_t nout, outcap;

	obx_lsn walpos;
	uint32_t next_xid;
	int64_t now;
	int64_t commit_clock;

	/* the session */
	int sess;
	bool streaming;   /* the server streams in this session */
	bool rel_sent[2]; /* Relation announced (the core's relation cache has one) */
	int layout[2];    /* the columns of the last Relation put on the wire */
	obx_lsn sess_start, seen_max, last_flush, fed_commit_end;
	size_t verified;             /* corder[< verified] checked fully acknowledged */
	obx_lsn *allowed;            /* positions the flush may take: the start, ends of commits read, */
	size_t nallowed, allowedcap; /* and keepalives read while nothing was open or outstanding */
	bool plain_open;             /* a Begin was read, its Commit not yet */
	bool expect_retry;           /* a transient failure was injected */
	bool expect_off;             /* a savepoint's abort with buffered messages */
	int signals;
	bool key_set[NKEYS];
	int key_sess[NKEYS];
	obx_lsn key_lsn[NKEYS];
	int key_ord[NKEYS];

	obx_lsn confirmed; /* the slot's confirmed_flush */
	obx_lsn *hist;     /* every confirmed position, for a server that lost the latest */
	size_t nhist, histcap;
	obx_lsn last_commit_end;

	/* per seed */
	int status_interval;
	uint32_t qfull_pm; /* QUEUE_FULL answers per mille, in a full phase */
	bool qfull_phase;
	bool dead_letter;
	long long max_inflight;
	long long max_inflight_bytes;
	uint32_t pad; /* payloads carry up to this many bytes of padding */

	char trace[TRACE_LINES][160];
	size_t ntrace;
	bool verbose;

	/* totals */
	long steps_total, produced_total, sessions_total, reports_total;
};

static struct model M;
static struct obx_config cfg;
static struct obx_metrics met;
static struct obx_core core;

static const char *const atypes[] = { "order", "user" };
static const char *const types[] = { "Created", "Updated", "Deleted" };

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
trace(const char *fmt, ...)
{
	va_list ap;
	char *line = M.trace[M.ntrace++ % TRACE_LINES];

	va_start(ap, fmt);
	vsnprintf(line, sizeof(M.trace[0]), fmt, ap);
	va_end(ap);
	if (M.verbose)
		fprintf(stderr, "  [%" PRIu64 ":%d] %s\n", M.seed, M.step, line);
}

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
violation(const char *fmt, ...)
{
	va_list ap;
	size_t first;

	if (M.failed)
		return;
	M.failed = true;
	fprintf(stderr, "relaycore model: seed %" PRIu64 " step %d (session %d): ", M.seed, M.step, M.sess);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n  last steps (rerun with OBX_MODEL_SEED=%" PRIu64 " OBX_MODEL_TRACE=1 for all):\n",
	    M.seed);
	first = M.ntrace > TRACE_LINES ? M.ntrace - TRACE_LINES : 0;
	for (size_t i = first; i < M.ntrace; i++)
		fprintf(stderr, "    %s\n", M.trace[i % TRACE_LINES]);
}

static void *
grow(void *p, size_t *cap, size_t need, size_t size)
{
	size_t ncap;
	void *np;

	if (need <= *cap)
		return p;
	ncap = *cap ? *cap * 2 : 16;
	while (ncap < need)
		ncap *= 2;
	np = realloc(p, ncap * size);
	assert_non_null(np);
	memset((char *)np + *cap * size, 0, (ncap - *cap) * size);
	*cap = ncap;
	return np;
}

static const char *
lsnstr(obx_lsn l, char *buf)
{
	return obx_lsn_format(l, buf, OBX_LSN_STRLEN);
}

#define LSN(l) lsnstr((l), (char[OBX_LSN_STRLEN]){ 0 })

static bool
published(const struct mev *e)
{
	return e->expected && !e->aborted;
}

/* ---- the server: the WAL and what goes on the wire ---- */

static obx_lsn
wal(unsigned n)
{
	obx_lsn l = M.walpos;

	M.walpos += n;
	return l;
}

static void
push(struct witem w)
{
	if (M.whead > 0 && M.whead == M.wn) {
		M.whead = M.wn = 0;
	}
	M.wire = grow(M.wire, &M.wcap, M.wn + 1, sizeof(*M.wire));
	M.wire[M.wn++] = w;
}

static size_t
wire_len(void)
{
	return M.wn - M.whead;
}

static int
new_txn(bool big)
{
	struct mtxn *t;

	M.tx = grow(M.tx, &M.txcap, M.ntx + 1, sizeof(*M.tx));
	t = &M.tx[M.ntx];
	memset(t, 0, sizeof(*t));
	t->xid = M.next_xid++;
	t->big = big;
	t->state = T_OPEN;
	return (int)M.ntx++;
}

static int
new_event(int txn, uint32_t subxid, enum ev_kind kind)
{
	struct mev *e;
	int i;

	M.ev = grow(M.ev, &M.evcap, M.nev + 1, sizeof(*M.ev));
	i = (int)M.nev++;
	e = &M.ev[i];
	memset(e, 0, sizeof(*e));
	snprintf(e->id, sizeof(e->id), "e%d", i);
	e->kind = kind;
	e->txn = txn;
	e->subxid = subxid;
	e->key_i = (int)below(NKEYS);
	snprintf(e->key, sizeof(e->key), "k%d", e->key_i);
	snprintf(e->atype, sizeof(e->atype), "%s", atypes[below(2)]);
	snprintf(e->type, sizeof(e->type), "%s", types[below(3)]);
	if (M.pad > 0)
		snprintf(e->payload, sizeof(e->payload), "{\"n\":%d,\"pad\":\"%.*s\"}", i, (int)below(M.pad),
		    "................................................................"
		    "................................................................................................");
	else
		snprintf(e->payload, sizeof(e->payload), "{\"n\":%d}", i);
	if (kind == EV_MSG || kind == EV_NOISE_MSG || kind == EV_NONTX_MSG)
		snprintf(e->content, sizeof(e->content),
		    "{\"id\":\"%s\",\"aggregatetype\":\"%s\","
		    "\"aggregateid\":\"%s\",\"type\":\"%s\",\"payload\":%s}",
		    e->id, e->atype, e->key, e->type, e->payload);
	e->expected = kind == EV_ROW || (kind == EV_MSG && cfg.messages);
	e->lsn = wal(0x40);
	return i;
}

/* Adds n changes to transaction ti, some in (new) subtransactions. */
static void
add_ops(int ti, int n)
{
	for (int k = 0; k < n; k++) {
		struct mtxn *t = &M.tx[ti];
		uint32_t sub = t->xid;
		uint32_t r = below(100);
		enum ev_kind kind = r < 62 ? EV_ROW : r < 84 ? EV_MSG : r < 93 ? EV_NOISE_ROW : EV_NOISE_MSG;
		int e;

		if (t->nsubs < MAXSUB && chance(200)) {
			t->subs[t->nsubs] = M.next_xid++;
			t->sub_aborted[t->nsubs] = false;
			sub = t->subs[t->nsubs++];
		} else if (t->nsubs > 0 && chance(500)) {
			int s = (int)below((uint32_t)t->nsubs);

			if (!t->sub_aborted[s])
				sub = t->subs[s];
		}
		e = new_event(ti, sub, kind);
		t = &M.tx[ti];
		M.ev[e].ord = (int)t->nops;
		t->ops = grow(t->ops, &t->cap, t->nops + 1, sizeof(*t->ops));
		t->ops[t->nops++] = e;
	}
}

/* A savepoint of ti rolls back (index s of its subtransactions). */
static void
abort_sub(int ti, int s)
{
	struct mtxn *t = &M.tx[ti];

	t->sub_aborted[s] = true;
	for (size_t i = 0; i < t->nops; i++)
		if (M.ev[t->ops[i]].subxid == t->subs[s])
			M.ev[t->ops[i]].aborted = true;
}

static void
commit_txn(int ti)
{
	struct mtxn *t = &M.tx[ti];
	int seq = 0;

	t->state = T_COMMITTED;
	t->commit_lsn = wal(0x28);
	t->end_lsn = M.walpos;
	t->commit_time = (M.commit_clock += 1000 + below(5000));
	t->npub = 0;
	for (size_t i = 0; i < t->nops; i++) {
		struct mev *e = &M.ev[t->ops[i]];

		if (published(e)) {
			e->seq = seq++;
			t->npub++;
		}
	}
	M.corder = grow(M.corder, &M.cocap, M.ncorder + 1, sizeof(*M.corder));
	M.corder[M.ncorder++] = ti;
	M.last_commit_end = t->end_lsn;
}

static int
rel_of(const struct mev *e)
{
	return e->kind == EV_NOISE_ROW ? 1 : 0;
}

static bool
is_row(const struct mev *e)
{
	return e->kind == EV_ROW || e->kind == EV_NOISE_ROW;
}

/* One change on the wire; in a stream, announcing the relation inside the transaction. */
static void
push_change(int ti, int e, bool stream)
{
	struct mtxn *t = &M.tx[ti];
	struct mev *ev = &M.ev[e];

	if (is_row(ev)) {
		int r = rel_of(ev);
		bool need;

		if (stream && t->rel_sess != M.sess) {
			t->rel_sess = M.sess;
			t->rel_sent[0] = t->rel_sent[1] = false;
		}
		need = stream ? !t->rel_sent[r] : !M.rel_sent[r];
		if (chance(30)) {
			/* the table changed (a column added or dropped): a new Relation message */
			M.layout[r] ^= 1;
			need = true;
		}
		if (need) {
			push((struct witem){ .type = 'R',
			    .stream = stream,
			    .rel = r,
			    .txn = ti,
			    .xid = stream ? t->xid : 0,
			    .ev = -1,
			    .layout = M.layout[r] });
			M.rel_sent[r] = true;
			if (stream)
				t->rel_sent[r] = true;
		}
		push((struct witem){ .type = 'I',
		    .stream = stream,
		    .ev = e,
		    .txn = ti,
		    .xid = stream ? ev->subxid : 0,
		    .lsn = ev->lsn,
		    .layout = M.layout[r] });
	} else {
		/* pgoutput tags a streamed message with the top-level xid */
		push((struct witem){ .type = 'M',
		    .stream = stream,
		    .ev = e,
		    .txn = ti,
		    .xid = stream ? t->xid : 0,
		    .lsn = ev->lsn });
	}
}

/* A committed transaction, whole and without what rolled back (Begin .. Commit). */
static void
push_plain(int ti)
{
	struct mtxn *t = &M.tx[ti];

	push((struct witem){ .type = 'B',
	    .txn = ti,
	    .ev = -1,
	    .lsn = t->nops ? M.ev[t->ops[0]].lsn : t->commit_lsn });
	for (size_t i = 0; i < M.tx[ti].nops; i++) {
		int e = M.tx[ti].ops[i];

		if (M.ev[e].aborted)
			continue;
		push_change(ti, e, false);
		if (chance(40)) /* a keepalive while the transaction is sent: the WAL end is past it */
			push(
			    (struct witem){ .type = 'k', .lsn = M.tx[ti].end_lsn, .flag = chance(300), .ev = -1 });
	}
	push((struct witem){ .type = 'C', .txn = ti, .ev = -1 });
}

static size_t
stream_sent(const struct mtxn *t)
{
	return t->streamed_sess == M.sess ? t->sent : 0;
}

static bool
unsent_changes(int ti)
{
	const struct mtxn *t = &M.tx[ti];

	for (size_t i = stream_sent(t); i < t->nops; i++)
		if (!M.ev[t->ops[i]].aborted)
			return true;
	return false;
}

/* One Stream Start .. Stream Stop block with the changes of ti not sent yet. */
static void
push_block(int ti)
{
	struct mtxn *t = &M.tx[ti];
	size_t from = stream_sent(t);
	bool first = t->streamed_sess != M.sess;

	t->streamed_sess = M.sess;
	push((struct witem){ .type = 'S',
	    .txn = ti,
	    .xid = t->xid,
	    .flag = first,
	    .ev = -1,
	    .lsn = from < t->nops ? M.ev[t->ops[from]].lsn : 0 });
	for (size_t i = from; i < M.tx[ti].nops; i++) {
		int e = M.tx[ti].ops[i];

		if (!M.ev[e].aborted)
			push_change(ti, e, true);
	}
	t = &M.tx[ti];
	t->sent = t->nops;
	push((struct witem){ .type = 'E', .ev = -1 });
}

static int
pick_open_big(void)
{
	int cand[64], n = 0;

	for (size_t i = 0; i < M.ntx && n < 64; i++)
		if (M.tx[i].big && M.tx[i].state == T_OPEN)
			cand[n++] = (int)i;
	return n ? cand[below((uint32_t)n)] : -1;
}

static int
count_open_big(void)
{
	int n = 0;

	for (size_t i = 0; i < M.ntx; i++)
		n += M.tx[i].big && M.tx[i].state == T_OPEN;
	return n;
}

static void
gen_plain(void)
{
	int ti = new_txn(false);
	struct mtxn *t;

	add_ops(ti, (int)below(6));
	t = &M.tx[ti];
	for (int s = 0; s < t->nsubs; s++)
		if (chance(300))
			abort_sub(ti, s);
	commit_txn(ti);
	trace("server: plain xid %" PRIu32 " (%zu changes) commits at %s..%s", M.tx[ti].xid, M.tx[ti].nops,
	    LSN(M.tx[ti].commit_lsn), LSN(M.tx[ti].end_lsn));
	push_plain(ti);
}

static void
gen_big_commit(int ti)
{
	commit_txn(ti);
	trace("server: large xid %" PRIu32 " (%zu changes) commits at %s..%s", M.tx[ti].xid, M.tx[ti].nops,
	    LSN(M.tx[ti].commit_lsn), LSN(M.tx[ti].end_lsn));
	if (M.streaming && (M.tx[ti].streamed_sess == M.sess || chance(300))) {
		if (M.tx[ti].streamed_sess != M.sess || unsent_changes(ti))
			push_block(ti);
		push((struct witem){ .type = 'c', .txn = ti, .xid = M.tx[ti].xid, .ev = -1 });
	} else {
		push_plain(ti);
	}
}

static void
gen_big_abort(int ti)
{
	struct mtxn *t = &M.tx[ti];
	obx_lsn at = wal(0x20);

	t->state = T_ABORTED;
	for (size_t i = 0; i < t->nops; i++)
		M.ev[t->ops[i]].aborted = true;
	trace("server: large xid %" PRIu32 " rolls back", t->xid);
	if (M.streaming && t->streamed_sess == M.sess)
		push((struct witem){ .type = 'A', .txn = ti, .xid = t->xid, .sub = t->xid, .lsn = at, .ev = -1 });
}

static void
gen_big_rollback(int ti)
{
	struct mtxn *t = &M.tx[ti];
	int cand[MAXSUB], n = 0, s;
	obx_lsn at;

	for (int i = 0; i < t->nsubs; i++)
		if (!t->sub_aborted[i])
			cand[n++] = i;
	if (n == 0)
		return;
	s = cand[below((uint32_t)n)];
	at = wal(0x20);
	abort_sub(ti, s);
	trace("server: large xid %" PRIu32 " rolls back savepoint %" PRIu32, t->xid, t->subs[s]);
	if (M.streaming && t->streamed_sess == M.sess)
		push((struct witem){ .type = 'A',
		    .txn = ti,
		    .xid = t->xid,
		    .sub = t->subs[s],
		    .lsn = at,
		    .ev = -1 });
}

static void
gen_keepalive(void)
{
	bool reply = chance(300);

	trace("server: keepalive %s%s", LSN(M.walpos), reply ? " (reply)" : "");
	push((struct witem){ .type = 'k', .lsn = M.walpos, .flag = reply, .ev = -1 });
}

static void
server_action(void)
{
	uint32_t r = below(100);
	int ti;

	if (wire_len() > WIRE_MAX)
		return; /* the walsender waits for the socket */
	if (r < 30) {
		gen_plain();
	} else if (r < 38) {
		gen_keepalive();
	} else if (r < 41) {
		M.walpos += 0x100; /* transactions without changes for us: skipped */
	} else if (r < 44) {
		int e = new_event(-1, 0, EV_NONTX_MSG);

		trace("server: non-transactional message %s", M.ev[e].id);
		push((struct witem){ .type = 'M', .ev = e, .txn = -1, .lsn = M.ev[e].lsn });
	} else if (r < 55) {
		if (count_open_big() >= MAX_OPEN_BIG)
			return;
		ti = new_txn(true);
		add_ops(ti, 1 + (int)below(3));
		trace("server: large xid %" PRIu32 " begins", M.tx[ti].xid);
		if (M.streaming && chance(600))
			push_block(ti);
	} else if ((ti = pick_open_big()) < 0) {
		gen_plain();
	} else if (r < 75) {
		add_ops(ti, 1 + (int)below(4));
		if (M.streaming && chance(700) && unsent_changes(ti))
			push_block(ti);
	} else if (r < 83) {
		gen_big_rollback(ti);
	} else if (r < 94) {
		gen_big_commit(ti);
	} else {
		gen_big_abort(ti);
	}
}

/* A new session from `from`: the server sends every committed transaction after it again. */
static void
server_replay(obx_lsn from)
{
	M.whead = M.wn = 0;
	M.rel_sent[0] = M.rel_sent[1] = false;
	M.layout[0] = (int)below(2);
	M.layout[1] = (int)below(2);
	for (size_t i = 0; i < M.ncorder; i++) {
		int ti = M.corder[i];
		struct mtxn *t = &M.tx[ti];

		if (t->commit_lsn < from)
			continue;
		if (M.streaming && t->big && chance(400)) {
			/* streamed again; what rolled back may be sent and then aborted, as decoded */
			bool with_aborted = chance(500);

			push((struct witem){ .type = 'S', .txn = ti, .xid = t->xid, .flag = true, .ev = -1 });
			t->rel_sess = 0;
			for (size_t k = 0; k < M.tx[ti].nops; k++) {
				int e = M.tx[ti].ops[k];

				if (!M.ev[e].aborted || with_aborted)
					push_change(ti, e, true);
			}
			push((struct witem){ .type = 'E', .ev = -1 });
			t = &M.tx[ti];
			for (int s = 0; with_aborted && s < t->nsubs; s++)
				if (t->sub_aborted[s])
					push((struct witem){ .type = 'A',
					    .txn = ti,
					    .xid = t->xid,
					    .sub = t->subs[s],
					    .ev = -1 });
			push((struct witem){ .type = 'c', .txn = ti, .xid = t->xid, .ev = -1 });
		} else {
			push_plain(ti);
		}
	}
	trace("server: session %d from %s: %zu message(s) to send again%s", M.sess, LSN(from), wire_len(),
	    M.streaming ? ", streaming" : "");
}

/* ---- the fake producer ---- */

static void
header(const struct obx_record *r, const char *name, char *out, size_t len, bool *found)
{
	out[0] = '\0';
	if (found)
		*found = false;
	for (size_t i = r->nheaders; i-- > 0;) {
		if (strcmp(r->headers[i].name, name) == 0) {
			if (found)
				*found = true;
			if (r->headers[i].value != NULL)
				snprintf(out, len, "%.*s", (int)r->headers[i].len,
				    (const char *)r->headers[i].value);
			return;
		}
	}
}

static bool
bytes_eq(const void *p, size_t len, const char *s)
{
	return p != NULL && len == strlen(s) && memcmp(p, s, len) == 0;
}

/* The record of an event must say what the event is. */
static void
check_record(const struct obx_record *r, const struct mev *e)
{
	const struct mtxn *t = &M.tx[e->txn];
	char topic[64], h[128], want[32];

	snprintf(topic, sizeof(topic), "outbox.event.%s", e->atype);
	if (strcmp(r->topic, topic) != 0)
		violation("event %s produced to topic %s, expected %s", e->id, r->topic, topic);
	if (!bytes_eq(r->key, r->keylen, e->key))
		violation("event %s produced with key '%.*s', expected %s", e->id, (int)r->keylen,
		    r->key ? (const char *)r->key : "", e->key);
	if (!bytes_eq(r->value, r->len, e->payload))
		violation("event %s produced with value '%.*s', expected %s", e->id, (int)r->len,
		    r->value ? (const char *)r->value : "(null)", e->payload);
	header(r, "lsn", h, sizeof(h), NULL);
	if (strcmp(h, LSN(t->commit_lsn)) != 0)
		violation("event %s has header lsn=%s, its transaction commits at %s", e->id, h,
		    LSN(t->commit_lsn));
	header(r, "seq", h, sizeof(h), NULL);
	snprintf(want, sizeof(want), "%d", e->seq);
	if (strcmp(h, want) != 0)
		violation("event %s has header seq=%s, expected %s", e->id, h, want);
	header(r, "xid", h, sizeof(h), NULL);
	snprintf(want, sizeof(want), "%" PRIu32, t->xid);
	if (strcmp(h, want) != 0)
		violation("event %s has header xid=%s, expected %s", e->id, h, want);
	header(r, "type", h, sizeof(h), NULL);
	if (strcmp(h, e->type) != 0)
		violation("event %s has header type=%s, expected %s", e->id, h, e->type);
}

static void
keep_record(const struct obx_record *r, uint64_t opaque, int e, bool dl)
{
	struct outrec *o;

	M.out = grow(M.out, &M.outcap, M.nout + 1, sizeof(*M.out));
	o = &M.out[M.nout++];
	memset(o, 0, sizeof(*o));
	o->opaque = opaque;
	o->ev = e;
	o->dl = dl;
	o->sess = M.sess;
	snprintf(o->topic, sizeof(o->topic), "%s", r->topic);
	o->has_key = r->key != NULL;
	o->keylen = r->keylen < sizeof(o->key) ? r->keylen : sizeof(o->key);
	if (o->has_key)
		memcpy(o->key, r->key, o->keylen);
	o->has_value = r->value != NULL;
	o->len = r->len < sizeof(o->value) ? r->len : sizeof(o->value);
	if (o->has_value)
		memcpy(o->value, r->value, o->len);
	o->nh = r->nheaders < MAXHDR ? r->nheaders : MAXHDR;
	for (size_t i = 0; i < o->nh; i++) {
		const struct obx_header *h = &r->headers[i];

		snprintf(o->hname[i], sizeof(o->hname[i]), "%s", h->name);
		o->hnull[i] = h->value == NULL;
		o->hlen[i] = h->len < sizeof(o->hval[i]) ? h->len : sizeof(o->hval[i]);
		if (h->value != NULL)
			memcpy(o->hval[i], h->value, o->hlen[i]);
	}
}

static enum obx_produce_result
m_produce(void *ctx, const struct obx_record *r, uint64_t opaque, char *errbuf, size_t errlen)
{
	char id[64], otopic[64], err[128], topic[64];
	bool has_id, has_err;
	bool dl = strcmp(r->topic, DL_TOPIC) == 0;
	bool bare = dl && r->key == NULL && r->value == NULL;
	struct mev *e;
	int ei;
	char *end = id;

	(void)ctx;
	header(r, "id", id, sizeof(id), &has_id);
	ei = id[0] == 'e' ? (int)strtol(id + 1, &end, 10) : -1;
	if (!has_id || ei < 0 || (size_t)ei >= M.nev || *end != '\0') {
		violation("produce of a record with no known event id (topic %s, id '%s')", r->topic, id);
		return OBX_PRODUCE_OK;
	}
	e = &M.ev[ei];
	if (!e->expected || e->txn < 0) {
		violation("produce of %s, which is not an outbox event (kind %d)", e->id, (int)e->kind);
		return OBX_PRODUCE_OK;
	}
	if (e->aborted || M.tx[e->txn].state != T_COMMITTED) {
		violation("produce of %s, which %s", e->id,
		    e->aborted ? "was rolled back (savepoint or "
		                 "transaction)" :
		                 "belongs to a transaction that has not committed");
		return OBX_PRODUCE_OK;
	}
	if (((opaque >> 63) != 0) != dl)
		violation("record of %s to %s has opaque %#" PRIx64 " (dead-letter bit wrong)", e->id, r->topic,
		    opaque);
	if (!dl) {
		check_record(r, e);
	} else {
		snprintf(topic, sizeof(topic), "outbox.event.%s", e->atype);
		header(r, "original_topic", otopic, sizeof(otopic), NULL);
		header(r, "error", err, sizeof(err), &has_err);
		if (strcmp(otopic, topic) != 0 || !has_err)
			violation("dead-letter copy of %s: original_topic '%s' (expected %s), error header %s",
			    e->id, otopic, topic, has_err ? "present" : "missing");
		if (e->perm_sess != M.sess)
			violation("dead-letter copy of %s without a permanent failure of it in this session",
			    e->id);
		if (bare && e->dlperm_sess != M.sess)
			violation("headers-only dead-letter copy of %s although its copy was not refused", e->id);
	}
	if (!M.quiet && M.qfull_phase && chance(M.qfull_pm)) {
		trace("produce %s%s: QUEUE_FULL", e->id, dl ? " (dead-letter)" : "");
		stats[ST_QUEUE_FULL]++;
		snprintf(errbuf, errlen, "Local: Queue full");
		return OBX_PRODUCE_QUEUE_FULL;
	}
	if (!M.quiet && M.dead_letter && !bare && chance(8)) {
		trace("produce %s%s: PERMANENT", e->id, dl ? " (dead-letter)" : "");
		stats[ST_PERMANENT]++;
		if (dl)
			e->dlperm_sess = M.sess;
		else
			e->perm_sess = M.sess;
		snprintf(errbuf, errlen, "Broker: Message size too large");
		return OBX_PRODUCE_PERMANENT;
	}
	if (!M.quiet && chance(2)) {
		trace("produce %s%s: TRANSIENT", e->id, dl ? " (dead-letter)" : "");
		stats[ST_TRANSIENT]++;
		M.expect_retry = true;
		snprintf(errbuf, errlen, "Local: Unknown partition");
		return OBX_PRODUCE_TRANSIENT;
	}
	/* accepted */
	if (!dl) {
		const struct mtxn *t = &M.tx[e->txn];
		int k = e->key_i;

		if (e->orig_sess == M.sess)
			violation("event %s produced twice in one session", e->id);
		e->orig_sess = M.sess;
		if (M.key_set[k] && M.key_sess[k] == M.sess &&
		    (t->commit_lsn < M.key_lsn[k] || (t->commit_lsn == M.key_lsn[k] && e->ord <= M.key_ord[k])))
			violation("key %s out of order: %s (commit %s, change %d) after an event of commit %s, "
			          "change %d",
			    e->key, e->id, LSN(t->commit_lsn), e->ord, LSN(M.key_lsn[k]), M.key_ord[k]);
		M.key_set[k] = true;
		M.key_sess[k] = M.sess;
		M.key_lsn[k] = t->commit_lsn;
		M.key_ord[k] = e->ord;
	} else {
		if (e->dl_sess == M.sess)
			violation("event %s dead-lettered twice in one session", e->id);
		e->dl_sess = M.sess;
	}
	keep_record(r, opaque, ei, dl);
	M.produced_total++;
	stats[ST_DEAD_LETTER] += dl;
	stats[ST_MESSAGES] += !dl && e->kind == EV_MSG;
	trace("produce %s%s%s: OK (%zu in flight)", e->id, dl ? " (dead-letter)" : "", bare ? " bare" : "",
	    M.nout);
	return OBX_PRODUCE_OK;
}

static void
m_note(void *ctx, enum obx_log_level level, const struct obx_logfields *f, const char *line)
{
	(void)ctx;
	(void)f;
	(void)level;
	stats[ST_BACKPRESSURE] += strncmp(line, "backpressure: ", 14) == 0;
	stats[ST_DRAIN_TIMEOUT] += strncmp(line, "stopping with ", 14) == 0;
	trace("core note: %.130s", line);
}

static const struct obx_core_ops ops = { m_produce, m_note, NULL };

/* ---- feeding the core ---- */

/* Two shapes of the table: as created, and with a column "note" in the middle. */
static const struct obx_pg_relcol relcols[2][6] = {
	{ { 1, "id", 25, -1 }, { 0, "aggregatetype", 25, -1 }, { 0, "aggregateid", 25, -1 }, { 0, "type", 25, -1 },
	    { 0, "payload", 3802, -1 } },
	{ { 1, "id", 25, -1 }, { 0, "note", 25, -1 }, { 0, "aggregatetype", 25, -1 }, { 0, "aggregateid", 25, -1 },
	    { 0, "type", 25, -1 }, { 0, "payload", 3802, -1 } },
};

static void
allow(obx_lsn l)
{
	M.allowed = grow(M.allowed, &M.allowedcap, M.nallowed + 1, sizeof(*M.allowed));
	M.allowed[M.nallowed++] = l;
}

/* Nothing open, nothing outstanding: a keepalive may move the flush position (docs/internals/design.md, invariant 5). */
static bool
model_idle(void)
{
	if (M.plain_open)
		return false;
	for (size_t i = 0; i < M.ntx; i++)
		if (M.tx[i].stream_sess == M.sess)
			return false;
	for (size_t i = 0; i < M.ncorder; i++) {
		const struct mtxn *t = &M.tx[M.corder[i]];

		if (t->fed_sess != M.sess)
			continue;
		for (size_t k = 0; k < t->nops; k++)
			if (published(&M.ev[t->ops[k]]) && M.ev[t->ops[k]].acked_sess != M.sess)
				return false;
	}
	return true;
}

static void
feed_one(void)
{
	struct witem w = M.wire[M.whead++];
	struct obx_pgmsg m;
	struct obx_pg_datum d[6];
	int n = 0;
	struct mtxn *t = w.type == 'B' || w.type == 'C' || w.type == 'c' || w.type == 'A' ? &M.tx[w.txn] : NULL;
	struct mev *e = w.ev >= 0 ? &M.ev[w.ev] : NULL;
	obx_lsn ds = 0;
	bool expect_off = false;

	memset(&m, 0, sizeof(m));
	m.type = w.type;
	m.xid = w.xid;
	switch (w.type) {
	case 'k':
		trace("read keepalive %s%s", LSN(w.lsn), w.flag ? " (reply)" : "");
		if (w.lsn > M.seen_max)
			M.seen_max = w.lsn;
		if (model_idle())
			allow(w.lsn);
		obx_core_keepalive(&core, w.lsn, w.flag);
		return;
	case 'R':
		m.u.relation.relid = w.rel ? RELID_AUDIT : RELID_OUTBOX;
		m.u.relation.nspname = w.rel ? "audit" : "public";
		m.u.relation.relname = "outbox";
		m.u.relation.natts = w.layout ? 6 : 5;
		m.u.relation.cols = relcols[w.layout];
		trace("read Relation %s.outbox (%d columns)", m.u.relation.nspname, m.u.relation.natts);
		break;
	case 'B':
		m.u.begin.final_lsn = t->commit_lsn;
		m.u.begin.commit_time = t->commit_time;
		m.u.begin.xid = t->xid;
		ds = w.lsn;
		trace("read Begin xid %" PRIu32 " (commit %s)", t->xid, LSN(t->commit_lsn));
		break;
	case 'C':
		m.u.commit.commit_lsn = t->commit_lsn;
		m.u.commit.end_lsn = t->end_lsn;
		m.u.commit.commit_time = t->commit_time;
		ds = t->end_lsn;
		trace("read Commit xid %" PRIu32 " %s..%s", t->xid, LSN(t->commit_lsn), LSN(t->end_lsn));
		break;
	case 'I':
		d[n++] = (struct obx_pg_datum){ 't', (const uint8_t *)e->id, (uint32_t)strlen(e->id) };
		if (w.layout)
			d[n++] = (struct obx_pg_datum){ 'n', NULL, 0 };
		d[n++] = (struct obx_pg_datum){ 't', (const uint8_t *)e->atype, (uint32_t)strlen(e->atype) };
		d[n++] = (struct obx_pg_datum){ 't', (const uint8_t *)e->key, (uint32_t)strlen(e->key) };
		d[n++] = (struct obx_pg_datum){ 't', (const uint8_t *)e->type, (uint32_t)strlen(e->type) };
		d[n++] = (struct obx_pg_datum){ 't', (const uint8_t *)e->payload, (uint32_t)strlen(e->payload) };
		m.u.insert.relid = e->kind == EV_NOISE_ROW ? RELID_AUDIT : RELID_OUTBOX;
		m.u.insert.tuple = (struct obx_pg_tuple){ (uint16_t)n, d };
		ds = w.lsn;
		trace("read Insert %s%s xid %" PRIu32 " key %s%s%s", e->kind == EV_NOISE_ROW ? "audit " : "",
		    e->id, w.xid, e->key, w.stream ? " (stream)" : "", e->aborted ? " [rolls back]" : "");
		break;
	case 'M':
		m.u.message.flags = e->kind == EV_NONTX_MSG ? 0 : 1;
		m.u.message.lsn = w.lsn;
		m.u.message.prefix = e->kind == EV_NOISE_MSG ? "other" : "outboxd";
		m.u.message.content = (const uint8_t *)e->content;
		m.u.message.len = (uint32_t)strlen(e->content);
		ds = w.lsn;
		trace("read Message %s %s%s xid %" PRIu32 "%s%s", m.u.message.prefix, e->id,
		    e->kind == EV_NONTX_MSG ? " (non-transactional)" : "", w.xid, w.stream ? " (stream)" : "",
		    e->aborted ? " [rolls back]" : "");
		if (w.stream && e->kind == EV_MSG && cfg.messages) {
			struct mtxn *mt = &M.tx[w.txn];

			if (mt->msgs_sess != M.sess) {
				mt->msgs_sess = M.sess;
				mt->msgs_fed = 0;
			}
			mt->msgs_fed++;
		}
		break;
	case 'S':
		m.u.stream_start.xid = w.xid;
		m.u.stream_start.first_segment = w.flag;
		ds = w.lsn;
		trace("read Stream Start xid %" PRIu32 "%s", w.xid, w.flag ? " (first)" : "");
		break;
	case 'E':
		trace("read Stream Stop");
		break;
	case 'c':
		stats[ST_STREAM_COMMIT]++;
		m.u.stream_commit.xid = t->xid;
		m.u.stream_commit.commit_lsn = t->commit_lsn;
		m.u.stream_commit.end_lsn = t->end_lsn;
		m.u.stream_commit.commit_time = t->commit_time;
		ds = t->end_lsn;
		trace("read Stream Commit xid %" PRIu32 " %s..%s", t->xid, LSN(t->commit_lsn), LSN(t->end_lsn));
		break;
	case 'A':
		m.u.stream_abort.xid = w.xid;
		m.u.stream_abort.subxid = w.sub;
		ds = w.lsn;
		expect_off = w.sub != w.xid && t->msgs_sess == M.sess && t->msgs_fed > 0;
		stats[w.sub == w.xid ? ST_STREAM_ABORT : ST_SAVEPOINT_ABORT]++;
		stats[ST_MSG_FALLBACK] += expect_off;
		trace("read Stream Abort xid %" PRIu32 " subxid %" PRIu32 "%s", w.xid, w.sub,
		    expect_off ? " (buffered messages)" : "");
		break;
	default:
		violation("model: unknown wire item %c", w.type);
		return;
	}
	obx_core_pgmsg(&core, &m, ds);
	if (w.type == 'B')
		M.plain_open = true;
	if (w.type == 'C')
		M.plain_open = false;
	if (w.type == 'S')
		M.tx[w.txn].stream_sess = M.sess;
	if (w.type == 'c' || (w.type == 'A' && w.sub == w.xid))
		t->stream_sess = 0;
	if (w.type == 'C' || w.type == 'c') {
		t->fed_sess = M.sess;
		allow(t->end_lsn);
		if (t->end_lsn > M.seen_max)
			M.seen_max = t->end_lsn;
		if (t->end_lsn > M.fed_commit_end)
			M.fed_commit_end = t->end_lsn;
	}
	if (w.type == 'A' && w.sub == w.xid)
		t->msgs_fed = 0;
	if (expect_off) {
		M.expect_off = true;
		if (obx_core_ended(&core, NULL) != OBX_CORE_END_RETRY || obx_core_streaming_allowed(&core))
			violation("a savepoint of streamed xid %" PRIu32
			          " holding %d buffered message(s) rolled back: "
			          "expected the session to end RETRY with streaming off (ended %d, streaming %s)",
			    w.xid, t->msgs_fed, (int)obx_core_ended(&core, NULL),
			    obx_core_streaming_allowed(&core) ? "allowed" : "off");
	}
}

static void
read_some(int n)
{
	while (n-- > 0 && wire_len() > 0 && obx_core_can_read(&core) && !M.failed)
		feed_one();
}

/* ---- delivery reports ---- */

static void
deliver(size_t i, enum obx_report_status st)
{
	struct outrec o = M.out[i];
	struct obx_header hs[MAXHDR];
	struct obx_report r;
	struct mev *e = &M.ev[o.ev];
	bool current = o.sess == M.sess && core.active;
	static const char *const names[] = { "OK", "PURGED", "TRANSIENT", "PERMANENT" };

	M.out[i] = M.out[--M.nout];
	for (size_t k = 0; k < o.nh; k++)
		hs[k] = (struct obx_header){ o.hname[k], o.hnull[k] ? NULL : o.hval[k], o.hlen[k] };
	memset(&r, 0, sizeof(r));
	r.opaque = o.opaque;
	r.status = st;
	r.error = st == OBX_REPORT_PERMANENT ? "Broker: Topic authorization failed" : "Local: Message timed out";
	r.error_name = st == OBX_REPORT_PERMANENT ? "TOPIC_AUTHORIZATION_FAILED" : "_MSG_TIMED_OUT";
	r.record = (struct obx_record){ o.topic, o.has_key ? o.key : NULL, o.keylen, o.has_value ? o.value : NULL,
		o.len, 0, hs, o.nh };
	r.now_us = M.commit_clock + 1000;
	trace("report %s%s: %s%s", e->id, o.dl ? " (dead-letter)" : "", names[st],
	    current ? "" : " (an earlier session's)");
	if (st == OBX_REPORT_OK)
		e->kafka = true;
	stats[ST_LATE_REPORT] += !current;
	stats[ST_PERMANENT] += current && st == OBX_REPORT_PERMANENT;
	stats[ST_TRANSIENT] += current && st == OBX_REPORT_TRANSIENT;
	if (current) {
		if (st == OBX_REPORT_OK)
			e->acked_sess = M.sess;
		else if (st == OBX_REPORT_PERMANENT)
			e->perm_sess = M.sess;
		else if (st == OBX_REPORT_TRANSIENT)
			M.expect_retry = true;
	}
	M.reports_total++;
	obx_core_report(&core, &r);
}

static void
report_some(int n)
{
	while (n-- > 0 && M.nout > 0 && !M.failed) {
		size_t i = below((uint32_t)M.nout);
		const struct outrec *o = &M.out[i];
		enum obx_report_status st = OBX_REPORT_OK;
		uint32_t r = below(1000);

		if (o->sess !=
		    M.sess) /* docs/internals/design.md, invariant 8: whatever it says, it must change nothing now */
			st = r < 400 ? OBX_REPORT_OK :
			    r < 700  ? OBX_REPORT_PURGED :
			    r < 850  ? OBX_REPORT_TRANSIENT :
			               OBX_REPORT_PERMANENT;
		else if (M.quiet || o->dl)
			st = OBX_REPORT_OK;
		else if (M.dead_letter && r < 25)
			st = OBX_REPORT_PERMANENT;
		else if (r >= 990)
			st = OBX_REPORT_TRANSIENT;
		deliver(i, st);
	}
}

/* ---- the session, as the relay's loop runs it ---- */

static void
confirm(obx_lsn flush)
{
	if (flush > M.confirmed)
		M.confirmed = flush;
	if (M.nhist == 0 || M.hist[M.nhist - 1] != flush) {
		M.hist = grow(M.hist, &M.histcap, M.nhist + 1, sizeof(*M.hist));
		M.hist[M.nhist++] = flush;
	}
}

/* Invariant 4 and its neighbours, for a flush position the core would send. */
static void
check_flush(obx_lsn flush, obx_lsn write, const char *when)
{
	if (flush < M.last_flush)
		violation("%s: flush went back from %s to %s", when, LSN(M.last_flush), LSN(flush));
	if (flush < M.sess_start)
		violation("%s: flush %s before the session's start %s", when, LSN(flush), LSN(M.sess_start));
	if (flush > M.seen_max)
		violation("%s: flush %s beyond anything the server sent (%s)", when, LSN(flush), LSN(M.seen_max));
	if (write < flush)
		violation("%s: write %s behind flush %s", when, LSN(write), LSN(flush));
	M.last_flush = flush;
	{
		size_t i = M.nallowed;

		while (i > 0 && M.allowed[i - 1] > flush)
			i--;
		if (i == 0 || M.allowed[i - 1] != flush)
			violation(
			    "%s: flush %s is neither the end of a transaction read nor a keepalive read while "
			    "nothing was open or outstanding (invariant 5)",
			    when, LSN(flush));
	}
	for (; M.verified < M.ncorder && !M.failed; M.verified++) {
		const struct mtxn *t = &M.tx[M.corder[M.verified]];

		if (t->commit_lsn < M.sess_start)
			continue;
		if (t->end_lsn > flush)
			break;
		for (size_t i = 0; i < t->nops && t->npub > 0; i++) {
			const struct mev *e = &M.ev[t->ops[i]];

			if (published(e) && e->acked_sess != M.sess) {
				violation("%s: flush %s passes the end %s of xid %" PRIu32
				          " whose event %s the broker has "
				          "not acknowledged in this session%s",
				    when, LSN(flush), LSN(t->end_lsn), t->xid, e->id,
				    e->orig_sess == M.sess || e->dl_sess == M.sess ?
				        " (produced, report pending)" :
				        " (never produced in this session)");
				return;
			}
		}
	}
}

static void
session_open(void)
{
	obx_lsn from = M.confirmed;
	int rc;

	if (M.nhist > 1 && chance(80)) {
		from = M.hist[below((uint32_t)M.nhist)]; /* the server lost the latest confirmation */
		stats[ST_CRASH_REWIND] += from < M.confirmed;
		M.confirmed = from;
	}
	M.sess++;
	M.sessions_total++;
	M.sess_start = M.seen_max = M.last_flush = M.fed_commit_end = from;
	M.verified = 0;
	M.nallowed = 0;
	allow(from);
	M.plain_open = false;
	M.expect_retry = M.expect_off = false;
	M.streaming = obx_core_streaming_allowed(&core);
	rc = obx_core_session_start(&core, from, 2, M.status_interval, M.now);
	assert_int_equal(rc, 0);
	server_replay(from);
	/* reports of the previous session served after this one began: never an ack now */
	for (size_t i = 0; i < M.nout && !M.failed;) {
		if (M.out[i].sess != M.sess && chance(500))
			deliver(i, (enum obx_report_status)below(4));
		else
			i++;
	}
}

static void
core_new(void)
{
	assert_int_equal(obx_core_init(&core, &cfg, &ops, NULL, &met), 0);
}

/* The session ended: check why, confirm what is safe, and start the next (or a new process). */
static void
session_close(void)
{
	const char *reason;
	enum obx_core_end end = obx_core_ended(&core, &reason);
	obx_lsn w, f;
	bool reply;

	trace("session %d ends (%d): %s", M.sess, (int)end, reason);
	switch (end) {
	case OBX_CORE_RUNNING:
		return;
	case OBX_CORE_END_FATAL:
		violation("session ended FATAL: %s", reason);
		return;
	case OBX_CORE_END_STOP:
		if (M.signals == 0)
			violation("session stopped without a signal: %s", reason);
		break;
	case OBX_CORE_END_RETRY:
		stats[ST_BUFFER_FALLBACK] += strstr(reason, "stream_buffer") != NULL;
		if (!M.expect_retry && !M.expect_off &&
		    !(strstr(reason, "stream_buffer") != NULL && !obx_core_streaming_allowed(&core)))
			violation("session ended RETRY without a cause the test made: %s", reason);
		break;
	}
	(void)obx_core_status_due(&core, M.now, &w, &f, &reply);
	check_flush(f, w, "final status");
	if (end == OBX_CORE_END_STOP && M.signals == 1 && core.ack.outstanding == 0 && f < M.fed_commit_end)
		violation("drained stop confirms only %s, but every transaction read (to %s) was acknowledged",
		    LSN(f), LSN(M.fed_commit_end));
	if (end == OBX_CORE_END_STOP && M.signals == 1 &&
	    M.now < core.stops.first_ms + OBX_CORE_DRAIN_TIMEOUT_MS && M.plain_open)
		violation("drained stop inside an open transaction (Begin read, Commit not yet)");
	/* the broker answers within a few steps here: a drain that needs its 30 s is stuck */
	if (end == OBX_CORE_END_STOP && M.signals == 1 && M.now >= core.stops.first_ms + OBX_CORE_DRAIN_TIMEOUT_MS)
		violation("the drain ran into its %d s deadline although the broker kept answering",
		    OBX_CORE_DRAIN_TIMEOUT_MS / 1000);
	obx_core_status_sent(&core, f, M.now);
	confirm(f);
	obx_core_session_end(&core);
	/* the producer closes: some reports come now (ignored), some after the next session began */
	for (size_t i = 0; i < M.nout && !M.failed;) {
		uint32_t r = below(10);

		if (M.out[i].sess == M.sess && r < 8)
			deliver(i,
			    r < 4     ? OBX_REPORT_OK :
			        r < 6 ? OBX_REPORT_PURGED :
			                (enum obx_report_status)below(4));
		else
			i++;
	}
	if (end == OBX_CORE_END_STOP) {
		/* a new process: nothing of the old producer arrives */
		trace("process restarts");
		stats[ST_SIGNAL_STOP]++;
		obx_core_reset(&core);
		core_new();
		M.nout = 0;
		M.signals = 0;
	}
	if (!M.failed)
		session_open();
}

static void
after_step(void)
{
	obx_lsn w, f;
	bool reply;

	if (M.failed)
		return;
	if (obx_core_wait_ms(&core, M.now) < 0)
		violation("obx_core_wait_ms() < 0");
	if (obx_core_ended(&core, NULL) != OBX_CORE_RUNNING) {
		session_close();
		return;
	}
	if (obx_core_status_due(&core, M.now, &w, &f, &reply)) {
		if (obx_core_wait_ms(&core, M.now) != 0)
			violation("a status update is due, yet obx_core_wait_ms() says %" PRId64 " ms",
			    obx_core_wait_ms(&core, M.now));
		check_flush(f, w, "status update");
		obx_core_status_sent(&core, f, M.now);
		confirm(f);
	} else {
		check_flush(f, w, "flush position");
	}
	{
		size_t mine = 0, bytes = 0, largest = 0;

		for (size_t i = 0; i < M.nout; i++) {
			if (M.out[i].sess != M.sess)
				continue;
			mine++;
			bytes += M.out[i].len + M.out[i].keylen;
			if (M.out[i].len + M.out[i].keylen > largest)
				largest = M.out[i].len + M.out[i].keylen;
		}
		if ((long long)mine > M.max_inflight)
			violation("%zu records in flight, [delivery] max_inflight is %lld", mine, M.max_inflight);
		/* reading stops at the cap: one record may cross it */
		if ((long long)(bytes - largest) >= M.max_inflight_bytes)
			violation("%zu bytes in flight, [delivery] max_inflight_bytes is %lld", bytes,
			    M.max_inflight_bytes);
	}
}

static void
step(void)
{
	uint32_t r = below(1000);

	if (r < 300) {
		server_action();
	} else if (r < 580) {
		read_some(1 + (int)below(8));
	} else if (r < 790) {
		report_some(1 + (int)below(4));
	} else if (r < 900) {
		obx_core_pump(&core, M.now);
	} else if (r < 930) {
		M.now += 50 + below(400);
	} else if (r < 960) {
		M.qfull_phase = !M.qfull_phase;
		trace("producer queue %s", M.qfull_phase ? "filling up" : "drained");
	} else if (r < 962 && chance(400)) {
		M.signals++;
		trace("signal %d", M.signals);
		obx_core_signal(&core, M.now);
	} else {
		obx_core_pump(&core, M.now);
	}
	M.now += below(15);
	after_step();
}

static void
set(const char *section, const char *key, const char *value)
{
	char err[256];

	if (obx_config_set(&cfg, section, key, value, "model", false, err, sizeof(err)) != 0)
		fail_msg("config %s.%s = %s: %s", section, key, value, err);
}

static void
model_free(void)
{
	for (size_t i = 0; i < M.ntx; i++)
		free(M.tx[i].ops);
	free(M.tx);
	free(M.ev);
	free(M.corder);
	free(M.wire);
	free(M.out);
	free(M.hist);
	free(M.allowed);
}

/* Everything committed reaches the broker and the flush position reaches the last commit. */
static void
drain(void)
{
	obx_lsn w, f;
	bool reply;
	int ti, rounds;

	M.quiet = true;
	M.qfull_phase = false;
	while ((ti = pick_open_big()) >= 0)
		gen_big_commit(ti);
	gen_keepalive();
	for (rounds = 0; rounds < 20000 && !M.failed; rounds++) {
		M.step++;
		read_some(1000);
		if (!M.failed)
			report_some((int)M.nout);
		if (!M.failed)
			obx_core_pump(&core, M.now);
		M.now += 5;
		after_step();
		if (wire_len() == 0 && M.nout == 0 && !obx_dlv_pending(&core.dlv) && !core.replaying &&
		    !core.in_txn && obx_core_ended(&core, NULL) == OBX_CORE_RUNNING && obx_core_can_read(&core))
			break;
	}
	if (M.failed)
		return;
	if (rounds == 20000) {
		violation("drain did not settle: wire %zu, in flight %zu, pending %zu", wire_len(), M.nout,
		    core.dlv.npend);
		return;
	}
	(void)obx_core_status_due(&core, M.now, &w, &f, &reply);
	check_flush(f, w, "after the drain");
	if (f < M.last_commit_end)
		violation("after the drain the flush position %s is short of the last commit's end %s", LSN(f),
		    LSN(M.last_commit_end));
	for (size_t i = 0; i < M.ncorder && !M.failed; i++) {
		const struct mtxn *t = &M.tx[M.corder[i]];

		for (size_t k = 0; k < t->nops; k++) {
			const struct mev *e = &M.ev[t->ops[k]];

			if (published(e) && !e->kafka) {
				violation("committed event %s (xid %" PRIu32
				          ", commit %s) never reached the broker",
				    e->id, t->xid, LSN(t->commit_lsn));
				break;
			}
		}
	}
	/* idle: the flush position follows the WAL end */
	M.walpos += 0x80;
	gen_keepalive();
	read_some(10);
	after_step();
	(void)obx_core_status_due(&core, M.now, &w, &f, &reply);
	if (!M.failed && f != M.walpos)
		violation("idle after the drain, a keepalive at %s left the flush position at %s", LSN(M.walpos),
		    LSN(f));
	/* a stop signal now stops at once: nothing is outstanding */
	if (!M.failed && chance(500)) {
		obx_core_signal(&core, M.now);
		obx_core_pump(&core, M.now);
		if (obx_core_ended(&core, NULL) != OBX_CORE_END_STOP)
			violation("a signal with nothing outstanding did not stop the session");
	}
}

static void
run_seed(uint64_t seed, int steps)
{
	char buf[16];

	memset(&M, 0, sizeof(M));
	M.seed = seed;
	M.verbose = getenv("OBX_MODEL_TRACE") != NULL && strcmp(getenv("OBX_MODEL_TRACE"), "0") != 0;
	rng = seed * 0x2545f4914f6cdd1dULL + 1;
	memset(&met, 0, sizeof(met));
	obx_config_init(&cfg);
	set("source", "streaming", chance(850) ? "on" : "off");
	set("source", "messages", chance(750) ? "on" : "off");
	if (chance(150)) {
		snprintf(buf, sizeof(buf), "%u", 1024 + below(3072));
		set("source", "stream_buffer", buf);
	}
	M.max_inflight = chance(800) ? 3 + below(6) : 1000;
	snprintf(buf, sizeof(buf), "%lld", M.max_inflight);
	set("delivery", "max_inflight", buf);
	M.max_inflight_bytes = cfg.max_inflight_bytes;
	if (chance(300)) {
		/* the byte cap engages: large payloads, a small cap */
		M.pad = 60 + below(100);
		M.max_inflight_bytes = 1024 + below(512);
		snprintf(buf, sizeof(buf), "%lld", M.max_inflight_bytes);
		set("delivery", "max_inflight_bytes", buf);
	}
	M.dead_letter = chance(800);
	set("delivery", "on_error", M.dead_letter ? "dead_letter" : "stop");
	M.status_interval = 100 + (int)below(900);
	M.qfull_pm = 200 + below(600);
	M.walpos = 0x1000000;
	M.next_xid = 700;
	M.now = 1000;
	M.commit_clock = 800000000000LL;
	M.confirmed = M.walpos;
	trace("seed %" PRIu64 ": streaming %s, messages %s, stream_buffer %lld, max_inflight %lld, "
	      "max_inflight_bytes %lld, on_error %s",
	    seed, cfg.streaming ? "on" : "off", cfg.messages ? "on" : "off", cfg.stream_buffer_bytes,
	    M.max_inflight, M.max_inflight_bytes, M.dead_letter ? "dead_letter" : "stop");
	core_new();
	session_open();
	for (M.step = 1; M.step <= steps && !M.failed; M.step++)
		step();
	M.steps_total += steps;
	if (!M.failed)
		drain();
	obx_core_reset(&core);
	obx_config_reset(&cfg);
	model_free();
}

static void
test_model(void **state)
{
	const char *one = getenv("OBX_MODEL_SEED"), *many = getenv("OBX_MODEL_SEEDS");
	const char *st = getenv("OBX_MODEL_STEPS");
	uint64_t first = 1, last = DEFAULT_SEEDS;
	int steps = st != NULL ? (int)strtonum(st, 0, INT_MAX, NULL) : DEFAULT_STEPS;
	int failures = 0;
	long steps_total = 0, produced = 0, sessions = 0, reports = 0;

	(void)state;
	if (one != NULL)
		first = last = (uint64_t)strtonum(one, 0, LLONG_MAX, NULL);
	else if (many != NULL)
		last = (uint64_t)strtonum(many, 0, LLONG_MAX, NULL);
	for (uint64_t s = first; s <= last; s++) {
		run_seed(s, steps);
		steps_total += M.steps_total;
		produced += M.produced_total;
		sessions += M.sessions_total;
		reports += M.reports_total;
		if (M.failed && ++failures >= 20)
			break;
	}
	print_message("relaycore model: seeds %" PRIu64 "..%" PRIu64 ", %ld steps, %ld sessions, %ld records "
	              "produced, %ld reports, %d failing seed(s)\n",
	    first, last, steps_total, sessions, produced, reports, failures);
	for (int i = 0; i < ST_NSTATS; i++)
		print_message("  %-20s %ld\n", stat_names[i], stats[i]);
	if (failures > 0)
		fail_msg("%d seed(s) broke the model (see above)", failures);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_model),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
