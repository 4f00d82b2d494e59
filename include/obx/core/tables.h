/*
 * tables.h - which relations are outbox tables, and the mapping each one
 * uses (pure).  [source] table lists tables and '*' patterns; a relation
 * is an outbox table when an entry matches its schema and name, whether
 * it existed when outboxd started or was created later.  Its mapping is
 * [outbox] with the keys of the first [outbox.<schema>.<table>] section
 * (in file order) that matches it applied over it.
 *
 * Ownership: overrides live in struct obx_config (config.h), which frees
 * them; views borrow from the configuration and the names they are given.
 */
#ifndef OBX_TABLES_H
#define OBX_TABLES_H

#include <stdbool.h>
#include <stddef.h>

#include "obx/core/config.h"

/* The prefix of an override section's name: "outbox." then [schema.]table. */
#define OBX_TABLE_SECTION "outbox."

/* Writes [source] table as the file would hold it ("a.o, t_*.o").  Returns 0 or OBX_ERANGE. */
int obx_tables_format(const struct obx_config *cfg, char *out, size_t outlen);

/* True when s matches the shell-style pattern pat, where '*' matches any run (no other metacharacter). */
bool obx_glob_match(const char *pat, const char *s);

/* True when entry p matches schema.name. */
bool obx_table_pat_match(const struct obx_table_pat *p, const char *schema, const char *name);

/*
 * True when [source] table names more than one table or holds a pattern, or
 * an [outbox.<schema>.<table>] section is given: the paths that read a
 * table's mapping read it per table then.
 */
bool obx_tables_several(const struct obx_config *cfg);

/* True when an entry of [source] table holds a pattern (tables created later can match). */
bool obx_tables_wild(const struct obx_config *cfg);

/*
 * The mapping of schema.name: -1 when no entry of [source] table matches it
 * (not an outbox table), 0 for [outbox] itself, k + 1 for the override
 * cfg->overrides[k].
 */
int obx_tables_mapping(const struct obx_config *cfg, const char *schema, const char *name);

/*
 * Whether a table that cannot be read (missing columns, just dropped) may
 * be left out while the others go on: only with several tables, and only
 * a table no exact entry of [source] table names (a pattern's tenant, half
 * set up); a named one is the configuration's and stops the run.
 */
bool obx_tables_may_leave_out(const struct obx_config *cfg, const char *schema, const char *name);

/* What a failed read of one outbox table (its check or its claim, in polling mode) does. */
enum obx_table_fault {
	OBX_TABLE_FAULT_RETRY,     /* the session ends and is tried again */
	OBX_TABLE_FAULT_STOP,      /* the run stops: the configuration names a table that is not there */
	OBX_TABLE_FAULT_LEAVE_OUT, /* the table is left out for a while; the others go on */
	OBX_TABLE_FAULT_NEXT_TURN, /* the table is passed over this round; the others go on */
};

/*
 * The fault of a read of schema.name that failed with SQLSTATE state (NULL:
 * none, the connection failed).  A lock not granted in time (55P03: another
 * session's ALTER TABLE or LOCK TABLE, [source] several tables set
 * lock_timeout) passes the table over this round.  A table that is missing,
 * lacks a column, has one of another type or that the role may not read
 * (class 42: 42P01, 42703, 42501, 42883, ...; 3F000) is left out when
 * obx_tables_may_leave_out() allows it (a tenant of a pattern, half set
 * up); otherwise a missing one (42P01, 42703, 3F000) stops the run, and the
 * rest is retried (a grant or a migration heals it).  Anything else
 * retries.
 */
enum obx_table_fault obx_tables_read_fault(const struct obx_config *cfg, const char *schema, const char *name,
    const char *state);

/*
 * The next exact entry of [source] table, from *next on, that has(ctx,
 * schema, name) says the server lacks; *next moves past it.  NULL when
 * none is missing.
 */
const struct obx_table_pat *obx_tables_next_missing(const struct obx_config *cfg, size_t *next,
    bool (*has)(void *ctx, const char *schema, const char *name), void *ctx);

/*
 * The configuration of mapping (obx_tables_mapping(), >= 0) with schema.name
 * as the outbox table: cfg copied, its [outbox] keys replaced by the
 * mapping's, table_schema and table_name pointing at schema and name.
 * Everything is borrowed (from cfg, its override and the names): never
 * reset a view; it stays valid while they do.
 */
void obx_tables_view(const struct obx_config *cfg, int mapping, const char *schema, const char *name,
    struct obx_config *view);

/*
 * Stores key = value of section "outbox.<schema>.<table>" (checked when
 * the configuration is finished, against [outbox]'s keys).  Returns 0,
 * OBX_ECONFIG (errbuf filled: a malformed section name, a key given twice,
 * a key [outbox] does not have) or OBX_ENOMEM.
 */
int obx_tables_override_set(struct obx_config *cfg, const char *section, const char *key, const char *value,
    const char *origin, char *errbuf, size_t errlen);

/*
 * Builds each override's mapping: [outbox] as configured, then its keys
 * applied with their checks.  Called by obx_config_finish().  Returns 0,
 * OBX_ECONFIG (errbuf names the line) or OBX_ENOMEM.
 */
int obx_tables_overrides_finish(struct obx_config *cfg, char *errbuf, size_t errlen);

/* Frees the overrides (obx_config_reset() calls it). */
void obx_tables_overrides_reset(struct obx_config *cfg);

/* True when two configurations' overrides differ (the SIGHUP diff). */
bool obx_tables_overrides_differ(const struct obx_config *a, const struct obx_config *b);

#endif
