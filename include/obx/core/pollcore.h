/*
 * pollcore.h - polling mode's decisions for one claimed batch (pure).
 *
 * docs/internals/design.md, "Polling mode", gives the cycle: claim, produce, wait for
 * every delivery report, record the failures, mark the acknowledged rows
 * published and COMMIT.  This module decides each step's part for the rows
 * of one claim: which row is sent, held back behind its key, dead-lettered,
 * given up or failed; what a delivery report does to a row (reports of an
 * earlier batch never count); when the wait ends (a second stop signal, or
 * the drain deadline on the caller's clock); what is marked published now
 * and at the COMMIT, what is recorded as failed (attempts + 1, backoff) and
 * what stays pending.  It does no I/O, reads no clock and writes no log
 * line: poll.c turns libpq results and librdkafka calls into its inputs and
 * performs what it says.
 *
 * Lifetime: a zeroed struct obx_pollcore is ready; obx_pollcore_begin()
 * starts each batch, obx_pollcore_end() drops it (after the COMMIT, or
 * without marking anything when the session failed: the rows stay pending),
 * obx_pollcore_reset() frees everything at exit.
 */
#ifndef OBX_POLLCORE_H
#define OBX_POLLCORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"

/* Acknowledged rows worth an early marking UPDATE while the last reports are awaited. */
#define OBX_POLLCORE_MARK_EARLY_MIN 64

/*
 * How many rows one claim sends at most: [poll] batch, cut to [delivery]
 * max_inflight, the in-flight bound of every source (the producer's queue
 * holds twice that many records).  The claim locks up to [poll] batch rows,
 * so that rows held back behind a failing row of their key do not crowd the
 * other keys out; those past the cut stay pending for the next claim.
 */
long long obx_poll_claim_rows(const struct obx_config *cfg);

/* What polling does with one claimed row (obx_poll_row_action()). */
enum obx_poll_action {
	OBX_POLL_SEND,        /* produce its record */
	OBX_POLL_HOLD,        /* leave it pending, untouched: an earlier row of its key failed in this batch */
	OBX_POLL_FAIL,        /* it cannot become a record: an attempt, retried after the backoff */
	OBX_POLL_DEAD_LETTER, /* attempts exhausted, [poll] exhausted = dead_letter: its copy goes aside */
	OBX_POLL_GIVE_UP,     /* attempts exhausted, [poll] exhausted = mark: marked without sending */
};

/*
 * The decision for a claimed row that has failed attempts times before:
 * held back when an earlier row of its key failed in this batch (per-key
 * order), else exhausted past [poll] max_attempts (dead-letter or mark,
 * as [poll] exhausted says), else a failure when it cannot become a record
 * (buildable false), else sent.
 */
enum obx_poll_action obx_poll_row_action(const struct obx_config *cfg, long long attempts, bool held,
    bool buildable);

/*
 * The keys of the rows that failed in one batch, which hold back the later
 * rows of the same key.  Keys are borrowed (the batch's result) and
 * compared as bytes; a NULL key holds nothing back.
 */
struct obx_poll_holds {
	const char **keys;
	size_t *lens;
	size_t n, cap;
};

/* Adds key (len bytes).  Returns 0 or OBX_ENOMEM. */
int obx_poll_hold_add(struct obx_poll_holds *h, const char *key, size_t len);
/* True when a row of key (len bytes) is held back. */
bool obx_poll_held(const struct obx_poll_holds *h, const char *key, size_t len);
/* Forgets the keys and frees what h owns (a zeroed one is a no-op). */
void obx_poll_holds_reset(struct obx_poll_holds *h);

/* Where a claimed row stands in its batch, and so what the COMMIT does with it. */
enum obx_prow_state {
	OBX_PROW_SKIPPED,  /* neither produced nor marked: stays pending (held back, or unsent) */
	OBX_PROW_INFLIGHT, /* handed to the producer: stays pending unless its report comes */
	OBX_PROW_ACKED,    /* acknowledged: marked published */
	OBX_PROW_FAILED,   /* recorded as a failure: attempts + 1, last_error, backoff */
	OBX_PROW_GIVEN_UP, /* dead-letter copy acknowledged, or mark-only: published with last_error */
	OBX_PROW_NSTATES
};

/* One claimed row.  Read-only for the caller. */
struct obx_prow {
	int64_t seq;
	long long attempts; /* failed attempts recorded before this claim */
	enum obx_prow_state state;
	bool dead_letter; /* this batch sends its dead-letter copy */
	bool marked;      /* acknowledged and already taken by a marking statement */
	char *error;      /* owned: why it failed, or what became of it; NULL when none */
	const char *key;  /* borrowed (see obx_pollcore_add()); NULL when the key is NULL */
	size_t keylen;
};

