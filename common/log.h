/* Levelled logging to stderr, one line per event. The level is checked before any formatting,
 * so a disabled LOG_DEBUG costs one comparison. Never log per token. */
#ifndef DS_COMMON_LOG_H
#define DS_COMMON_LOG_H

typedef enum log_level {
    LOG_LEVEL_DEBUG = 0,
    LOG_LEVEL_INFO,
    LOG_LEVEL_WARN,
    LOG_LEVEL_ERROR,
    LOG_LEVEL_OFF, /* as a threshold only: nothing is logged (a CLI that reports errors itself) */
} log_level;

extern log_level log_threshold; /* set once at start-up (from --log-level / DS_LOG_LEVEL) */

void log_write(log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Parses "debug", "info", "warn", "error"; returns -1 if unknown. */
int log_level_parse(const char *s);

/* A rate limit for one kind of line that can come in floods (refused requests under
 * overload): at most one line per LOG_LIMIT_MS; the ones held back are counted and the next
 * line written says how many (log_limit_pass's *more, over *since_s seconds). Lock-free;
 * a static zero-initialised log_limit is ready to use. */
#define LOG_LIMIT_MS 1000
typedef struct log_limit {
    _Atomic long long next_ms; /* clock_now_ms before which lines are held back */
    _Atomic long long last_ms; /* when the last line was written */
    _Atomic long more;         /* held back since */
} log_limit;

/* 1: write the line now (*more held back before it, over the last *since_s seconds);
 * 0: held back (counted). */
int log_limit_pass(log_limit *l, long *more, double *since_s);

#define LOG_AT(lvl, ...)                              \
    do {                                              \
        if ((lvl) >= log_threshold) log_write((lvl), __VA_ARGS__); \
    } while (0)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
