/*
 * streambuf.c - outbox rows of streamed transactions until their Stream
 * Commit or Abort (see streambuf.h).
 */
#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/streambuf.h"

void
obx_streambuf_init(struct obx_streambuf *b, size_t limit)
{
	memset(b, 0, sizeof(*b));
	b->limit = limit;
}

static size_t
rel_size(const struct obx_rel *r)
{
	size_t n = sizeof(*r) + strlen(r->nspname) + strlen(r->relname) + 2;

	for (uint16_t i = 0; i < r->natts; i++)
		n += sizeof(r->cols[i]) + strlen(r->cols[i].name) + 1;
	return n;
}

static void
txn_free(struct obx_streambuf *b, struct obx_sbuf_txn *t)
{
	for (size_t i = 0; i < t->nrows; i++) {
		b->bytes -= t->rows[i].size;
		free((void *)t->rows[i].tuple.cols);
	}
	for (size_t i = 0; i < t->nrels; i++) {
		b->bytes -= rel_size(&t->rels[i]);
		obx_rel_free(&t->rels[i]);
	}
	free(t->rows);
	free(t->rels);
	memset(t, 0, sizeof(*t));
}

void
obx_streambuf_reset(struct obx_streambuf *b)
{
	for (size_t i = 0; i < b->n; i++)
		txn_free(b, &b->txns[i]);
	free(b->txns);
	obx_streambuf_init(b, b->limit);
}

static struct obx_sbuf_txn *
find(const struct obx_streambuf *b, uint32_t xid)
{
	for (size_t i = 0; i < b->n; i++)
		if (b->txns[i].xid == xid)
			return &b->txns[i];
	return NULL;
}

int
obx_streambuf_start(struct obx_streambuf *b, uint32_t xid)
{
	struct obx_sbuf_txn *grown;

	if (find(b, xid) != NULL)
		return 0; /* a later block of a transaction already in progress */
	grown = reallocarray(b->txns, b->n + 1, sizeof(*grown));
	if (grown == NULL)
		return OBX_ENOMEM;
	b->txns = grown;
	memset(&b->txns[b->n], 0, sizeof(b->txns[b->n]));
	b->txns[b->n++].xid = xid;
	return 0;
}

/* The index of rel's copy in t, copying it when the last copy is another relation or version. */
static int
rel_index(struct obx_streambuf *b, struct obx_sbuf_txn *t, const struct obx_rel *rel, uint32_t *idx)
{
	struct obx_rel *grown;
	size_t sz = rel_size(rel);

	if (t->nrels > 0 && rel->relid != 0 && t->rels[t->nrels - 1].relid == rel->relid &&
	    t->rels[t->nrels - 1].version == rel->version) {
		*idx = (uint32_t)(t->nrels - 1);
		return 0;
	}
	if (b->bytes + sz > b->limit)
		return OBX_EFULL;
	grown = reallocarray(t->rels, t->nrels + 1, sizeof(*grown));
	if (grown == NULL)
		return OBX_ENOMEM;
	t->rels = grown;
	if (obx_rel_copy(&t->rels[t->nrels], rel) != 0)
		return OBX_ENOMEM;
	b->bytes += sz;
	*idx = (uint32_t)t->nrels++;
	return 0;
}

/* Appends a copy of tuple as a row of rel index ri (OBX_SBUF_MESSAGE: a message). */
static int
add_row(struct obx_streambuf *b, struct obx_sbuf_txn *t, uint32_t subxid, const struct obx_rel *rel,
    const struct obx_pg_tuple *tuple)
{
	struct obx_sbuf_row *row;
	struct obx_pg_datum *cols;
	uint8_t *data;
	size_t size = (size_t)tuple->ncols * sizeof(*cols);
	uint32_t ri = OBX_SBUF_MESSAGE;
	int r;

	for (uint16_t i = 0; i < tuple->ncols; i++)
		size += tuple->cols[i].len;
	if (b->bytes + size + sizeof(*row) > b->limit)
		return OBX_EFULL;
	if (rel != NULL && (r = rel_index(b, t, rel, &ri)) != 0)
		return r;
	if (t->nrows == t->cap) {
		size_t cap = t->cap ? t->cap * 2 : 16;
		struct obx_sbuf_row *grown = reallocarray(t->rows, cap, sizeof(*grown));

		if (grown == NULL)
			return OBX_ENOMEM;
		t->rows = grown;
		t->cap = cap;
	}
	cols = malloc(size ? size : 1);
	if (cols == NULL)
		return OBX_ENOMEM;
	data = (uint8_t *)(cols + tuple->ncols);
	for (uint16_t i = 0; i < tuple->ncols; i++) {
		cols[i] = tuple->cols[i];
		cols[i].data = data; /* also when empty: never a view into the CopyData buffer */
		if (tuple->cols[i].len > 0) {
			memcpy(data, tuple->cols[i].data, tuple->cols[i].len);
			data += tuple->cols[i].len;
		}
	}
	row = &t->rows[t->nrows++];
	row->subxid = subxid;
	row->rel = ri;
	row->tuple.ncols = tuple->ncols;
	row->tuple.cols = cols;
	row->size = size + sizeof(*row);
	b->bytes += row->size;
	if (ri == OBX_SBUF_MESSAGE)
		t->nmessages++;
	return 0;
}

int
obx_streambuf_add(struct obx_streambuf *b, uint32_t xid, uint32_t subxid, const struct obx_rel *rel,
    const struct obx_pg_tuple *tuple)
{
	struct obx_sbuf_txn *t = find(b, xid);

	if (t == NULL)
		return OBX_ESTATE;
	return add_row(b, t, subxid, rel, tuple);
}

int
obx_streambuf_add_message(struct obx_streambuf *b, uint32_t xid, uint32_t subxid, const uint8_t *content,
    uint32_t len)
{
	struct obx_sbuf_txn *t = find(b, xid);
	struct obx_pg_datum d = { 't', content, len };
	struct obx_pg_tuple tuple = { 1, &d };

	if (t == NULL)
		return OBX_ESTATE;
	return add_row(b, t, subxid, NULL, &tuple);
}

size_t
obx_streambuf_abort(struct obx_streambuf *b, uint32_t xid, uint32_t subxid)
{
	struct obx_sbuf_txn *t = find(b, xid);
	size_t kept = 0, n;

	if (t == NULL)
		return 0;
	if (subxid == xid) {
		n = t->nrows;
		obx_streambuf_drop(b, xid);
		return n;
	}
	for (size_t i = 0; i < t->nrows; i++) {
		if (t->rows[i].subxid == subxid) {
			if (t->rows[i].rel == OBX_SBUF_MESSAGE)
				t->nmessages--;
			b->bytes -= t->rows[i].size;
			free((void *)t->rows[i].tuple.cols);
		} else {
			t->rows[kept++] = t->rows[i];
		}
	}
	n = t->nrows - kept;
	t->nrows = kept;
	return n;
}

const struct obx_sbuf_txn *
obx_streambuf_get(const struct obx_streambuf *b, uint32_t xid)
{
	return find(b, xid);
}

void
obx_streambuf_drop(struct obx_streambuf *b, uint32_t xid)
{
	struct obx_sbuf_txn *t = find(b, xid);

	if (t == NULL)
		return;
	txn_free(b, t);
	*t = b->txns[--b->n]; /* order of transactions does not matter, only of rows */
}

size_t
obx_streambuf_open(const struct obx_streambuf *b)
{
	return b->n;
}
