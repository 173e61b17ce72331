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

#define LOG_AT(lvl, ...)                              \
    do {                                              \
        if ((lvl) >= log_threshold) log_write((lvl), __VA_ARGS__); \
    } while (0)
#define LOG_DEBUG(...) LOG_AT(LOG_LEVEL_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(LOG_LEVEL_INFO, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(LOG_LEVEL_WARN, __VA_ARGS__)
#define LOG_ERROR(...) LOG_AT(LOG_LEVEL_ERROR, __VA_ARGS__)

#endif
