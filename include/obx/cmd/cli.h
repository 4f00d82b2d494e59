/*
 * cli.h - the commands behind "outboxd check", "outboxd status",
 * "outboxd drop-slot" and "outboxd config".  Each returns the process exit
 * status (0 success, 1 runtime failure, 2 usage).
 */
#ifndef OBX_CLI_H
#define OBX_CLI_H

#include "obx/core/config.h"

enum obx_exit { OBX_EXIT_OK = 0, OBX_EXIT_FAILURE = 1, OBX_EXIT_USAGE = 2 };

/*
 * standby (NULL: none) is a standby's conninfo: check also says whether it
 * holds a persistent synchronized copy of the slot (PostgreSQL 17+).
 */
int obx_cmd_check(const struct obx_config *cfg, const char *standby);
int obx_cmd_status(const struct obx_config *cfg, bool json);

/*
 * Decommissions cfg's slot: drops the logical slot, the marker slot of an
 * unfinished snapshot and the slot guard's record in the publication
 * comment; the publication itself only with drop_publication (nothing
 * records who created it), and never while its comment records another
 * slot.  Refuses (1) while a slot is active, naming the pid.  Without yes
 * it prints what it would drop, changes nothing and returns 2 (0 when
 * there is nothing to drop).  Returns 0 when everything listed is gone.
 */
int obx_cmd_drop_slot(const struct obx_config *cfg, bool yes, bool drop_publication);

/*
 * Prints cfg to stdout as an INI file obx_config_load() reads back: every
 * key of config_table.c in table order, [kafka] properties and header.<name>
 * mappings as given.  Secrets are comments without their value; the
 * conninfo is shown with its password redacted.  defaults only changes the
 * title line.
 */
int obx_cmd_config(const struct obx_config *cfg, bool defaults);

/* Prints the configuration reference (docs/reference/configuration.md) to stdout. */
int obx_cmd_config_reference(void);

#endif
