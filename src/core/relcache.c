#include <stdlib.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/relcache.h"

void
obx_relcache_init(struct obx_relcache *c)
{
	c->rels = NULL;
	c->n = 0;
	c->next_version = 1;
}

void
obx_rel_free(struct obx_rel *r)
{
	for (uint16_t i = 0; i < r->natts; i++)
		free(r->cols[i].name);
	free(r->cols);
	free(r->nspname);
	free(r->relname);
	memset(r, 0, sizeof(*r));
}

void
obx_relcache_reset(struct obx_relcache *c)
{
	for (size_t i = 0; i < c->n; i++)
		obx_rel_free(&c->rels[i]);
	free(c->rels);
	obx_relcache_init(c);
}

int
obx_rel_copy(struct obx_rel *dst, const struct obx_rel *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->relid = src->relid;
	dst->version = src->version;
	dst->nspname = strdup(src->nspname);
	dst->relname = strdup(src->relname);
	dst->cols = calloc(src->natts ? src->natts : 1, sizeof(*dst->cols));
	if (dst->nspname == NULL || dst->relname == NULL || dst->cols == NULL)
		goto nomem;
	for (uint16_t i = 0; i < src->natts; i++) {
		dst->cols[i].name = strdup(src->cols[i].name);
		dst->cols[i].type_oid = src->cols[i].type_oid;
		dst->natts = (uint16_t)(i + 1);
		if (dst->cols[i].name == NULL)
			goto nomem;
	}
	return 0;
nomem:
	obx_rel_free(dst);
	return OBX_ENOMEM;
}

/* The first index whose relid is not below relid (c->rels is in relid order). */
static size_t
lower_bound(const struct obx_relcache *c, uint32_t relid)
{
	size_t lo = 0, hi = c->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (c->rels[mid].relid < relid)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int
obx_relcache_update(struct obx_relcache *c, const struct obx_pgmsg *m)
{
	struct obx_rel nr = { 0 };
	struct obx_rel *slot = NULL;
	size_t pos;

	nr.relid = m->u.relation.relid;
	nr.nspname = strdup(m->u.relation.nspname);
	nr.relname = strdup(m->u.relation.relname);
	nr.cols = calloc(m->u.relation.natts ? m->u.relation.natts : 1, sizeof(*nr.cols));
	if (nr.nspname == NULL || nr.relname == NULL || nr.cols == NULL)
		goto nomem;
	for (uint16_t i = 0; i < m->u.relation.natts; i++) {
		nr.cols[i].name = strdup(m->u.relation.cols[i].name);
		nr.cols[i].type_oid = m->u.relation.cols[i].type_oid;
		nr.natts = (uint16_t)(i + 1);
		if (nr.cols[i].name == NULL)
			goto nomem;
	}
	nr.natts = m->u.relation.natts;
	nr.version = c->next_version++;

	/* kept in relid order: a stream of every table's rows (a publication FOR ALL TABLES) looks
	 * each row's relation up, so the lookup is a binary search */
	pos = lower_bound(c, nr.relid);
	if (pos < c->n && c->rels[pos].relid == nr.relid) {
		slot = &c->rels[pos];
		obx_rel_free(slot);
	} else {
		struct obx_rel *grown = reallocarray(c->rels, c->n + 1, sizeof(*grown));

		if (grown == NULL)
			goto nomem;
		c->rels = grown;
		memmove(&c->rels[pos + 1], &c->rels[pos], (c->n - pos) * sizeof(*grown));
		c->n++;
		slot = &c->rels[pos];
	}
	*slot = nr;
	return 0;
nomem:
	obx_rel_free(&nr);
	return OBX_ENOMEM;
}

const struct obx_rel *
obx_relcache_get(const struct obx_relcache *c, uint32_t relid)
{
	size_t pos = lower_bound(c, relid);

	return pos < c->n && c->rels[pos].relid == relid ? &c->rels[pos] : NULL;
}

int
obx_rel_column(const struct obx_rel *rel, const char *name)
{
	for (uint16_t i = 0; i < rel->natts; i++)
		if (strcmp(rel->cols[i].name, name) == 0)
			return i;
	return -1;
}
