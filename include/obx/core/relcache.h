/*
 * relcache.h - relations announced by pgoutput Relation messages (pure).
 * The server sends a Relation message before the first change of a relation
 * in a session and again after its definition changed; the cache keeps the
 * newest one per relation id.  Entries are copies owned by the cache.
 */
#ifndef OBX_RELCACHE_H
#define OBX_RELCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/pgoutput.h"

struct obx_relcol {
	char *name;
	uint32_t type_oid;
};

struct obx_rel {
	uint32_t relid;
	char *nspname;
	char *relname;
	uint16_t natts;
	struct obx_relcol *cols;
	unsigned version; /* bumped on every update: lets users cache resolutions */
	bool message;     /* a logical decoding message read as a row, not a table's (no table header) */
};

struct obx_relcache {
	struct obx_rel *rels;
	size_t n;
	unsigned next_version;
};

void obx_relcache_init(struct obx_relcache *c);
void obx_relcache_reset(struct obx_relcache *c);

/* Stores (or replaces) the relation of a decoded 'R' message.  Returns 0 or OBX_ENOMEM. */
int obx_relcache_update(struct obx_relcache *c, const struct obx_pgmsg *relation);

/* Returns the relation with relid (borrowed until the next update/reset) or NULL. */
const struct obx_rel *obx_relcache_get(const struct obx_relcache *c, uint32_t relid);

/* Deep-copies src into dst (caller frees with obx_rel_free()).  Returns 0 or OBX_ENOMEM. */
int obx_rel_copy(struct obx_rel *dst, const struct obx_rel *src);
/* Frees what a copied relation owns and zeroes it; a zeroed one is a no-op. */
void obx_rel_free(struct obx_rel *r);

/* Returns the index of column name in rel, or -1. */
int obx_rel_column(const struct obx_rel *rel, const char *name);

#endif
