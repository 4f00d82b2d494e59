/*
 * main.c - argv, configuration loading, the command dispatch and exit codes.
 *
 * Exit codes: 0 clean stop, 1 runtime failure, 2 usage or configuration error.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "obx/cmd/cli.h"
#include "obx/core/config.h"
#include "obx/core/kafkacompat.h"
#include "obx/sys/config_load.h"
#include "obx/core/err.h"
#include "obx/sys/log.h"
#include "obx/run/poll.h"
#include "obx/run/relay.h"

extern char **environ;

static const char usage_text[] =
    "outboxd - PostgreSQL transactional outbox to Kafka relay\n"
    "\n"
    "Usage:\n"
    "  outboxd [run] -c FILE [--set section.key=value ...] [--recreate-slot]\n"
    "  outboxd check -c FILE [--set ...] [--standby CONNINFO]\n"
    "                                        preflight: server, wal_level, slot; with\n"
    "                                        --standby, that standby's copy of the slot\n"
    "  outboxd status -c FILE [--json]       slot position and lag\n"
    "  outboxd drop-slot -c FILE [--yes] [--drop-publication]\n"
    "                                        decommission: drop the slot, its snapshot\n"
    "                                        marker and guard record (lists them without --yes)\n"
    "  outboxd config [-c FILE] [--set ...]  the effective configuration (file, environment,\n"
    "                                        --set) as a file, secrets not shown\n"
    "  outboxd config --defaults | --reference\n"
    "                                        the defaults as a file; the reference (Markdown)\n"
    "  outboxd --help | --version\n"
    "\n"
    "Options:\n"
    "  -c, --config FILE   INI configuration file\n"
    "      --set S.K=V     override one setting (after the file and the environment)\n"
    "      --json          machine-readable output (status)\n"
    "      --yes           drop-slot: drop what it lists (without it, nothing changes)\n"
    "      --drop-publication\n"
    "                      drop-slot: drop the publication too (only when no other\n"
    "                      slot's guard record is in its comment)\n"
    "      --defaults      config: print the defaults (a valid configuration file)\n"
    "      --reference     config: print every key's type, default, range and reload\n"
    "      --recreate-slot recreate a slot that existed before and is gone (events\n"
    "                      committed while it was missing are not published)\n"
    "  -h, --help          show this help\n"
    "  -V, --version       show the version and the librdkafka in use\n"
    "\n"
    "Every setting can also come from the environment as OUTBOXD_<SECTION>_<KEY>\n"
    "(in [kafka], '_' stands for '.'), e.g. OUTBOXD_KAFKA_SASL_PASSWORD.\n"
    "libpq's own variables (PGHOST, PGPASSWORD, PGSSLMODE, ...) apply as usual.\n"
    "\n"
    "Exit status: 0 clean stop, 1 runtime failure, 2 usage or configuration error\n"
    "(drop-slot without --yes: 2 after listing what it would drop).\n";

static int
usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "outboxd: %s%s%s%s", what, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
	fprintf(stderr, "\nTry 'outboxd --help' for more information.\n");
	return OBX_EXIT_USAGE;
}

enum command { CMD_RUN, CMD_CHECK, CMD_STATUS, CMD_DROP_SLOT, CMD_CONFIG };

/* The self-pipe: signal handlers write one byte per signal, its number. */
static int signal_pipe[2] = { -1, -1 };

/* What SIGHUP re-reads: the same file, environment and --set overrides. */
struct reload_args {
	char *path; /* copies: setproctitle() reuses the memory of argv */
	char **sets;
	size_t nsets;
};

static int
reload_config(void *ctx, struct obx_config *out, char *errbuf, size_t errlen)
{
	const struct reload_args *a = ctx;

	return obx_config_load(out, a->path, environ, (const char *const *)a->sets, a->nsets, errbuf, errlen);
}

static void
on_signal(int sig)
{
	int saved = errno;
	char c = (char)sig;

	if (write(signal_pipe[1], &c, 1) < 0) {
		/* the pipe is full: enough signals are pending already */
	}
	errno = saved;
}

/*
 * Large records (a 1 MiB payload) are allocated twice per event: libpq's copy of
 * the CopyData message and the producer's copy of the value.  glibc's default
 * gives such blocks back to the kernel as soon as two are free at the top of
 * the heap, so every event paid for fresh zeroed pages: half of outboxd's CPU on
 * bench/ shape d.  Each arena now keeps up to the in-flight byte bound of freed
 * memory at its top, which the relay may hold resident anyway, so peak RSS does
 * not move; blocks larger than that are still mapped and unmapped on their own.
 * An operator's own malloc settings (the environment) are left alone.
 */
