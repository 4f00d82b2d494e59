/*
 * relaycore_stream.c - streamed transactions in the relay core: their rows
 * are buffered (core/streambuf.h) between Stream Start and Stream Stop, a
 * Stream Commit publishes them as one transaction, a Stream Abort discards
 * them (relaycore.h, relaycore_int.h).
 */
#include <inttypes.h>
#include <stdio.h>

#include "obx/core/err.h"
#include "obx/core/relaycore_int.h"

#define fail obx_core_fail

/* ---- streamed transactions ---- */

static void
streams_changed(struct obx_core *c)
{
	obx_ack_streams_open(&c->ack, obx_streambuf_open(&c->sbuf));
	c->m->stream_buffer_bytes = c->sbuf.bytes;
}

void
obx_rc_buffer_result(struct obx_core *c, int rc)
{
	char a[OBX_LSN_STRLEN];

	if (rc == OBX_EFULL) {
		/* the server then decodes the transaction whole, spilling to its own disk */
		c->streaming_off = true;
		fail(c, OBX_CORE_END_RETRY,
		    "streamed transaction %" PRIu32 " holds more outbox rows than "
		    "[source] stream_buffer (%lld bytes) after lsn %s; reconnecting with streaming off",
		    c->stream_xid, c->cfg->stream_buffer_bytes, obx_lsn_format(c->received, a, sizeof(a)));
		return;
	}
	if (rc != 0)
		fail(c, OBX_CORE_END_FATAL,
		    rc == OBX_ENOMEM ? "out of memory" :
		                       "streamed change for transaction %" PRIu32 " outside of Stream Start",
		    c->stream_xid);
	c->m->stream_buffer_bytes = c->sbuf.bytes;
}

/* Publishes the rows of the Stream Commit in progress as far as the caps allow. */
void
obx_rc_replay(struct obx_core *c)
{
	const struct obx_sbuf_txn *t = obx_streambuf_get(&c->sbuf, c->replay_xid);
	char a[OBX_LSN_STRLEN];

	while (t != NULL && c->replay_next < t->nrows && !obx_rc_ending(c) && !obx_dlv_pending(&c->dlv) &&
	    !obx_rc_backpressured(c)) {
		const struct obx_sbuf_row *row = &t->rows[c->replay_next++];

		if (row->rel == OBX_SBUF_MESSAGE)
			obx_rc_publish_message(c, row->tuple.cols[0].data, row->tuple.cols[0].len);
		else
			obx_rc_publish_row(c, &t->rels[row->rel], &row->tuple);
	}
	if (obx_rc_ending(c) || (t != NULL && c->replay_next < t->nrows))
		return;
	obx_event_builder_forget(&c->eb); /* the relation copies go now */
	c->mt_rel = NULL;                 /* and the metrics slot cached for them */
	if (obx_ack_commit(&c->ack, c->replay_end_lsn) != 0) {
		fail(c, OBX_CORE_END_FATAL, "Stream Commit without its transaction at lsn %s",
		    obx_lsn_format(c->txn.commit_lsn, a, sizeof(a)));
		return;
	}
	c->replaying = false;
	c->in_txn = false;
	c->m->transactions++;
	obx_rc_batch_txn_done(c, c->replay_end_lsn);
	obx_streambuf_drop(&c->sbuf, c->replay_xid);
	streams_changed(c);
	if (c->replay_end_lsn > c->received)
		c->received = c->replay_end_lsn;
}

/* Stream Commit: the buffered rows become events of one transaction, in insertion order. */
void
obx_rc_stream_commit(struct obx_core *c, const struct obx_pgmsg *m)
{
	if (!obx_rc_open_txn(c, "Stream Commit", m->u.stream_commit.commit_lsn, m->u.stream_commit.xid,
	        m->u.stream_commit.commit_time))
		return;
	c->replaying = true;
	c->replay_xid = m->u.stream_commit.xid;
	c->replay_next = 0;
	c->replay_end_lsn = m->u.stream_commit.end_lsn;
	obx_event_builder_forget(&c->eb);
	c->mt_rel = NULL; /* and the metrics slot cached for them */
	obx_rc_replay(c);
}

/*
 * Stream Abort.  A whole transaction's abort discards its rows.  A
 * subtransaction's abort discards the rows tagged with its xid; but
 * pgoutput tags a logical decoding message inside a streamed transaction
 * with the top-level xid, so when the transaction holds messages of ours
 * there is no telling which of them the savepoint wrote.  Then the session
 * ends and the process asks for no more streaming: the server decodes the
 * transaction again, whole, at its commit, without what rolled back
 * (docs/internals/design.md, invariant 2).
 */
void
obx_rc_stream_abort(struct obx_core *c, const struct obx_pgmsg *m)
{
	uint32_t xid = m->u.stream_abort.xid, subxid = m->u.stream_abort.subxid;
	const struct obx_sbuf_txn *t = obx_streambuf_get(&c->sbuf, xid);
	size_t n;

	if (subxid != xid && t != NULL && t->nmessages > 0) {
		c->streaming_off = true;
		fail(c, OBX_CORE_END_RETRY,
		    "streamed transaction %" PRIu32 " rolled back subtransaction %" PRIu32
		    " and holds %zu logical decoding message(s), which pgoutput does not tag with their "
		    "subtransaction; reconnecting with streaming off",
		    xid, subxid, t->nmessages);
		return;
	}
	n = obx_streambuf_abort(&c->sbuf, xid, subxid);
	c->m->stream_aborted_events += n;
	if (n > 0)
		obx_rc_note(c, OBX_LOG_DEBUG, NULL,
		    "streamed transaction %" PRIu32 " rolled back %s %" PRIu32 ": %zu buffered event(s) discarded",
		    xid, subxid == xid ? "whole, xid" : "savepoint, subxid", subxid, n);
	streams_changed(c);
}

void
obx_rc_stream_start(struct obx_core *c, const struct obx_pgmsg *m)
{
	if (obx_streambuf_start(&c->sbuf, m->u.stream_start.xid) != 0) {
		fail(c, OBX_CORE_END_FATAL, "out of memory");
		return;
	}
	c->in_stream = true;
	c->stream_xid = m->u.stream_start.xid;
	streams_changed(c);
}
