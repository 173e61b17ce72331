#include "common/clock.h"

int64_t clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t clock_now_us(void) { return clock_now_ns() / 1000; }

int64_t clock_now_ms(void) { return clock_now_ns() / 1000000; }

double clock_now_s(void) { return (double)clock_now_ns() * 1e-9; }

int64_t clock_deadline_ms(int64_t ms)
{
    if (ms == CLOCK_NO_DEADLINE) return CLOCK_NO_DEADLINE;
    const int64_t now = clock_now_ms();
    return ms > CLOCK_NO_DEADLINE - now ? CLOCK_NO_DEADLINE : now + ms;
}

int64_t clock_left_ms(int64_t deadline_ms)
{
    return deadline_ms == CLOCK_NO_DEADLINE ? CLOCK_NO_DEADLINE : deadline_ms - clock_now_ms();
}

bool clock_expired(int64_t deadline_ms)
{
    return deadline_ms != CLOCK_NO_DEADLINE && clock_now_ms() >= deadline_ms;
}

struct timespec clock_timespec_ms(int64_t deadline_ms)
{
    if (deadline_ms < 0) deadline_ms = 0;
    return (struct timespec){.tv_sec = (time_t)(deadline_ms / 1000),
                             .tv_nsec = (long)(deadline_ms % 1000 * 1000000)};
}

int clock_cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    const int rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}
