#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "obx/core/snapmark.h"

#define SUFFIX "_snapshot"

/* slot with suffix, 63 characters at most: cut to keep + suffix, a hash where it would be cut. */
static void
suffixed(const char *slot, const char *suffix, char *out, size_t len)
{
	uint64_t h = 14695981039346656037ULL; /* FNV-1a, 64 bits */
	int keep = 63 - (int)strlen(suffix);

	if ((int)strlen(slot) <= keep) {
		snprintf(out, len, "%s%s", slot, suffix);
		return;
	}
	for (const unsigned char *p = (const unsigned char *)slot; *p != '\0'; p++) {
		h ^= *p;
		h *= 1099511628211ULL;
	}
	snprintf(out, len, "%.*s_%016" PRIx64 "%s", keep - 17, slot, h, suffix);
}

void
obx_snapmark_name(const char *slot, char *out, size_t len)
{
	suffixed(slot, SUFFIX, out, len);
}

void
obx_snapmark_guard_name(const char *slot, char *out, size_t len)
{
	suffixed(slot, "_guard", out, len);
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
