/* Placeholder until its issue lands: says so and fails. */
#include <stdio.h>

#include "cli/cli.h"

int cmd_gguf_info(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "deltaserve: 'gguf_info' is not built yet\n");
    return 2;
}
