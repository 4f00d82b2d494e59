/*
 * config_value.c - the value types of the configuration (pure): booleans,
 * integers, durations and sizes with their units, each parsed whole and
 * range-checked (config.h).  config.c applies them through the table.
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/core/config.h"
#include "obx/core/config_table.h"
#include "obx/core/err.h"

/* ---- value parsers ---------------------------------------------------- */

int
obx_parse_bool(const char *s, bool *out)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };

	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		if (strcasecmp(s, yes[i]) == 0) {
			*out = true;
			return 0;
		}
		if (strcasecmp(s, no[i]) == 0) {
			*out = false;
			return 0;
		}
	}
	return OBX_EINVAL;
}

/* Splits s into a decimal number and a unit suffix; the number must be there. */
static int
split_number(const char *s, long long *num, const char **unit)
{
	char *end;
	long long v;

	if (!isdigit((unsigned char)s[0]))
		return OBX_EINVAL;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno == ERANGE)
		return OBX_ERANGE;
	while (*end == ' ')
		end++;
	*num = v;
	*unit = end;
	return 0;
}

static int
scale(long long v, long long mult, long long min, long long max, long long *out)
{
	if (v > LLONG_MAX / mult)
		return OBX_ERANGE;
	v *= mult;
	if (v < min || v > max)
		return OBX_ERANGE;
	*out = v;
	return 0;
}

struct unit {
	const char *name;
	long long mult;
};

/* A number with one of units' suffixes, scaled and checked against [min, max]. */
static int
parse_with_unit(const char *s, const struct unit *units, size_t n, long long min, long long max, long long *out)
{
	const char *unit;
	long long v;
	int r;

	if ((r = split_number(s, &v, &unit)) != 0)
		return r;
	for (size_t i = 0; i < n; i++)
		if (strcmp(unit, units[i].name) == 0)
			return scale(v, units[i].mult, min, max, out);
	return OBX_EINVAL;
}

int
obx_parse_duration_ms(const char *s, long long min, long long max, long long *out)
{
	static const struct unit units[] = {
		{ "ms", 1 },
		{ "s", 1000 },
		{ "min", 60000 },
		{ "m", 60000 },
		{ "h", 3600000 },
	};

	return parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), min, max, out);
}

int
obx_parse_size(const char *s, long long min, long long max, long long *out)
{
	static const struct unit units[] = {
		{ "", 1 },
		{ "B", 1 },
		{ "k", 1024 },
		{ "K", 1024 },
		{ "KiB", 1024 },
		{ "kB", 1024 },
		{ "M", 1 << 20 },
		{ "MiB", 1 << 20 },
		{ "MB", 1 << 20 },
		{ "G", 1 << 30 },
		{ "GiB", 1 << 30 },
		{ "GB", 1 << 30 },
	};

	return parse_with_unit(s, units, sizeof(units) / sizeof(units[0]), min, max, out);
}

int
obx_parse_int(const char *s, long long min, long long max, long long *out)
{
	const char *errstr = NULL;
	long long v;

	if (s[0] == '\0')
		return OBX_EINVAL;
	v = strtonum(s, min, max, &errstr);
	if (errstr != NULL)
		return strncmp(errstr, "too ", 4) == 0 ? OBX_ERANGE : OBX_EINVAL;
	*out = v;
	return 0;
}
