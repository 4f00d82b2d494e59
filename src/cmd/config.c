/*
 * config.c - "outboxd config": the effective configuration (file, then
 * environment, then --set) or the defaults, printed as an INI file that
 * obx_config_load() reads back, and the configuration reference in
 * Markdown (docs/reference/configuration.md).  Both come from the one
 * table, config_table.c.  No secret is ever printed: a secret key is shown
 * as a comment, a connection string with its password replaced, so what
 * is read back lacks the secrets (they come from their files or the
 * environment, as in production).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obx/cmd/cli.h"
#include "obx/core/config.h"
#include "obx/core/config_table.h"
#include "obx/core/err.h"
#include "obx/sys/config_load.h"

/* A value and its formatting fit in this: the longest line a file may hold, twice over. */
#define VALUE_MAX (2 * OBX_CONFIG_MAX_LINE + 64)

static void
print_pair(FILE *out, const char *key, const char *value, bool secret)
{
	if (secret && value[0] != '\0')
		fprintf(out, "; %s = (secret, not shown)\n", key);
	else if (value[0] == '\0')
		fprintf(out, "%s =\n", key);
	else
		fprintf(out, "%s = %s\n", key, value);
}

static void
print_map(FILE *out, const struct obx_config *cfg, const struct obx_cfg_key *k)
{
	const struct obx_kv *kv = *(struct obx_kv *const *)(const void *)((const char *)cfg + k->off);
	size_t n = *(const size_t *)(const void *)((const char *)cfg + k->size);
	size_t plen = strlen(k->name) - 1;

	if (k->secret == OBX_CFG_PROPS && n == 0)
		fprintf(out, "; bootstrap.servers = host:port,... (required)\n");
	for (size_t i = 0; i < n; i++) {
		bool secret = k->secret == OBX_CFG_PROPS && obx_kafka_prop_is_secret(kv[i].key);
		char name[512];

		snprintf(name, sizeof(name), "%.*s%s", (int)plen, k->name, kv[i].key);
		print_pair(out, name, kv[i].value, secret);
	}
}

static int
print_config(FILE *out, const struct obx_config *cfg, const char *title)
{
	char *value = malloc(VALUE_MAX), *shown = malloc(VALUE_MAX);
	const char *section = "";
	int r = 0;

	if (value == NULL || shown == NULL) {
		r = OBX_ENOMEM;
		goto out;
	}
	fprintf(out, "; %s\n", title);
	for (size_t i = 0; i < obx_cfg_nkeys; i++) {
		const struct obx_cfg_key *k = &obx_cfg_keys[i];

		if (strcmp(k->section, section) != 0) {
			section = k->section;
			fprintf(out, "\n[%s]\n", section);
		}
		if (k->type == OBX_CFG_MAP) {
			print_map(out, cfg, k);
			continue;
		}
		if ((r = obx_cfg_format(cfg, k, value, VALUE_MAX)) != 0)
			goto out;
		if (k->secret == OBX_CFG_CONNINFO && value[0] != '\0') {
			/* the password inside, if any, becomes ******** (a placeholder when it does not parse) */
			obx_conninfo_redact(value, shown, VALUE_MAX);
			print_pair(out, k->name, shown, false);
		} else {
			print_pair(out, k->name, value, k->secret == OBX_CFG_SECRET);
		}
	}
out:
	free(value);
	free(shown);
	return r;
}

int
obx_cmd_config(const struct obx_config *cfg, bool defaults)
{
	int r = print_config(stdout, cfg,
	    defaults ? "outboxd defaults (outboxd config --defaults)" :
	               "outboxd configuration: file, environment, --set (outboxd config); secrets not shown");

	if (r != 0 || fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "outboxd: could not print the configuration: %s\n",
		    r != 0 ? obx_strerror(r) : "write error");
		return OBX_EXIT_FAILURE;
	}
	return OBX_EXIT_OK;
}

/* ---- the reference ------------------------------------------------------- */

/* text in a Markdown table cell: '|' escaped */
static void
cell(FILE *out, const char *text, bool code)
{
	fputs(code ? "| `" : "| ", out);
	for (const char *p = text; *p != '\0'; p++) {
		if (*p == '|')
			fputc('\\', out);
		fputc(*p, out);
	}
	fputs(code ? "` " : " ", out);
}

static void
choices_cell(FILE *out, const struct obx_cfg_key *k)
{
	fputs("| ", out);
	for (size_t i = 0; i < k->nchoices; i++)
		fprintf(out, "%s`%s`", i ? ", " : "", k->choices[i].name);
	fputs(" ", out);
}

