/*
 * pgversion.c - what each PostgreSQL major offers outboxd (pure); see
 * include/obx/core/pgversion.h.
 */
#include "obx/core/pgversion.h"

#include <stdio.h>
#include <string.h>

#include "obx/core/err.h"
#include "obx/core/pgoutput.h"

const char *
obx_pgversion_format(int v, char *buf, size_t len)
{
	if (v >= 100000)
		snprintf(buf, len, "%d.%d", v / 10000, v % 10000);
	else
		snprintf(buf, len, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
	return buf;
}

int
obx_pgfacts_for(int v, struct obx_pgfacts *f, char *errbuf, size_t errlen)
{
	char ver[32];

	memset(f, 0, sizeof(*f));
	f->version = v;
	f->major = v >= 100000 ? v / 10000 : v / 100;
	f->proto = obx_pgoutput_proto_for_server(v);
	f->streaming = v >= 140000;
	f->messages = v >= 140000;
	f->publication_filters = v >= 150000;
	f->slot_options = v >= 150000;
	f->schema_publications = v >= 150000;
	f->standby_decoding = v >= 160000;
	f->failover_slots = v >= 170000;
	if (v < OBX_PG_MIN_VERSION) {
		snprintf(errbuf, errlen, "PostgreSQL %s is not supported: outboxd needs %d or later",
		    obx_pgversion_format(v, ver, sizeof(ver)), OBX_PG_MIN_VERSION / 10000);
		return OBX_ECONFIG;
	}
	return 0;
}
