/*
 * coverage.h - whether the publication kept covering every outbox table
 * (pure; docs/internals/design.md, "Lifecycle edges", invariant 11).
 *
 * A publication FOR TABLE holds a table by its oid.  A table dropped and
 * created again under the same name (a migration), or swapped in by a
 * rename, is a new oid the publication does not hold: pgoutput never sends
 * its rows, and keepalives would let the slot be confirmed past them.
 * Adding it afterwards does not bring those rows back (the server decodes
 * a change under the catalog as it was at the change).  Nothing in the
 * stream shows it, so the catalog is read instead: once at a session's
 * start (the base) and again every status interval (pg/coverage.c), and
 * the core confirms nothing past the WAL position read just before the
 * last reading that this module found consistent with the base.
 *
 * What covers a table from its creation on, whatever its oid: a
 * publication FOR ALL TABLES, or FOR TABLES IN SCHEMA (15+) of its schema,
 * as long as that membership stays the same catalog row, or a
 * pg_publication_rel row made in the transaction that created the table
 * (CREATE TABLE and ALTER PUBLICATION ... ADD TABLE in one migration).
 * What covers a table only while it keeps its oid: a pg_publication_rel row
 * that was there at the last reading.  Each reading is judged against the
 * last one found consistent, so a membership may change kind between them
 * (ADD TABLES IN SCHEMA on top of ADD TABLE) without a gap.
 *
 * Ownership: struct obx_cov owns its table array; obx_cov_reset() frees it.
 */
#ifndef OBX_COVERAGE_H
#define OBX_COVERAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "obx/core/config.h"

/* How a table is in the publication as a whole: with every table of its schema, or every table. */
enum obx_cov_via {
	OBX_COV_NONE = 0, /* not at all */
	OBX_COV_TABLE,    /* FOR TABLE: by its oid (a pg_publication_rel row) */
	OBX_COV_SCHEMA,   /* FOR TABLES IN SCHEMA: every table of its schema, from creation on */
	OBX_COV_ALL,      /* FOR ALL TABLES: every table, from creation on */
};

/* One exact entry of [source] table as the catalog had it. */
struct obx_cov_table {
	uint32_t relid;             /* pg_class oid of schema.name (a table or a partitioned table, not a
	                       partition); 0: none */
	uint32_t rel_row;           /* its pg_publication_rel row's oid; 0: none */
	bool rel_born;              /* that row and the table were made by one transaction: held from the
	                       table's first row on */
	uint32_t whole_row;         /* the pg_publication_namespace row of its schema, or the publication's
	                       own oid when FOR ALL TABLES; 0: neither */
	enum obx_cov_via whole_via; /* OBX_COV_SCHEMA or OBX_COV_ALL with whole_row, else NONE */
	bool unlogged;              /* an unlogged table: no WAL, never decoded */
};

/* One reading of the catalog. */
struct obx_cov {
	bool read;       /* filled by a successful read */
	uint32_t pubid;  /* the publication's oid; 0: it does not exist */
	bool pub_insert; /* it publishes inserts */
	size_t n;        /* one per exact entry of [source] table (obx_cov_entries()), in order */
	struct obx_cov_table *t;
};

/*
 * The exact entries of [source] table (no '*'), in order: the i-th is what
 * obx_cov.t[i] describes.  Returns how many; with out non-NULL, the first
 * max of them are stored there (borrowed from cfg).
 */
size_t obx_cov_entries(const struct obx_config *cfg, const struct obx_table_pat **out, size_t max);

/* Makes dst a copy of src (dst's earlier contents freed).  Returns 0 or OBX_ENOMEM (dst then empty). */
int obx_cov_copy(struct obx_cov *dst, const struct obx_cov *src);

/* Frees what c holds and empties it; a second reset is a no-op. */
void obx_cov_reset(struct obx_cov *c);

/*
 * Whether now, read after base, shows that every row committed to an
 * outbox table between the two readings was decodable: true, or false
 * with errbuf naming the first table that was not covered, how (created
 * again, created while the publication names its tables, taken out of the
 * publication, unlogged), and the statement that covers it again.  A
 * table gone (dropped, renamed away) is covered: it can take no rows.
 * base and now must describe cfg's entries (obx_cov_entries()).
 */
bool obx_cov_judge(const struct obx_config *cfg, const struct obx_cov *base, const struct obx_cov *now,
    char *errbuf, size_t errlen);

#endif
