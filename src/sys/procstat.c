/*
 * procstat.c - the process's numbers from /proc; see procstat.h.
 */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "obx/core/err.h"
#include "obx/sys/procstat.h"

/* Reads up to len - 1 bytes of path into buf, NUL-terminated; false when it could not. */
static bool
slurp(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t used = 0;

	if (fd < 0)
		return false;
	while (used + 1 < len) {
		ssize_t n = read(fd, buf + used, len - 1 - used);

		if (n <= 0)
			break;
		used += (size_t)n;
	}
	close(fd);
	buf[used] = '\0';
	return used > 0;
}

/* The boot time (Unix seconds) from /proc/stat's btime line; -1 when absent. */
static int64_t
boot_time(void)
{
	FILE *fp = fopen("/proc/stat", "re");
	char line[256], *end;
	bool at_start = true; /* the intr line runs to kilobytes: read in pieces */
	long long v = -1;

	if (fp == NULL)
		return -1;
	while (fgets(line, sizeof(line), fp) != NULL) {
		if (at_start && strncmp(line, "btime ", 6) == 0) {
			errno = 0;
			v = strtoll(line + 6, &end, 10);
			if (end == line + 6 || errno != 0 || v <= 0)
				v = -1;
			break;
		}
		at_start = strchr(line, '\n') != NULL;
	}
	fclose(fp);
	return (int64_t)v;
}

/*
 * The fields of /proc/self/stat after the command name (which may hold
 * spaces and parentheses, so the scan starts at the last ')'): field 3
 * (state) is fields[0].
 */
#define STAT_FIELDS 22 /* through field 24, rss */
static bool
self_stat(unsigned long long fields[STAT_FIELDS])
{
	char buf[2048], *p, *end;

	if (!slurp("/proc/self/stat", buf, sizeof(buf)) || (p = strrchr(buf, ')')) == NULL)
		return false;
	p++;
	while (*p == ' ')
		p++;
	p++; /* the state letter */
	fields[0] = 0;
	for (int i = 1; i < STAT_FIELDS; i++) {
		errno = 0;
		fields[i] = strtoull(p, &end, 10);
		if (end == p || errno != 0)
			return false;
		p = end;
	}
	return true;
}

/* Open descriptors: the entries of /proc/self/fd, less the one that reads it. */
static int64_t
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int64_t n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
			n++;
	closedir(d);
	return n > 0 ? n - 1 : 0;
}

int
obx_procstat_read(struct obx_process *p)
{
	unsigned long long f[STAT_FIELDS];
	long tck = sysconf(_SC_CLK_TCK), page = sysconf(_SC_PAGESIZE);
	struct rlimit rl;
	int64_t btime = boot_time();
	int r = 0;

	p->cpu_seconds = -1;
	p->resident_bytes = p->virtual_bytes = p->open_fds = p->max_fds = -1;
	p->start_time_seconds = -1;
	if (tck > 0 && page > 0 && self_stat(f)) {
		/* utime, stime: fields 14, 15; starttime 22; vsize 23 (bytes); rss 24 (pages) */
		p->cpu_seconds = (double)(f[11] + f[12]) / (double)tck;
		if (btime > 0)
			p->start_time_seconds = (double)btime + (double)f[19] / (double)tck;
		p->virtual_bytes = (int64_t)f[20];
		p->resident_bytes = (int64_t)f[21] * page;
	}
	p->open_fds = open_fds();
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
		p->max_fds = rl.rlim_cur == RLIM_INFINITY ? INT64_MAX : (int64_t)rl.rlim_cur;
	if (p->cpu_seconds < 0 || p->start_time_seconds < 0 || p->open_fds < 0 || p->max_fds < 0)
		r = OBX_EIO;
	return r;
}
