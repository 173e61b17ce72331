#include "common/log.h"

#include <stdatomic.h>

#include "common/clock.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

log_level log_threshold = LOG_LEVEL_INFO;

void log_write(log_level level, const char *fmt, ...)
{
    static const char *tags[] = {"debug", "info", "warn", "error"};
    char line[1024];
    struct timespec ts;
    struct tm tm;
    va_list ap;
    int n;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                 tags[level]);
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof line)
        vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    /* one write per line so lines from threads do not interleave */
    fprintf(stderr, "%s\n", line);
}

int log_level_parse(const char *s)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int i = 0; i < 4; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

int log_limit_pass(log_limit *l, long *more, double *since_s)
{
    long long now = (long long)clock_now_ms();
    long long next = atomic_load_explicit(&l->next_ms, memory_order_relaxed);
    if (now < next ||
        !atomic_compare_exchange_strong(&l->next_ms, &next, now + LOG_LIMIT_MS)) {
        atomic_fetch_add_explicit(&l->more, 1, memory_order_relaxed);
        return 0;
    }
    long long last = atomic_exchange(&l->last_ms, now);
    *more = atomic_exchange(&l->more, 0);
    *since_s = last ? (double)(now - last) / 1e3 : 0.0;
    return 1;
}
