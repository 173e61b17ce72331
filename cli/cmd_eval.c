/* Placeholder until its issue lands: says so and fails. */
#include <stdio.h>

#include "cli/cli.h"

int cmd_eval(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "deltaserve: 'eval' is not built yet\n");
    return 2;
}
