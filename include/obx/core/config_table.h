/*
 * config_table.h - the one description of every configuration key (pure),
 * in the manner of PostgreSQL's guc_tables.c and librdkafka's property
 * table: section, name, type, range or choices, default, whether SIGHUP
 * applies it, whether it is a secret, a one-line description, and where it
 * lives in struct obx_config.  config.c parses, fills the defaults, compares
 * (SIGHUP) and frees by this table; `outboxd config` prints the effective
 * configuration and the reference (docs/reference/configuration.md) from it.
 * A key is spelled once, in config_table.c.
 *
 * The environment name of a key is derived, never stored:
 * OUTBOXD_<SECTION>_<KEY> upper-cased ('.' in a [kafka] property as '_'),
 * with OUTBOXD_<SECTION>_<KEY>_FILE naming a file that holds the value.
 *
 * Everything here is static data: nothing to free.
 */
#ifndef OBX_CONFIG_TABLE_H
#define OBX_CONFIG_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#include "obx/core/config.h"

enum obx_cfg_type {
	OBX_CFG_STRING,   /* text, stored as char * */
	OBX_CFG_INT,      /* decimal integer in [min, max] */
	OBX_CFG_BOOL,     /* obx_parse_bool()'s words; choices[0] true, choices[1] false as printed */
	OBX_CFG_ENUM,     /* exactly one of choices */
	OBX_CFG_DURATION, /* number with ms, s, min (m) or h, stored in milliseconds */
	OBX_CFG_SIZE,     /* number with B, KiB (k, K, kB), MiB (M, MB) or GiB (G, GB), in bytes */
	OBX_CFG_MAP,      /* name = value pairs under a prefix ("header." or, in [kafka], any name) */
	OBX_CFG_CUSTOM,   /* parsed, printed, compared and freed by the key's own functions */
};

/* What printing a value may show. */
enum obx_cfg_secret {
	OBX_CFG_PLAIN,
	OBX_CFG_SECRET,   /* never shown */
	OBX_CFG_CONNINFO, /* a connection string: shown with its password redacted */
	OBX_CFG_PROPS,    /* a map whose secret entries obx_kafka_prop_is_secret() names */
};

/* When a changed value takes effect. */
enum obx_cfg_reload {
	OBX_CFG_RESTART,        /* SIGHUP names it as needing a restart */
	OBX_CFG_SIGHUP,         /* SIGHUP applies it */
	OBX_CFG_SIGHUP_LOGICAL, /* SIGHUP applies it in logical mode; polling needs a restart */
};

#define OBX_CFG_NONEMPTY 0x1  /* STRING: "" is refused */
#define OBX_CFG_ZERO_NONE 0x2 /* DURATION: a plain "0" is accepted and means none */

struct obx_cfg_choice {
	const char *name;
	int value;
};

struct obx_cfg_key;

/* The functions of an OBX_CFG_CUSTOM key (each required). */
struct obx_cfg_custom {
	/* Stores value; returns 0, OBX_ECONFIG (errbuf filled, by obx_config_fail()) or OBX_ENOMEM. */
	int (*set)(struct obx_config *cfg, const char *key, const char *value, const char *origin, char *errbuf,
	    size_t errlen);
	/* Writes the value as the file would hold it; returns 0 or OBX_ERANGE (out too small). */
	int (*format)(const struct obx_config *cfg, char *out, size_t outlen);
	bool (*differs)(const struct obx_config *a, const struct obx_config *b);
	void (*reset)(struct obx_config *cfg);
};

struct obx_cfg_key {
	const char *section;
	const char *name;      /* "header.*": a MAP under that prefix; "*": every name */
	const char *diff_name; /* "[section] name": what obx_config_diff() reports */
	const char *group;     /* NULL, or the name several keys share in obx_config_diff() */
	enum obx_cfg_type type;
	const char *type_name;                /* for the reference: "duration", "host:port", ... */
	size_t off;                           /* the field in struct obx_config (a MAP: its struct obx_kv *) */
	size_t size;                          /* its size (a MAP: offset of its count) */
	size_t given_off;                     /* 0, or a bool set true when a source (not the default) sets it */
	long long min, max;                   /* INT, DURATION, SIZE */
	const char *range;                    /* min to max as messages write it: "100ms to 1h" */
	const char *example;                  /* DURATION, SIZE: "10s or 500ms" */
	const struct obx_cfg_choice *choices; /* BOOL, ENUM: in the order messages list them */
	size_t nchoices;
	unsigned flags; /* OBX_CFG_NONEMPTY, OBX_CFG_ZERO_NONE */
	enum obx_cfg_secret secret;
	enum obx_cfg_reload reload;
	const char *def; /* the default as the file writes it; NULL for a MAP */
	/*
	 * STRING, MAP: NULL or a check of value (a MAP's: of entry sub = value);
	 * returns 0, OBX_ECONFIG with errbuf holding the reason (never a secret's
	 * value), or OBX_ENOMEM.
	 */
	int (*check)(const struct obx_config *cfg, const char *sub, const char *value, char *errbuf,
	    size_t errlen);
	const struct obx_cfg_custom *custom;
	const char *desc; /* one line for the reference (Markdown) */
};

struct obx_cfg_section {
	const char *name;
	const char *desc; /* a sentence for the reference (Markdown) */
};

/* The sections in file order, and the keys, section by section in that order. */
extern const struct obx_cfg_section obx_cfg_sections[];
extern const size_t obx_cfg_nsections;
extern const struct obx_cfg_key obx_cfg_keys[];
extern const size_t obx_cfg_nkeys;

/* The section named name, or NULL. */
const struct obx_cfg_section *obx_cfg_section_find(const char *name);

/*
 * The key of section named name: the exact entry, else the MAP whose prefix
 * name starts with (and goes past); *sub is then the part after the prefix.
 * Returns NULL when section has no such key.
 */
const struct obx_cfg_key *obx_cfg_find(const char *section, const char *name, const char **sub);

/*
 * Writes k's environment variable name (OUTBOXD_SOURCE_SLOT; for [kafka]
 * OUTBOXD_KAFKA_<NAME>) to out.  Returns 0, OBX_ERANGE (truncated) or
 * OBX_ENOENT for a MAP outside [kafka] (header.<name> keeps its '.', which
 * no shell exports, and the environment's names are lower-cased).
 */
int obx_cfg_env_name(const struct obx_cfg_key *k, char *out, size_t outlen);

/*
 * Writes the value of k in cfg as the file would hold it (the secret's own
 * value too: the caller decides what to show).  Not for a MAP.  Returns 0,
 * OBX_ERANGE (out too small) or OBX_EINVAL (a MAP).
 */
int obx_cfg_format(const struct obx_config *cfg, const struct obx_cfg_key *k, char *out, size_t outlen);

#endif
