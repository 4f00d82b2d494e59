/*
 * pg/coverage.h - reads what core/coverage.h judges: the publication and,
 * for every exact entry of [source] table, the table's oid and the catalog
 * row that puts it in the publication (I/O).
 */
#ifndef OBX_PG_COVERAGE_H
#define OBX_PG_COVERAGE_H

#include <stddef.h>

#include <libpq-fe.h>

#include "obx/core/config.h"
#include "obx/core/coverage.h"

/*
 * Reads the catalog on c (an ordinary or a replication connection: simple
 * queries only) into *out (its earlier contents freed), out->read set.
 * Returns 0, OBX_EIO (errbuf: the server's words) or OBX_ENOMEM; *out is
 * empty on error.
 */
int obx_pg_coverage_read(PGconn *c, const struct obx_config *cfg, struct obx_cov *out, char *errbuf,
    size_t errlen);

#endif