/* The batch's answer to a delivery report (obx_pollcore_report()). */
enum obx_poll_report {
	OBX_POLL_REPORT_STALE,         /* of an earlier batch or a row not in flight: changes nothing */
	OBX_POLL_REPORT_ACKED,         /* the row's record was acknowledged */
	OBX_POLL_REPORT_DEAD_LETTERED, /* the row's dead-letter copy was acknowledged: given up */
	OBX_POLL_REPORT_FAILED,        /* the broker refused it: recorded as a failure */
};

/* How the wait for the batch's reports goes on (obx_pollcore_drain()). */
enum obx_poll_drain {
	OBX_POLL_DRAIN_WAIT,     /* keep waiting */
	OBX_POLL_DRAIN_ABANDON,  /* a second stop signal: nothing more is marked, the batch is dropped */
	OBX_POLL_DRAIN_DEADLINE, /* past the drain deadline: mark the acknowledged, the rest stays pending */
};

/* Why a row failed in the produce step (obx_pollcore_failed()). */
enum obx_poll_failure {
	OBX_POLL_FAILED_BUILD,       /* it cannot become a record */
	OBX_POLL_FAILED_PRODUCE,     /* the produce call refused its record */
	OBX_POLL_FAILED_DEAD_LETTER, /* its dead-letter copy could not be produced */
};

/*
 * One claimed batch.  Fields are read-only for the caller; cfg is borrowed
 * from obx_pollcore_begin() until the batch ends.
 */
struct obx_pollcore {
	const struct obx_config *cfg;
	struct obx_prow *rows;
	size_t nrows, cap;
	size_t next;        /* the next row obx_pollcore_next() looks at */
	size_t outstanding; /* rows in flight */
	uint32_t gen;       /* per batch: reports of an earlier one are stale */
	int signals;        /* stop signals so far (obx_pollcore_stop()) */
	int64_t stop_ms;    /* when the first came, on the caller's clock */
	struct obx_poll_holds holds;
};

/*
 * Starts a batch for cfg with room for n rows (obx_pollcore_add() grows
 * it), dropping the previous one; reports of every earlier batch are stale
 * from now on.  Returns 0 or OBX_ENOMEM.
 */
int obx_pollcore_begin(struct obx_pollcore *pc, const struct obx_config *cfg, size_t n);

/*
 * Appends a claimed row, in seq order: its seq, the attempts recorded, its
 * key (len bytes, NULL for a NULL key; borrowed, read by obx_pollcore_next()
 * and obx_pollcore_failed() of this batch only) and its last_error (copied;
 * may be NULL).  Returns 0 or OBX_ENOMEM.
 */
int obx_pollcore_add(struct obx_pollcore *pc, int64_t seq, long long attempts, const char *key, size_t keylen,
    const char *last_error);

/* Row i (< pc->nrows): a borrowed pointer valid until the batch ends. */
const struct obx_prow *obx_pollcore_row(const struct obx_pollcore *pc, size_t i);

/*
 * The next row to decide, in seq order, in *i.  Rows held back behind a
 * row of their key that failed in this batch are passed over (they stay
 * pending).  Returns true with *i set, or false once every row was looked
 * at or a stop signal came (the rest stays pending, unsent).
 */
bool obx_pollcore_next(struct obx_pollcore *pc, size_t *i);

/*
 * What to do with row i, which obx_pollcore_next() gave and which can
 * become a record when buildable: OBX_POLL_SEND, _FAIL, _DEAD_LETTER or
 * _GIVE_UP (never _HOLD).  Changes nothing.
 */
enum obx_poll_action obx_pollcore_decide(const struct obx_pollcore *pc, size_t i, bool buildable);

/*
 * The produce call's opaque for row i (its dead-letter copy when
 * dead_letter): the one layout of every source (delivery.h), with the
 * batch as generation and the row as ticket.
 */
uint64_t obx_pollcore_opaque(const struct obx_pollcore *pc, size_t i, bool dead_letter);

/* The producer took row i's record (or its dead-letter copy): in flight. */
void obx_pollcore_sent(struct obx_pollcore *pc, size_t i, bool dead_letter);

/*
 * Row i failed in the produce step, for reason (copied).  A row that cannot
 * be built or whose produce call failed holds back the later rows of its
 * key in this batch; a dead-letter copy that could not be produced does
 * not (the row is exhausted and goes aside again on its next claim).
 * Returns 0 or OBX_ENOMEM.
 */
int obx_pollcore_failed(struct obx_pollcore *pc, size_t i, enum obx_poll_failure what, const char *reason);

