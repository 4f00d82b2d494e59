#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "obx/core/snapmark.h"

#define SUFFIX "_snapshot"

void
obx_snapmark_name(const char *slot, char *out, size_t len)
{
	uint64_t h = 14695981039346656037ULL; /* FNV-1a, 64 bits */

	if (strlen(slot) <= OBX_SNAPMARK_KEEP) {
		snprintf(out, len, "%s" SUFFIX, slot);
		return;
	}
	for (const unsigned char *p = (const unsigned char *)slot; *p != '\0'; p++) {
		h ^= *p;
		h *= 1099511628211ULL;
	}
	snprintf(out, len, "%.37s_%016" PRIx64 SUFFIX, slot, h);
}

bool
obx_snapmark_legacy_name(const char *slot, char *out, size_t len)
{
	if (len > 0)
		out[0] = '\0';
	if (strlen(slot) <= OBX_SNAPMARK_KEEP)
		return false;
	snprintf(out, len, "%.*s" SUFFIX, OBX_SNAPMARK_KEEP, slot);
	return true;
}