static void
tune_malloc(const struct obx_config *cfg)
{
#ifdef __GLIBC__
	const char *t = getenv("GLIBC_TUNABLES");
	long long keep = cfg->max_inflight_bytes;

	if (getenv("MALLOC_MMAP_THRESHOLD_") != NULL || getenv("MALLOC_TRIM_THRESHOLD_") != NULL ||
	    (t != NULL && strstr(t, "glibc.malloc.") != NULL))
		return;
	if (keep < 1LL << 20)
		keep = 1LL << 20;
	if (keep > 32LL << 20)
		keep = 32LL << 20;
	if (mallopt(M_MMAP_THRESHOLD, (int)keep) != 1 || mallopt(M_TRIM_THRESHOLD, (int)keep) != 1)
		obx_log_debug("malloc keeps its default thresholds (mallopt refused %lld bytes)", keep);
#else
	(void)cfg;
#endif
}

static int
cmd_run(const struct obx_config *cfg, bool recreate_slot, struct reload_args *reload)
{
	struct obx_run_opts opts = { recreate_slot, -1, reload_config, reload };
	struct sigaction sa;

	if (pipe2(signal_pipe, O_NONBLOCK | O_CLOEXEC) != 0) {
		obx_log_error("could not create signal pipe: %s", strerror(errno));
		return OBX_EXIT_FAILURE;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	opts.signal_fd = signal_pipe[0];
	tune_malloc(cfg);
	{
		char line[512];

		if (obx_kafka_scram_too_old(cfg, (unsigned)rd_kafka_version(), line, sizeof(line)))
			obx_log_warn("%s", line);
	}
	if (cfg->mode == OBX_SOURCE_POLL)
		return obx_poll_run(cfg, &opts);
	return obx_relay_run(cfg, &opts);
}

static void
free_sets(struct reload_args *a)
{
	for (size_t i = 0; a->sets != NULL && i < a->nsets; i++) {
		explicit_bzero(a->sets[i], strlen(a->sets[i])); /* an override may carry a secret */
		free(a->sets[i]);
	}
	free(a->sets);
	a->sets = NULL;
	a->nsets = 0;
	free(a->path);
	a->path = NULL;
}

/*
 * outboxd config: the defaults, the reference, or what the file (if any),
 * the environment and the --set overrides make.
 */
static int
config_command(const char *path, const char **sets, size_t nsets, bool defaults, bool reference)
{
	struct obx_config cfg;
	char errbuf[1024];
	int rc;

	if ((defaults || reference) && (path != NULL || nsets > 0 || (defaults && reference)))
		return usage_error(defaults && reference ? "--defaults and --reference exclude each other" :
		                                           "--defaults and --reference take no -c or --set",
		    NULL);
	if (reference)
		return obx_cmd_config_reference();
	if (defaults)
		rc = obx_config_init(&cfg);
	else
		rc = obx_config_load(&cfg, path, environ, sets, nsets, errbuf, sizeof(errbuf));
	if (rc != 0) {
		fprintf(stderr, "outboxd: %s\n", rc == OBX_ENOMEM || defaults ? obx_strerror(rc) : errbuf);
		obx_config_reset(&cfg);
		return rc == OBX_ENOMEM ? OBX_EXIT_FAILURE : OBX_EXIT_USAGE;
	}
	rc = obx_cmd_config(&cfg, defaults);
	obx_config_reset(&cfg);
	return rc;
}

static void
init_proctitle(int argc, char **argv)
{
	/* libbsd moves argv and the environment aside so ps can show the relay's state */
	setproctitle_init(argc, argv, environ);
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "set", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, 'j' },
		{ "recreate-slot", no_argument, NULL, 'r' },
		{ "yes", no_argument, NULL, 'y' },
		{ "drop-publication", no_argument, NULL, 'P' },
		{ "standby", required_argument, NULL, 'S' },
		{ "defaults", no_argument, NULL, 'D' },
		{ "reference", no_argument, NULL, 'R' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	enum command cmd = CMD_RUN;
	const char *config_path = NULL;
	const char **sets = NULL;
	size_t nsets = 0;
	bool json = false;
	bool recreate_slot = false;
	bool yes = false, drop_publication = false;
	bool defaults = false, reference = false;
	const char *standby = NULL;
	struct obx_config cfg;
	struct reload_args reload = { NULL, NULL, 0 };
	char errbuf[1024];
	int c, rc;

	if (argc > 1 && argv[1][0] != '-') {
		if (strcmp(argv[1], "run") == 0)
			cmd = CMD_RUN;
		else if (strcmp(argv[1], "check") == 0)
			cmd = CMD_CHECK;
		else if (strcmp(argv[1], "status") == 0)
			cmd = CMD_STATUS;
		else if (strcmp(argv[1], "drop-slot") == 0)
			cmd = CMD_DROP_SLOT;
		else if (strcmp(argv[1], "config") == 0)
			cmd = CMD_CONFIG;
		else
			return usage_error("unknown command", argv[1]);
		argv[1] = argv[0];
		argv++;
		argc--;
	}
	sets = calloc((size_t)argc, sizeof(*sets));
	if (sets == NULL) {
		fprintf(stderr, "outboxd: out of memory\n");
		return OBX_EXIT_FAILURE;
	}
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":c:hV", longopts, NULL)) != -1) {
		switch (c) {
		case 'c':
			config_path = optarg;
			break;
		case 's':
			sets[nsets++] = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'r':
			recreate_slot = true;
			break;
		case 'y':
			yes = true;
			break;
		case 'P':
			drop_publication = true;
			break;
		case 'S':
			standby = optarg;
			break;
		case 'D':
			defaults = true;
			break;
		case 'R':
			reference = true;
			break;
		case 'h':
			fputs(usage_text, stdout);
			free(sets);
			return OBX_EXIT_OK;
		case 'V':
			/* the librdkafka loaded, which may differ from the one built against */
			printf("outboxd %s (librdkafka %s)\n", OBX_VERSION, rd_kafka_version_str());
			free(sets);
			return OBX_EXIT_OK;
		case ':':
			free(sets);
			return usage_error("option needs a value:", argv[optind - 1]);
		default:
			free(sets);
			return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind < argc) {
		free(sets);
		return usage_error("unexpected argument", argv[optind]);
	}
	if ((defaults || reference) && cmd != CMD_CONFIG) {
		free(sets);
		return usage_error(
		    defaults ? "--defaults applies to config only" : "--reference applies to config only", NULL);
	}
	if (cmd == CMD_CONFIG) {
		rc = config_command(config_path, sets, nsets, defaults, reference);
		free(sets);
		return rc;
	}
	if (config_path == NULL) {
		free(sets);
		return usage_error("missing -c FILE", NULL);
	}
	if (recreate_slot && cmd != CMD_RUN) {
		free(sets);
		return usage_error("--recreate-slot applies to run only", NULL);
	}
	if (standby != NULL && cmd != CMD_CHECK) {
		free(sets);
		return usage_error("--standby applies to check only", NULL);
	}
	if (json && cmd != CMD_STATUS) {
		free(sets);
		return usage_error("--json applies to status only", NULL);
	}
	if ((yes || drop_publication) && cmd != CMD_DROP_SLOT) {
		free(sets);
		return usage_error(yes ? "--yes applies to drop-slot only" :
		                         "--drop-publication applies to drop-slot only",
		    NULL);
	}

	reload.path = strdup(config_path); /* optarg lives in argv, which setproctitle() reuses */
	reload.sets = calloc(nsets + 1, sizeof(*reload.sets));
	for (size_t i = 0; reload.sets != NULL && i < nsets; i++)
		if ((reload.sets[reload.nsets] = strdup(sets[i])) != NULL)
			reload.nsets++;
	if (reload.path == NULL || reload.sets == NULL || reload.nsets != nsets) {
		fprintf(stderr, "outboxd: out of memory\n");
		free_sets(&reload);
		free(sets);
		return OBX_EXIT_FAILURE;
	}
	if (cmd == CMD_RUN)
		init_proctitle(argc, argv);
	rc = obx_config_load(&cfg, config_path, environ, sets, nsets, errbuf, sizeof(errbuf));
	free(sets);
	if (rc != 0) {
		fprintf(stderr, "outboxd: %s\n", rc == OBX_ENOMEM ? obx_strerror(rc) : errbuf);
		obx_config_reset(&cfg);
		free_sets(&reload);
		return rc == OBX_ENOMEM ? OBX_EXIT_FAILURE : OBX_EXIT_USAGE;
	}
	obx_log_setup(cfg.log_level, cfg.log_format);

	switch (cmd) {
	case CMD_CHECK:
		rc = obx_cmd_check(&cfg, standby);
		break;
	case CMD_STATUS:
		rc = obx_cmd_status(&cfg, json);
		break;
	case CMD_DROP_SLOT:
		rc = obx_cmd_drop_slot(&cfg, yes, drop_publication);
		break;
	case CMD_RUN:
	default:
		rc = cmd_run(&cfg, recreate_slot, &reload);
		break;
	}
	obx_config_reset(&cfg);
	free_sets(&reload);
	return rc;
}