/*
 * Row i's topic does not exist (yet) and the wait for it goes on
 * ([delivery] missing_topic_timeout, delivery.h): the row stays pending,
 * no attempt counted, whether it was in flight or not yet sent, and holds
 * back the later rows of its key in this batch.  Returns 0 or OBX_ENOMEM.
 */
int obx_pollcore_wait_topic(struct obx_pollcore *pc, size_t i);

/* Row i is given up ([poll] exhausted = mark): published without a send, with reason in last_error. */
void obx_pollcore_give_up(struct obx_pollcore *pc, size_t i);

/*
 * A delivery report for opaque: acknowledged when err_name is NULL, else
 * refused with librdkafka's error name and text.  Returns what it did to
 * the row; a report of an earlier batch, of a row past the batch or of a
 * row not in flight is OBX_POLL_REPORT_STALE and changes nothing.
 */
enum obx_poll_report obx_pollcore_report(struct obx_pollcore *pc, uint64_t opaque, const char *err_name,
    const char *err_text);

/*
 * True when row i's key is held back in this batch: an earlier row of it
 * failed (in the produce step, or in a delivery report: no later row of the
 * key reaches the broker after that in this batch), or waits for its topic.
 */
bool obx_pollcore_key_held(const struct obx_pollcore *pc, size_t i);

/*
 * Row i did not reach the broker after all (it waited in the delivery
 * policy's pending queue behind a row of its key that failed since): it
 * stays pending, no attempt counted.
 */
void obx_pollcore_unsent(struct obx_pollcore *pc, size_t i);

/* The caller's stop signals: how many so far, and when the first came (its monotonic ms). */
void obx_pollcore_stop(struct obx_pollcore *pc, int signals, int64_t first_ms);

/* True when no report of the batch is awaited. */
bool obx_pollcore_finished(const struct obx_pollcore *pc);

/*
 * While reports are awaited, at now_ms: go on, abandon the batch (a second
 * stop signal), or stop at the drain deadline (OBX_CORE_DRAIN_TIMEOUT_MS
 * after the first stop signal: what was acknowledged is marked, the rest
 * stays pending and none of it counts as an attempt).
 */
enum obx_poll_drain obx_pollcore_drain(const struct obx_pollcore *pc, int64_t now_ms);

/* True when at least OBX_POLLCORE_MARK_EARLY_MIN acknowledged rows are not taken for marking yet. */
bool obx_pollcore_mark_early(const struct obx_pollcore *pc);

/*
 * True when row i is acknowledged and not taken for marking yet; it is
 * then taken (a marking statement of this batch's transaction carries
 * it).  No other row is ever marked published this way.
 */
bool obx_pollcore_take_mark(struct obx_pollcore *pc, size_t i);

/*
 * The delay before row i's next attempt, for a row recorded as failed:
 * obx_poll_backoff_ms() of attempts + 1 with [poll] backoff_min and
 * backoff_max, jittered by rnd.
 */
int64_t obx_pollcore_backoff_ms(const struct obx_pollcore *pc, size_t i, uint32_t rnd);

/* Counts the rows in each state into count[OBX_PROW_NSTATES]. */
void obx_pollcore_count(const struct obx_pollcore *pc, size_t count[OBX_PROW_NSTATES]);

/* Drops the batch: its rows are forgotten and every report of it is stale. */
void obx_pollcore_end(struct obx_pollcore *pc);

/* Frees what pc owns and zeroes it, keeping nothing; a zeroed one is a no-op. */
void obx_pollcore_reset(struct obx_pollcore *pc);

/*
 * The delay before the next attempt of a row that has now failed attempts
 * times (1 for the first failure): min_ms doubled per earlier failure,
 * capped at max_ms, then "equal jitter": the result lies in [d/2, d] for
 * that capped d, decided by rnd (any 32-bit random value), so replicas that
 * failed together do not retry together.  Never below 1.
 */
int64_t obx_poll_backoff_ms(long long attempts, int min_ms, int max_ms, uint32_t rnd);

/*
 * Several tables in polling mode, fairly: one claim of up to [poll] batch
 * rows per table in turn, so a busy table never starves a quiet one; the
 * poll interval is waited only after a whole round claimed nothing.
 */
struct obx_poll_round {
	size_t cur;       /* the table the next claim reads */
	size_t n;         /* the tables */
	uint64_t claimed; /* rows this round moved so far */
};

void obx_poll_round_init(struct obx_poll_round *r, size_t n);

/*
 * After a claim of table r->cur that moved rows (obx_poll_cycle()'s count):
 * moves to the next table.  Sets *round_end when that ended a round (the
 * caller may read the table list again, then obx_poll_round_init() with its
 * new size); returns true when the round ended having moved nothing: wait
 * the poll interval.
 */
bool obx_poll_round_next(struct obx_poll_round *r, int rows, bool *round_end);

#endif
