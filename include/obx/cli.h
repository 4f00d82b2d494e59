/*
 * cli.h - the commands behind "outboxd check" and "outboxd status".
 * Each takes a loaded configuration and returns the process exit status
 * (0 success, 1 runtime failure).
 */
#ifndef OBX_CLI_H
#define OBX_CLI_H

#include "obx/config.h"

enum obx_exit { OBX_EXIT_OK = 0, OBX_EXIT_FAILURE = 1, OBX_EXIT_USAGE = 2 };

/*
 * standby (NULL: none) is a standby's conninfo: check also says whether it
 * holds a persistent synchronized copy of the slot (PostgreSQL 17+).
 */
int obx_cmd_check(const struct obx_config *cfg, const char *standby);
int obx_cmd_status(const struct obx_config *cfg, bool json);

#endif
