/*
 * pgversion.h - what each PostgreSQL major offers outboxd (pure).
 *
 * The one place that turns a server_version_num (PQserverVersion) into
 * the features outboxd may use on that server.  Every query and command
 * that differs between majors asks these facts; none probes by trial and
 * error.  Supported majors are 13 to 18 (docs/internals/design.md, "Servers").
 */
#ifndef OBX_PGVERSION_H
#define OBX_PGVERSION_H

#include <stdbool.h>
#include <stddef.h>

/* The oldest server outboxd runs against, as server_version_num. */
#define OBX_PG_MIN_VERSION 130000

struct obx_pgfacts {
	int version;              /* server_version_num, e.g. 170004 */
	int major;                /* 13 .. */
	int proto;                /* highest pgoutput protocol: 1 on 13, 2 on 14, 3 on 15, 4 from 16 */
	bool streaming;           /* in-progress transactions streamed (protocol 2, 14) */
	bool messages;            /* logical decoding messages in pgoutput (14) */
	bool publication_filters; /* row filters and column lists: pg_publication_tables.rowfilter,
	                          * attnames; CREATE PUBLICATION ... WHERE (15) */
	bool schema_publications; /* FOR TABLES IN SCHEMA: pg_publication_namespace (15) */
	bool slot_options;        /* CREATE_REPLICATION_SLOT ... (SNAPSHOT 'nothing') syntax (15) */
	bool standby_decoding;    /* logical slots and decoding on a hot standby (16) */
	bool failover_slots;      /* CREATE_REPLICATION_SLOT ... (FAILOVER), pg_replication_slots.failover
	                        * and .synced, slot synchronization to standbys (17) */
};

/*
 * Fills *f for a server of server_version (PQserverVersion).  Returns 0, or
 * OBX_ECONFIG with one line in errbuf naming the version and the minimum
 * when the server is older than OBX_PG_MIN_VERSION (f is then filled all
 * the same, for reports).  No allocation; f is the caller's.
 */
int obx_pgfacts_for(int server_version, struct obx_pgfacts *f, char *errbuf, size_t errlen);

/*
 * Writes server_version as PostgreSQL prints it ("17.4", "9.6.24") into buf
 * and returns buf.
 */
const char *obx_pgversion_format(int server_version, char *buf, size_t len);

#endif
