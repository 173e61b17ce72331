/* Token id lists on the command line: "1,2,3" (spaces allowed, also a JSON array "[1, 2]"). */
#ifndef DS_CLI_CLI_IDS_H
#define DS_CLI_CLI_IDS_H

#include <stdint.h>

#include "common/status.h"

/* Parses s into a malloc'ed array (*out, *n). Empty lists, non-integers and values outside
 * [0, 2^31) are STATUS_INVALID naming the position. */
int cli_ids_parse(const char *s, int32_t **out, int *n, status *st);

#endif
