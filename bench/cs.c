/* A critical section for the contention benchmark: appends "start end worker" (CLOCK_MONOTONIC, ns;
 * $BENCH_WORKER) to LOG around a sleep of MS milliseconds. One write per section, O_APPEND, so
 * workers never interleave. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: cs LOG MS\n");
        return 2;
    }
    long long start = now_ns();
    long ms = atol(argv[2]);
    struct timespec d = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&d, &d) != 0) {
    }
    long long end = now_ns();
    const char *worker = getenv("BENCH_WORKER");
    char line[96];
    int n = snprintf(line, sizeof line, "%lld %lld %d\n", start, end, worker ? atoi(worker) : 0);
    int fd = open(argv[1], O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n) {
        perror("cs");
        return 1;
    }
    close(fd);
    return 0;
}
