#include <stdio.h>

#include "obx/cli.h"

int obx_cmd_run(const struct obx_config *cfg);

int
obx_cmd_run(const struct obx_config *cfg)
{
	(void)cfg;
	fprintf(stderr, "outboxd: run: the relay is not part of this build yet\n");
	return OBX_EXIT_FAILURE;
}
