#include <stdio.h>

#include "obx/core/err.h"
#include "obx/core/lsn.h"

static int
parse_half(const char *s, size_t n, uint32_t *out)
{
	uint32_t v = 0;

	if (n == 0 || n > 8)
		return OBX_EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		uint32_t d;

		if (c >= '0' && c <= '9')
			d = (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			d = (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			d = (uint32_t)(c - 'A' + 10);
		else
			return OBX_EINVAL;
		v = (v << 4) | d;
	}
	*out = v;
	return 0;
}

int
obx_lsn_parse(const char *s, obx_lsn *out)
{
	const char *slash;
	const char *end;
	uint32_t hi, lo;

	if (s == NULL)
		return OBX_EINVAL;
	for (slash = s; *slash != '\0' && *slash != '/'; slash++)
		;
	if (*slash != '/')
		return OBX_EINVAL;
	for (end = slash + 1; *end != '\0'; end++)
		;
	if (parse_half(s, (size_t)(slash - s), &hi) != 0 ||
	    parse_half(slash + 1, (size_t)(end - slash - 1), &lo) != 0)
		return OBX_EINVAL;
	*out = ((obx_lsn)hi << 32) | lo;
	return 0;
}

char *
obx_lsn_format(obx_lsn lsn, char *buf, size_t len)
{
	snprintf(buf, len, "%X/%X", (unsigned)(lsn >> 32), (unsigned)(lsn & 0xffffffffu));
	return buf;
}
