/*
 * config_load.h - loading the configuration (I/O): the INI file read with
 * libinih, and the checks only libpq and librdkafka can make (is a
 * connection string valid, does librdkafka accept a property).  The rules
 * themselves live in the pure config.h; this is the edge that feeds them.
 */
#ifndef OBX_CONFIG_LOAD_H
#define OBX_CONFIG_LOAD_H

#include <stddef.h>

#include "obx/core/config.h"

/* The longest line the file may hold, in bytes, its newline not counted. */
#define OBX_CONFIG_MAX_LINE 65536

/*
 * The libpq and librdkafka checks, for obx_config_set() through cfg->checks.
 * Static data; never freed.
 */
extern const struct obx_config_checks obx_config_io_checks;

/*
 * The whole sequence: defaults with obx_config_io_checks, the file (path
 * must be readable; NULL for none), the environment, the --set overrides,
 * finish.  On
 * error cfg is still valid for obx_config_reset(), which the caller always
 * calls.  Returns 0, OBX_ECONFIG or OBX_ENOMEM (errbuf filled, in the form
 * config.h describes).
 */
int obx_config_load(struct obx_config *cfg, const char *path, char *const *envp, const char *const *sets,
    size_t nsets, char *errbuf, size_t errlen);

/*
 * Writes conninfo (key/value or URI form) to out with any password replaced
 * by "********", as key/value pairs.  Returns 0, or OBX_EINVAL when conninfo
 * does not parse (out then holds a placeholder that reveals nothing).
 */
int obx_conninfo_redact(const char *conninfo, char *out, size_t outlen);

#endif