static void
reference_row(FILE *out, const struct obx_cfg_key *k)
{
	static const char *const reloads[] = { "restart", "SIGHUP", "SIGHUP (logical mode)" };
	char env[128];

	if (k->type == OBX_CFG_MAP)
		fprintf(out, "| `%.*s<name>` ", (int)strlen(k->name) - 1, k->name);
	else
		cell(out, k->name, true);
	cell(out, k->type_name, false);
	if (k->def == NULL)
		cell(out, "", false);
	else if (k->def[0] == '\0')
		cell(out, "*empty*", false);
	else
		cell(out, k->def, true);
	if (k->type == OBX_CFG_BOOL || k->type == OBX_CFG_ENUM)
		choices_cell(out, k);
	else
		cell(out, k->range != NULL ? k->range : (k->flags & OBX_CFG_NONEMPTY) ? "not empty" : "", false);
	cell(out, reloads[k->reload], false);
	if (obx_cfg_env_name(k, env, sizeof(env)) == 0)
		cell(out, env, true);
	else
		cell(out, "-", false);
	cell(out, k->desc, false);
	if (k->secret == OBX_CFG_SECRET)
		fputs("(secret: never printed) ", out);
	else if (k->secret == OBX_CFG_CONNINFO)
		fputs("(printed with its password redacted) ", out);
	else if (k->secret == OBX_CFG_PROPS)
		fputs("(sensitive properties never printed) ", out);
	fputs("|\n", out);
}

static const char reference_intro[] =
    "# Configuration reference\n"
    "\n"
    "<!-- Generated by `outboxd config --reference` from src/core/config_table.c.\n"
    "     Do not edit: change the table, then run scripts/gen-config-doc.sh. -->\n"
    "\n"
    "outboxd reads its settings from an INI file (`-c FILE`), then from the environment,\n"
    "then from `--set section.key=value`; a later source wins. `outboxd config` prints the\n"
    "result (secrets not shown), `outboxd config --defaults` the defaults below as a file.\n"
    "\n"
    "- **Environment**: `OUTBOXD_<SECTION>_<KEY>` in upper case; in `[kafka]` each `.` of a\n"
    "  property's name is written `_`. `OUTBOXD_<SECTION>_<KEY>_FILE` names a file that holds\n"
    "  the value (one trailing newline removed), for secrets mounted as files; setting both is\n"
    "  an error.\n"
    "- **Booleans** take `true`/`false`, `on`/`off`, `yes`/`no`, `1`/`0`; an enum takes exactly\n"
    "  one of its choices.\n"
    "- **Durations** are a number and a unit: `ms`, `s`, `min` (or `m`), `h` (`500ms`, `10s`,\n"
    "  `5min`).\n"
    "- **Sizes** are a number of bytes, or a number and `KiB` (`k`, `K`, `kB`), `MiB` (`M`,\n"
    "  `MB`) or `GiB` (`G`, `GB`): `64MiB`.\n"
    "- **Reload**: on `SIGHUP` outboxd re-reads every source. A key marked SIGHUP takes effect\n"
    "  at once; any other change is named in one warning and waits for a restart.\n"
    "- **Errors**: a bad value stops outboxd with one line naming where it came from\n"
    "  (`FILE:LINE`, `environment OUTBOXD_...` or `--set section.key`), the key and the reason,\n"
    "  exit status 2. A secret's value is never in it.\n";

int
obx_cmd_config_reference(void)
{
	FILE *out = stdout;

	fputs(reference_intro, out);
	for (size_t s = 0; s < obx_cfg_nsections; s++) {
		const struct obx_cfg_section *sec = &obx_cfg_sections[s];

		fprintf(out, "\n## [%s]\n\n%s\n\n", sec->name, sec->desc);
		fputs("| Key | Type | Default | Range / choices | Reload | Environment | Description |\n"
		      "| --- | --- | --- | --- | --- | --- | --- |\n",
		    out);
		for (size_t i = 0; i < obx_cfg_nkeys; i++)
			if (strcmp(obx_cfg_keys[i].section, sec->name) == 0)
				reference_row(out, &obx_cfg_keys[i]);
	}
	if (fflush(out) != 0 || ferror(out)) {
		fprintf(stderr, "outboxd: could not print the reference: write error\n");
		return OBX_EXIT_FAILURE;
	}
	return OBX_EXIT_OK;
}
