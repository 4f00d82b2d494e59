/*
 * coverage.c - whether the publication kept covering every outbox table;
 * see coverage.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/coverage.h"
#include "obx/core/err.h"

size_t
obx_cov_entries(const struct obx_config *cfg, const struct obx_table_pat **out, size_t max)
{
	size_t n = 0;

	for (size_t i = 0; i < cfg->n_tables; i++) {
		const struct obx_table_pat *p = &cfg->tables[i];

		if (p->schema_wild || p->name_wild)
			continue;
		if (out != NULL && n < max)
			out[n] = p;
		n++;
	}
	return n;
}

void
obx_cov_reset(struct obx_cov *c)
{
	free(c->t);
	memset(c, 0, sizeof(*c));
}

int
obx_cov_copy(struct obx_cov *dst, const struct obx_cov *src)
{
	obx_cov_reset(dst);
	*dst = *src;
	dst->t = NULL;
	if (src->n == 0)
		return 0;
	if ((dst->t = calloc(src->n, sizeof(*dst->t))) == NULL) {
		memset(dst, 0, sizeof(*dst));
		return OBX_ENOMEM;
	}
	memcpy(dst->t, src->t, src->n * sizeof(*dst->t));
	return 0;
}

/* One table: true when covered between the readings, else false with errbuf. */
static bool
judge_table(const struct obx_config *cfg, const struct obx_table_pat *p, const struct obx_cov_table *b,
    const struct obx_cov_table *n, char *errbuf, size_t errlen)
{
	bool held = n->whole_row != 0 || n->rel_row != 0;
	size_t used;

	if (n->relid == 0)
		return true; /* gone: it takes no rows */
	if (n->unlogged) {
		snprintf(errbuf, errlen,
		    "outbox table %s.%s is unlogged: its rows are never written to the WAL, so never decoded "
		    "(ALTER TABLE %s.%s SET LOGGED)",
		    p->schema, p->name, p->schema, p->name);
		return false;
	}
	/* the same schema or all-tables row: every table it takes in, from its creation on */
	if (n->whole_row != 0 && n->whole_row == b->whole_row)
		return true;
	/* the same table by the same row, or a row made with the table */
	if (n->rel_row != 0 && ((n->relid == b->relid && n->rel_row == b->rel_row) || n->rel_born))
		return true;
	if (b->relid != 0 && n->relid != b->relid)
		snprintf(errbuf, errlen,
		    "outbox table %s.%s was dropped and created again (oid %u, before %u) and publication %s "
		    "%s: a publication FOR TABLE holds a table by oid, so the new table's rows %s",
		    p->schema, p->name, n->relid, b->relid, cfg->publication,
		    held ? "took it in after its creation" : "does not hold the new table",
		    held ? "before that were not decoded" : "are not decoded");
	else if (b->relid == 0)
		snprintf(errbuf, errlen,
		    "outbox table %s.%s was created while outboxd ran and publication %s %s: a publication "
		    "FOR TABLE takes in a table only once it is added, so its rows %s",
		    p->schema, p->name, cfg->publication,
		    held ? "took it in after its creation" : "does not hold it",
		    held ? "before that were not decoded" : "are not decoded");
	else
		snprintf(errbuf, errlen,
		    "outbox table %s.%s %s publication %s: its rows were not decoded while it was out of it",
		    p->schema, p->name, held ? "left and rejoined" : "was taken out of", cfg->publication);
	used = strlen(errbuf);
	if (used < errlen && !held)
		snprintf(errbuf + used, errlen - used, " (ALTER PUBLICATION %s ADD TABLE %s.%s)", cfg->publication,
		    p->schema, p->name);
	else if (used < errlen && n->relid != b->relid)
		snprintf(errbuf + used, errlen - used,
		    " (a migration that re-creates it keeps it covered when it adds it to the publication in "
		    "the same transaction)");
	return false;
}

bool
obx_cov_judge(const struct obx_config *cfg, const struct obx_cov *base, const struct obx_cov *now, char *errbuf,
    size_t errlen)
{
	const struct obx_table_pat *p;
	size_t k = 0;

	if (now->pubid == 0) {
		snprintf(errbuf, errlen, "publication %s no longer exists", cfg->publication);
		return false;
	}
	if (now->pubid != base->pubid) {
		snprintf(errbuf, errlen,
		    "publication %s was dropped and created again (oid %u, before %u): what was committed "
		    "while it did not exist was not decoded",
		    cfg->publication, now->pubid, base->pubid);
		return false;
	}
	if (!now->pub_insert) {
		snprintf(errbuf, errlen,
		    "publication %s no longer publishes inserts (ALTER PUBLICATION %s SET (publish = 'insert'))",
		    cfg->publication, cfg->publication);
		return false;
	}
	for (size_t i = 0; i < cfg->n_tables; i++) {
		p = &cfg->tables[i];
		if (p->schema_wild || p->name_wild)
			continue;
		if (k >= now->n || k >= base->n) {
			snprintf(errbuf, errlen, "outbox table %s.%s was not read from the catalog", p->schema,
			    p->name);
			return false;
		}
		if (!judge_table(cfg, p, &base->t[k], &now->t[k], errbuf, errlen))
			return false;
		k++;
	}
	return true;
}
