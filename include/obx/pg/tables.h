/*
 * pg/tables.h - the outbox tables a server holds now (I/O): the tables
 * (ordinary or partitioned roots) that an entry of [source] table matches
 * (core/tables.h), for the publication, `outboxd check` and `status`.
 *
 * Ownership: the list owns its names; obx_pg_tables_reset() frees them.
 */
#ifndef OBX_PG_TABLES_H
#define OBX_PG_TABLES_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/config.h"

struct obx_pg_table {
	char *schema;
	char *name;
	char relkind;   /* 'r' or 'p' */
	bool published; /* in the publication (by name, or FOR ALL TABLES) */
	int mapping;    /* obx_tables_mapping() */
};

struct obx_pg_tables {
	struct obx_pg_table *t;
	size_t n;
	bool pub_exists;
	bool pub_all;     /* FOR ALL TABLES */
	bool pub_insert;  /* publishes inserts */
	bool pub_viaroot; /* publish_via_partition_root */
};

/*
 * Reads the matching tables (in schema, name order) and what the
 * publication cfg->publication is.  Returns 0, OBX_EIO (errbuf: the
 * server's message) or OBX_ENOMEM; reset out either way.
 */
int obx_pg_tables_read(PGconn *c, const struct obx_config *cfg, struct obx_pg_tables *out, char *errbuf,
    size_t errlen);

void obx_pg_tables_reset(struct obx_pg_tables *t);

/* True when the list (ctx: a struct obx_pg_tables) holds schema.name: obx_tables_next_missing()'s has. */
bool obx_pg_tables_has(void *ctx, const char *schema, const char *name);

#endif
