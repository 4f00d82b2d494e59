/*
 * fixture_file.h - reads captured pgoutput fixtures (tests/fixtures/pgoutput,
 * written by tests/fixtures/capture-pgoutput.sh): one message per line,
 * "LSN HEX".  Used by the unit tests and the decoder benchmark.
 */
#ifndef OBX_TEST_FIXTURE_FILE_H
#define OBX_TEST_FIXTURE_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fx_msg {
	char lsn[24];
	uint8_t *data;
	size_t len;
};

static inline int
fx_nibble(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Loads path; returns the number of messages (*out malloc'd, free with fx_free) or -1. */
static inline long
fx_load(const char *path, struct fx_msg **out)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, n = 0, mcap = 0;
	struct fx_msg *m = NULL;
	ssize_t len;

	if (f == NULL)
		return -1;
	while ((len = getline(&line, &cap, f)) > 0) {
		char *sp = strchr(line, ' ');
		size_t hl;

		if (sp == NULL || (size_t)(sp - line) >= sizeof(m->lsn))
			goto bad;
		if (n == mcap) {
			mcap = mcap ? mcap * 2 : 256;
			m = realloc(m, mcap * sizeof(*m));
		}
		memcpy(m[n].lsn, line, (size_t)(sp - line));
		m[n].lsn[sp - line] = '\0';
		hl = strcspn(sp + 1, "\r\n");
		if (hl % 2 != 0)
			goto bad;
		m[n].len = hl / 2;
		m[n].data = malloc(m[n].len ? m[n].len : 1);
		for (size_t i = 0; i < m[n].len; i++) {
			int hi = fx_nibble(sp[1 + 2 * i]), lo = fx_nibble(sp[2 + 2 * i]);

			if (hi < 0 || lo < 0)
				goto bad;
			m[n].data[i] = (uint8_t)(hi << 4 | lo);
		}
		n++;
	}
	free(line);
	fclose(f);
	*out = m;
	return (long)n;
bad:
	free(line);
	fclose(f);
	for (size_t i = 0; i < n; i++)
		free(m[i].data);
	free(m);
	return -1;
}

static inline void
fx_free(struct fx_msg *m, long n)
{
	for (long i = 0; i < n; i++)
		free(m[i].data);
	free(m);
}

#endif
