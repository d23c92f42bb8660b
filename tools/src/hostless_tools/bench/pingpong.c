/*
 * pingpong.c -- the physical-limit references of the fence benchmark.
 *
 * Two processes (fork) bounce one 32-bit word that lives on one cache line
 * of a MAP_SHARED anonymous mapping:  A stores 2i+1 and waits for 2i+2,
 * B waits for 2i+1 and stores 2i+2.
 *
 *   spin:   both sides busy-wait on the word (no system call at all).
 *   futex:  the waiter sleeps at once in FUTEX_WAIT (shared futex) and the
 *           signaler always calls FUTEX_WAKE after its store: a blocking
 *           wake-up per hop, the cost a sleeping waiter cannot avoid.
 *
 * A timestamps every round trip with CLOCK_MONOTONIC (one clock read per
 * round, as the Python loops do) and prints one JSON object on stdout:
 *   {"mode": "spin", "n": N, "warmup": W, "pinned": true, "samples_ns": [...]}
 *
 * usage: pingpong MODE N WARMUP CPU_A CPU_B     (a CPU of -1 = do not pin)
 *
 * Compiled at benchmark time with `gcc -O2` by hostless_tools.bench.fences.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct line {
    _Alignas(64) uint32_t word;
    char pad[60];
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int pin(int cpu) {
    if (cpu < 0) return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set) == 0;
}

static void futex_wait(uint32_t *w, uint32_t seen) {
    syscall(SYS_futex, w, FUTEX_WAIT, seen, NULL, NULL, 0);
}

static void futex_wake(uint32_t *w) { syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0); }

/* wait until *w == want */
static inline void wait_for(uint32_t *w, uint32_t want, int use_futex) {
    for (;;) {
        uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
        if (v == want) return;
        if (use_futex)
            futex_wait(w, v);
        else
            cpu_relax();
    }
}

static inline void post(uint32_t *w, uint32_t v, int use_futex) {
    __atomic_store_n(w, v, __ATOMIC_RELEASE);
    if (use_futex) futex_wake(w);
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s spin|futex N WARMUP CPU_A CPU_B\n", argv[0]);
        return 2;
    }
    int use_futex;
    if (strcmp(argv[1], "spin") == 0)
        use_futex = 0;
    else if (strcmp(argv[1], "futex") == 0)
        use_futex = 1;
    else {
        fprintf(stderr, "mode must be spin or futex\n");
        return 2;
    }
    long n = atol(argv[2]), warm = atol(argv[3]);
    int cpu_a = atoi(argv[4]), cpu_b = atoi(argv[5]);
    if (n <= 0 || warm < 0 || n + warm >= (1L << 30)) {
        fprintf(stderr, "bad N or WARMUP\n");
        return 2;
    }
    struct line *ln = mmap(NULL, sizeof *ln, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (ln == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    ln->word = 0;
    uint64_t *samples = malloc(sizeof(uint64_t) * (size_t)n);
    if (!samples) {
        perror("malloc");
        return 1;
    }
    uint32_t total = (uint32_t)(n + warm);
    fflush(stdout);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    alarm(300); /* never hang a benchmark run if the peer died */
    if (child == 0) {
        pin(cpu_b);
        for (uint32_t i = 0; i < total; i++) {
            wait_for(&ln->word, 2 * i + 1, use_futex);
            post(&ln->word, 2 * i + 2, use_futex);
        }
        _exit(0);
    }
    int pinned = pin(cpu_a) && cpu_b >= 0;
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < total; i++) {
        post(&ln->word, 2 * i + 1, use_futex);
        wait_for(&ln->word, 2 * i + 2, use_futex);
        uint64_t t = now_ns();
        if (i >= (uint32_t)warm) samples[i - (uint32_t)warm] = t - t0;
        t0 = t;
    }
    int st = 0;
    waitpid(child, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "peer process failed\n");
        return 1;
    }
    printf("{\"mode\": \"%s\", \"n\": %ld, \"warmup\": %ld, \"pinned\": %s, \"samples_ns\": [", argv[1], n, warm,
           pinned ? "true" : "false");
    for (long i = 0; i < n; i++) printf(i ? ",%llu" : "%llu", (unsigned long long)samples[i]);
    printf("]}\n");
    free(samples);
    return 0;
}
