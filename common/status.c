#include "common/status.h"

#include <stdarg.h>
#include <string.h>

int status_fail(status *st, status_code code, const char *fmt, ...)
{
    if (st) {
        va_list ap;
        va_start(ap, fmt);
        st->code = code;
        vsnprintf(st->msg, sizeof st->msg, fmt, ap);
        va_end(ap);
    }
    return (int)code;
}

void status_clear(status *st)
{
    st->code = STATUS_OK;
    st->msg[0] = '\0';
}

const char *status_code_name(status_code code)
{
    static const char *names[] = {
        "OK",       "INVALID",     "IO",        "NOMEM",     "FORMAT",
        "UNSUPPORTED", "NOT_FOUND", "RANGE",    "EXHAUSTED", "UNAVAILABLE",
        "CANCELLED", "DEADLINE",   "DEVICE",    "INTERNAL",  "UNAUTHENTICATED",
        "PRECONDITION",
    };
    if ((unsigned)code < sizeof names / sizeof names[0])
        return names[code];
    return "UNKNOWN";
}
