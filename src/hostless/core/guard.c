/*
 * guard.c -- the SIGBUS guard.
 * Another process can truncate the domain file while we have it mapped;
 * touching a page past the new end raises SIGBUS.  The guard turns that into
 * an error: the handler maps a private zero page over the faulting page of a
 * registered domain mapping (so the access completes, reading zeros), marks
 * the domain truncated, and every later operation on it raises CorruptDomain
 * (waits and the watchdog stop).  A SIGBUS elsewhere goes to the previous
 * handler, or kills the process as it would have.
 */
#include "engine.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The table of guarded regions grows (doubling) so that every mapping is
 * guarded however many domains a process opens: the handler reads it without
 * a lock, so a full table is replaced by a larger copy published with one
 * atomic store, and older tables are kept (never freed; they are chained so
 * that a removal clears a region in every copy).  Their total is under twice
 * the largest table.  Only when memory for a larger table cannot be had does
 * adding fail, and the open fails with it: nothing is mapped unguarded. */
#define GUARD_INITIAL 256
struct guard_entry {
    uintptr_t lo, hi;
    int *flag;
};
struct guard_tab {
    int cap;
    struct guard_tab *older; /* the table this one replaced */
    struct guard_entry e[];
};
static struct guard_tab *g_tab; /* the current table (read by the handler) */
static pthread_mutex_t g_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_prev_bus;
static int g_guard_installed;

static __thread int g_in_bus; /* a handler we chain to raised SIGBUS again: end as before */

static void bus_handler(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    if (g_in_bus) {
        signal(SIGBUS, SIG_DFL);
        return;
    }
    struct guard_tab *t = __atomic_load_n(&g_tab, __ATOMIC_ACQUIRE);
    for (int i = 0; t && i < t->cap; i++) {
        uintptr_t lo = __atomic_load_n(&t->e[i].lo, __ATOMIC_ACQUIRE);
        uintptr_t hi = __atomic_load_n(&t->e[i].hi, __ATOMIC_ACQUIRE);
        if (!lo || a < lo || a >= hi) continue;
        void *pg = (void *)(a & ~(uintptr_t)(HL_PAGE - 1));
        if (mmap(pg, HL_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
            int *flag = __atomic_load_n(&t->e[i].flag, __ATOMIC_ACQUIRE);
            if (flag) __atomic_store_n(flag, 1, __ATOMIC_SEQ_CST);
            return; /* the faulting access is retried on the zero page */
        }
    }
    if (g_prev_bus.sa_flags & SA_SIGINFO) {
        if (g_prev_bus.sa_sigaction) {
            g_in_bus = 1;
            g_prev_bus.sa_sigaction(sig, si, uc);
            g_in_bus = 0;
            return;
        }
    } else if (g_prev_bus.sa_handler != SIG_DFL && g_prev_bus.sa_handler != SIG_IGN && g_prev_bus.sa_handler) {
        g_in_bus = 1;
        g_prev_bus.sa_handler(sig);
        g_in_bus = 0;
        return;
    }
    signal(SIGBUS, SIG_DFL); /* not ours: the access faults again and ends the process as before */
}

/* Under g_guard_mu: a table with a free entry (a larger copy when full); NULL without memory. */
static struct guard_tab *room(void) {
    struct guard_tab *t = g_tab;
    int n = t ? t->cap : 0;
    for (int i = 0; i < n; i++)
        if (!t->e[i].lo) return t;
    int cap = n ? 2 * n : GUARD_INITIAL;
    struct guard_tab *nt = calloc(1, sizeof *nt + (size_t)cap * sizeof nt->e[0]);
    if (!nt) return NULL;
    nt->cap = cap;
    nt->older = t;
    for (int i = 0; i < n; i++) nt->e[i] = t->e[i];
    __atomic_store_n(&g_tab, nt, __ATOMIC_RELEASE);
    return nt;
}

int hle_guard_add_region(hle_ctx *c, uintptr_t lo, uintptr_t hi) { return hle_guard_add_flag(lo, hi, &c->truncated); }

/* Under g_guard_mu: the handler in front, unless it is there.  A library that installs its own
 * SIGBUS handler after us (Ray's ray.init, faulthandler.enable) takes our place, and its
 * handler does not hand a fault back with its address (it re-raises): a truncated domain
 * then killed the process.  Ours goes back in front of it, and it gets what is not ours. */
static void front_locked(void) {
    struct sigaction cur;
    int ours = g_guard_installed && sigaction(SIGBUS, NULL, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) &&
               cur.sa_sigaction == bus_handler;
    if (ours) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = bus_handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_prev_bus) == 0) g_guard_installed = 1;
}

void hle_guard_front(void) {
    if (!__atomic_load_n(&g_tab, __ATOMIC_ACQUIRE)) return; /* nothing guarded yet: nothing to put back */
    pthread_mutex_lock(&g_guard_mu);
    front_locked();
    pthread_mutex_unlock(&g_guard_mu);
}

int hle_guard_add_flag(uintptr_t lo, uintptr_t hi, int *flag) {
    pthread_mutex_lock(&g_guard_mu);
    front_locked();
    struct guard_tab *t = room();
    for (int i = 0; t && i < t->cap; i++) {
        if (t->e[i].lo) continue;
        __atomic_store_n(&t->e[i].flag, flag, __ATOMIC_RELEASE);
        __atomic_store_n(&t->e[i].hi, hi, __ATOMIC_RELEASE);
        __atomic_store_n(&t->e[i].lo, lo, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&g_guard_mu);
    return t ? HL_OK : hle_fail(HL_E_NOMEM, "out of memory for the SIGBUS guard of another mapping: close a domain");
}

int hle_guard_add(hle_ctx *c) { return hle_guard_add_region(c, (uintptr_t)c->base, (uintptr_t)c->base + c->size); }

void hle_guard_remove(hle_ctx *c) { hle_guard_remove_flag(&c->truncated); /* its mapping and the regions it added */ }

void hle_guard_remove_flag(int *flag) {
    pthread_mutex_lock(&g_guard_mu);
    for (struct guard_tab *t = g_tab; t; t = t->older) {
        for (int i = 0; i < t->cap; i++) {
            if (t->e[i].flag != flag) continue;
            __atomic_store_n(&t->e[i].lo, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&t->e[i].hi, 0, __ATOMIC_RELEASE);
            __atomic_store_n(&t->e[i].flag, NULL, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&g_guard_mu);
}
