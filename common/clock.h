/* Monotonic time: the one clock (CLOCK_MONOTONIC) for timings, deadlines and timed waits.
 * Times are int64 counts since an arbitrary start (boot), comparable across threads of one
 * process; deadlines are absolute times on this clock, INT64_MAX for "none". */
#ifndef DS_COMMON_CLOCK_H
#define DS_COMMON_CLOCK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#define CLOCK_NO_DEADLINE INT64_MAX

int64_t clock_now_ns(void);
int64_t clock_now_us(void);
int64_t clock_now_ms(void);
/* Seconds as a double (benchmarks and reports). */
double clock_now_s(void);

/* The absolute time ms milliseconds from now (CLOCK_NO_DEADLINE when ms is). */
int64_t clock_deadline_ms(int64_t ms);
/* Milliseconds left until deadline_ms (<= 0: passed; INT64_MAX for CLOCK_NO_DEADLINE). */
int64_t clock_left_ms(int64_t deadline_ms);
/* true once deadline_ms has passed (never for CLOCK_NO_DEADLINE). */
bool clock_expired(int64_t deadline_ms);

/* deadline_ms as the absolute timespec pthread_cond_timedwait wants, for a condition variable
 * initialised with clock_cond_init. */
struct timespec clock_timespec_ms(int64_t deadline_ms);
/* Initialises cv to time its waits on this clock (pthread_cond_init's return). */
int clock_cond_init(pthread_cond_t *cv);

#endif
