/*
 * streambuf.h - outbox rows of streamed, still uncommitted transactions
 * (pure).
 *
 * With streaming on, the server sends a large transaction's changes before
 * it commits, in blocks (Stream Start .. Stream Stop) that may interleave
 * with other transactions.  Each row is kept, keyed by the top-level
 * transaction of its block and tagged with the (sub)transaction id its
 * message carries, until Stream Commit hands the rows over in insertion
 * order or Stream Abort discards them: the whole transaction when subxid
 * equals xid, else only that subtransaction's rows (a rolled-back
 * savepoint).
 *
 * Rows and the relation they belong to are copies owned by the buffer; the
 * total size is capped so a huge transaction cannot exhaust memory.
 */
#ifndef OBX_STREAMBUF_H
#define OBX_STREAMBUF_H

#include <stddef.h>
#include <stdint.h>

#include "obx/core/pgoutput.h"
#include "obx/core/relcache.h"

struct obx_sbuf_row {
	uint32_t subxid;
	uint32_t rel;              /* index into the transaction's rels; OBX_SBUF_MESSAGE for a message */
	struct obx_pg_tuple tuple; /* columns and their bytes live in one allocation */
	size_t size;
};

/* The rel index of a row that is a logical decoding message (one column: its content). */
#define OBX_SBUF_MESSAGE UINT32_MAX

struct obx_sbuf_txn {
	uint32_t xid;
	size_t nmessages; /* rows that are logical decoding messages */
	struct obx_sbuf_row *rows;
	size_t nrows, cap;
	struct obx_rel *rels; /* copies; consecutive rows share one */
	size_t nrels;
};

struct obx_streambuf {
	struct obx_sbuf_txn *txns;
	size_t n;
	size_t bytes; /* what the rows and copies take */
	size_t limit;
};

/* An empty buffer holding at most limit bytes.  Pair with obx_streambuf_reset(). */
void obx_streambuf_init(struct obx_streambuf *b, size_t limit);
/* Frees everything; b may be re-initialised. */
void obx_streambuf_reset(struct obx_streambuf *b);

/* Stream Start for xid: the transaction is in progress from now on.  Returns 0 or OBX_ENOMEM. */
int obx_streambuf_start(struct obx_streambuf *b, uint32_t xid);

/*
 * Keeps a copy of one row of rel, inserted by (sub)transaction subxid of
 * the streamed transaction xid.  Returns 0; OBX_ESTATE when xid was never
 * started; OBX_EFULL when the copy would pass the limit (nothing kept);
 * OBX_ENOMEM.
 */
int obx_streambuf_add(struct obx_streambuf *b, uint32_t xid, uint32_t subxid, const struct obx_rel *rel,
    const struct obx_pg_tuple *tuple);

/*
 * Keeps a copy of a transactional logical decoding message's content, as a
 * row with rel OBX_SBUF_MESSAGE and one column.  pgoutput tags such a
 * message with the top-level xid of the streamed transaction, never with
 * the subtransaction that wrote it, so a savepoint's Stream Abort cannot
 * find it: the caller checks nmessages (obx_streambuf_get) before trusting
 * a subtransaction's abort.  Returns as obx_streambuf_add().
 */
int obx_streambuf_add_message(struct obx_streambuf *b, uint32_t xid, uint32_t subxid, const uint8_t *content,
    uint32_t len);

/*
 * Stream Abort: discards the whole transaction when subxid == xid, else the
 * rows of subxid only.  Returns the number of rows discarded; an unknown
 * xid discards nothing (a transaction with no block of ours).
 */
size_t obx_streambuf_abort(struct obx_streambuf *b, uint32_t xid, uint32_t subxid);

/*
 * Stream Commit: returns the transaction (borrowed until obx_streambuf_drop),
 * or NULL when xid was never started.
 */
const struct obx_sbuf_txn *obx_streambuf_get(const struct obx_streambuf *b, uint32_t xid);

/* Forgets the transaction xid and frees its rows.  Unknown xid: no-op. */
void obx_streambuf_drop(struct obx_streambuf *b, uint32_t xid);

/* The number of streamed transactions in progress. */
size_t obx_streambuf_open(const struct obx_streambuf *b);

#endif
