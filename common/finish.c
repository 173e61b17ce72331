#include "common/finish.h"

const char *finish_reason_name(int f)
{
    static const char *const names[FINISH_N] = {
        [FINISH_NONE] = "",
        [FINISH_STOP] = "stop",
        [FINISH_LENGTH] = "length",
        [FINISH_CANCELLED] = "cancelled",
        [FINISH_ERROR] = "error",
    };
    return f >= 0 && f < FINISH_N ? names[f] : "?";
}
