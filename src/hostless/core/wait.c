/*
 * wait.c -- blocking waits.  The spin-then-futex loop is written once
 * (hle_wait_loop); the fence / timeline wait, wait_any and the queue's push
 * and pop supply what "ready" means and how to sleep.  Sleeps are bounded by
 * the domain's poll_ns (a device signals by a plain store, without a wake)
 * and, for a thread the binding marks interruptible, by HLE_INTR_SLICE_NS so
 * that its interrupt hook (Python: PyErr_CheckSignals) runs every few ms.
 */
#include "engine.h"

#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/futex.h>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif
struct hl_futex_waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};
#define HL_FUTEX2_SIZE_U32 0x02
#define HL_FUTEX2_PRIVATE 128

__thread hle_ctx *hle_tls_hook_ctx;
__thread int hle_tls_hook_depth;

int hle_interruptible(hle_ctx *c) {
    return c->hooks.interrupted && (!c->hooks.interruptible || c->hooks.interruptible());
}

/* Contract in engine.h. */
int hle_hook_call(hle_ctx *c, int (*fn)(void *), void *arg) {
    hle_ctx *prev = hle_tls_hook_ctx;
    int prev_depth = hle_tls_hook_depth;
    if (prev != c) hle_tls_hook_depth = 0;
    hle_tls_hook_ctx = c;
    hle_tls_hook_depth++;
    int r = fn(arg);
    hle_tls_hook_ctx = prev;
    hle_tls_hook_depth = prev_depth;
    return r;
}

/* the interrupt hook (it relocks and unlocks through the token itself) */
struct intr_call {
    hle_ctx *c;
    void **token;
};
static int intr_call(void *a) {
    struct intr_call *x = a;
    return x->c->hooks.interrupted(x->token);
}

/* Contract in engine.h. */
int hle_wait_loop(hle_ctx *c, struct hle_waiter *w, void **token) {
    uint64_t t0 = w->t0, spin = w->spin_ns, last = t0;
    uint64_t deadline = w->timeout_ns < 0 ? UINT64_MAX : t0 + (uint64_t)w->timeout_ns;
    for (unsigned it = 0;; it++) {
        int r = w->poll(w->arg);
        if (r) return r > 0 ? HL_OK : r;
        if (CLOSING(c)) return HL_E_CLOSED;
        if (w->timeout_ns == 0) return HL_E_TIMEOUT; /* a try */
        if (w->check && (it & 255) == 255 && (r = w->check(w->arg)) < 0) return r;
        if ((it & 63) != 63 && spin > 0) {
            cpu_relax();
            continue;
        }
        uint64_t t = now_ns();
        if (t >= deadline) return HL_E_TIMEOUT;
        if (w->interruptible && t - last >= HLE_INTR_SLICE_NS) {
            last = t;
            struct intr_call ic = {c, token};
            int stop = hle_hook_call(c, intr_call, &ic);
            if (stop) return HL_E_INTR;
            if (CLOSING(c)) return HL_E_CLOSED; /* closed by a handler: the mapping may be gone */
        }
        if (spin > 0 && t - t0 < spin) {
            /* past HLE_SPIN_PURE_NS the spin gives the CPU away at every look at the
             * clock, so that a waiter does not starve the process it waits for when
             * both share a CPU (a machine with fewer cores than busy processes, or a
             * woken task placed next to its waker) */
            if (t - t0 >= HLE_SPIN_PURE_NS) sched_yield();
            continue;
        }
        /* sleep phase (at once when spin is 0), bounded */
        uint64_t nap = w->nap_ns ? w->nap_ns : c->poll_ns;
        if (deadline - t < nap) nap = deadline - t;
        if (w->interruptible && nap > HLE_INTR_SLICE_NS) nap = HLE_INTR_SLICE_NS;
        if ((r = w->sleep(w->arg, nap)) != 0) return r > 0 ? HL_OK : r;
    }
}

/* ---- fence and timeline waits ---- */

struct word_wait {
    hle_ctx *c;
    struct hl_fence *f;
    uint32_t *fw; /* the futex: a timeline's wake sequence, else the word's low half (hostless.h) */
    uint64_t thr, w;
    int merged;
};

static int word_poll(void *a) {
    struct word_wait *x = a;
    x->w = __atomic_load_n(&x->f->word, __ATOMIC_ACQUIRE);
    return x->w >= x->thr;
}

static int word_sleep(void *a, uint64_t nap) {
    struct word_wait *x = a;
    struct hl_fence *f = x->f;
    if (x->merged) hle_sweep(x->c);
    __atomic_add_fetch(&f->waiters, 1, __ATOMIC_SEQ_CST);
    uint32_t seen = __atomic_load_n(x->fw, __ATOMIC_SEQ_CST); /* before the word: see hostless.h */
    x->w = ld(&f->word);
    if (x->w < x->thr) {
        struct timespec ts = {(time_t)(nap / 1000000000ull), (long)(nap % 1000000000ull)};
        syscall(SYS_futex, x->fw, FUTEX_WAIT, seen, &ts, 0, 0);
    }
    __atomic_sub_fetch(&f->waiters, 1, __ATOMIC_SEQ_CST);
    return 0;
}

/* Contract in engine.h. */
int hle_spin_locked(const uint64_t *word, uint64_t thr, int64_t spin, uint64_t t0, uint64_t *w) {
    uint64_t limit = spin <= 0 ? 0 : (uint64_t)spin < HLE_LOCKED_SPIN_NS ? (uint64_t)spin : HLE_LOCKED_SPIN_NS;
    for (unsigned it = 0; limit; it++) {
        if ((*w = __atomic_load_n(word, __ATOMIC_ACQUIRE)) >= thr) return 1;
        cpu_relax();
        if ((it & 63) == 63 && now_ns() - t0 >= limit) break;
    }
    return 0;
}

/* Contract in hostless_engine.h.  Spins (first locked, at most 2 us, then
 * unlocked) for spin_ns, then sleeps on the futex in bounded slices. */
int hle_wait(hle_ctx *c, uint64_t h, uint64_t thr, int64_t timeout, int64_t spin, uint64_t *out) {
    if (!c->base || c->me < 0) return hle_fail(HL_E_CLOSED, "domain is closed");
    int64_t idx = hle_check_handle(c, h, 0, 1);
    if (idx < 0) return (int)idx;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t w = ld(&f->word);
    if (w >= thr) {
        *out = w;
        return HL_OK;
    }
    /* short spin while locked (with the GIL): the fast cross-process round trip */
    uint64_t t0 = now_ns();
    if (hle_spin_locked(&f->word, thr, spin, t0, &w)) {
        *out = w;
        return HL_OK;
    }
    struct word_wait x = {c, f, HL_HANDLE_KIND(h) == HL_KIND_TIMELINE ? &f->wake : (uint32_t *)&f->word, thr, w,
                          HL_HANDLE_KIND(h) == HL_KIND_MERGED};
    struct hle_waiter wt = {word_poll, word_sleep, NULL, &x, t0, timeout, spin > 0 ? (uint64_t)spin : 0,
                            hle_interruptible(c)};
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    int r = hle_wait_loop(c, &wt, &tok);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    *out = x.w;
    if (r == HL_OK && c->trace) hle_trace_emit(c, HL_EV_WAIT, h, thr, t0, x.w, 0); /* a wait that waited: a span */
    if (r == HL_E_CLOSED) return hle_closed_error(c, "the domain was closed during the wait");
    return r;
}

/* Contract in engine.h: hle_wait's loop inside a GIL-free section (no
 * locked spin: the caller released its lock already). */
int hle_wait_unlocked(hle_ctx *c, uint64_t h, uint64_t thr, int64_t timeout, int64_t spin, uint64_t *out,
                      int interruptible, void **tok) {
    return hle_wait_unlocked_hooked(c, h, thr, timeout, spin, out, interruptible, tok, NULL, NULL, 0);
}

/* Contract in engine.h. */
int hle_wait_unlocked_hooked(hle_ctx *c, uint64_t h, uint64_t thr, int64_t timeout, int64_t spin, uint64_t *out,
                             int interruptible, void **tok, void (*not_yet)(void *), void *arg, uint64_t since) {
    if (CLOSING(c)) return hle_closed_error(c, "the domain was closed during the wait");
    int64_t idx = hle_check_handle(c, h, 0, 1);
    if (idx < 0) return (int)idx;
    struct hl_fence *f = slot(c, (uint32_t)idx);
    uint64_t w = ld(&f->word);
    if (w >= thr) {
        *out = w;
        return HL_OK;
    }
    if (not_yet) {
        not_yet(arg);
        if (CLOSING(c)) return hle_closed_error(c, "the domain was closed during the wait"); /* (f may be gone) */
    }
    struct word_wait x = {c, f, HL_HANDLE_KIND(h) == HL_KIND_TIMELINE ? &f->wake : (uint32_t *)&f->word, thr, w,
                          HL_HANDLE_KIND(h) == HL_KIND_MERGED};
    uint64_t t0 = since ? since : now_ns();
    struct hle_waiter wt = {word_poll, word_sleep, NULL, &x, t0, timeout, spin > 0 ? (uint64_t)spin : 0,
                            interruptible};
    int r = hle_wait_loop(c, &wt, tok);
    *out = x.w;
    if (r == HL_OK && c->trace) hle_trace_emit(c, HL_EV_WAIT, h, thr, t0, x.w, 0);
    if (r == HL_E_CLOSED) return hle_closed_error(c, "the domain was closed during the wait");
    return r;
}

/* ---- wait_any: futex_waitv on every word plus the private kick word ---- */

struct any_wait {
    hle_ctx *c;
    int n;
    uint32_t kick_seen;
    struct hl_fence **fs;
    const uint64_t *thr;
    struct hl_futex_waitv *wv;
    int sweep; /* a merged fence among them (hle_wait_many) */
};

static int any_poll(void *a) {
    struct any_wait *x = a;
    int any = 0;
    for (int i = 0; i < x->n; i++)
        if (ld(&x->fs[i]->word) >= x->thr[i]) any = 1;
    return any || __atomic_load_n(&x->c->kick, __ATOMIC_SEQ_CST) != x->kick_seen;
}

static int any_sleep(void *a, uint64_t nap) {
    struct any_wait *x = a;
    int n = x->n;
    if (x->sweep) hle_sweep(x->c); /* merged fences (and their watch nodes) completed by plain stores */
    struct hl_fence **fs = x->fs;
    struct hl_futex_waitv *wv = x->wv;
    for (int i = 0; i < n; i++) __atomic_add_fetch(&fs[i]->waiters, 1, __ATOMIC_SEQ_CST);
    int ready = 0;
    for (int i = 0; i < n; i++) {
        int tl = HL_CTL_KIND(ld(&fs[i]->ctl)) == HL_KIND_TIMELINE;
        uint32_t *fw = tl ? &fs[i]->wake : (uint32_t *)&fs[i]->word;
        uint32_t seen = __atomic_load_n(fw, __ATOMIC_SEQ_CST); /* before the word: see hostless.h */
        uint64_t w = ld(&fs[i]->word);
        if (w >= x->thr[i]) ready = 1;
        wv[i].val = seen;
        wv[i].uaddr = (uint64_t)(uintptr_t)fw;
        wv[i].flags = HL_FUTEX2_SIZE_U32;
        wv[i].reserved = 0;
    }
    wv[n].val = x->kick_seen;
    wv[n].uaddr = (uint64_t)(uintptr_t)&x->c->kick;
    wv[n].flags = HL_FUTEX2_SIZE_U32 | HL_FUTEX2_PRIVATE;
    wv[n].reserved = 0;
    if (!ready && __atomic_load_n(&x->c->kick, __ATOMIC_SEQ_CST) == x->kick_seen) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t abs_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + nap;
        ts.tv_sec = (time_t)(abs_ns / 1000000000ull);
        ts.tv_nsec = (long)(abs_ns % 1000000000ull);
        long r = syscall(SYS_futex_waitv, wv, (unsigned)(n + 1), 0, &ts, CLOCK_MONOTONIC);
        if (r < 0 && errno == ENOSYS) {
            struct timespec s2 = {0, (long)(nap < 200000 ? nap : 200000)};
            nanosleep(&s2, NULL);
        }
    }
    for (int i = 0; i < n; i++) __atomic_sub_fetch(&fs[i]->waiters, 1, __ATOMIC_SEQ_CST);
    return 0;
}

int hle_wait_any(hle_ctx *c, const uint64_t *handles, const uint64_t *thr, int n, int64_t timeout,
                 uint32_t kick_seen, char *ready) {
    if (n > 127) n = 127;
    struct hl_futex_waitv wv[128];
    struct hl_fence *fs[128];
    for (int i = 0; i < n; i++) {
        int64_t idx = hle_check_handle(c, handles[i], 0, 0);
        if (idx < 0) return (int)idx;
        fs[i] = slot(c, (uint32_t)idx);
    }
    struct any_wait x = {c, n, kick_seen, fs, thr, wv, 0};
    struct hle_waiter wt = {any_poll, any_sleep, NULL, &x, 0, timeout, 0, hle_interruptible(c)};
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    wt.t0 = now_ns();
    int r = hle_wait_loop(c, &wt, &tok);
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (r == HL_E_INTR) return r;
    if (CLOSING(c)) return hle_closed_error(c, "the domain was closed during the wait");
    for (int i = 0; i < n; i++) ready[i] = ld(&fs[i]->word) >= thr[i];
    return HL_OK;
}

/* Contract in engine.h.  One call for wait_any over fences and points of this
 * domain: handles validated once, words read here, the first ready index. */
int hle_wait_many(hle_ctx *c, const uint64_t *handles, const uint64_t *values, int n, int64_t timeout,
                  int64_t spin, int *index, uint64_t *word) {
    if (!c->base || c->me < 0) return hle_fail(HL_E_CLOSED, "domain is closed");
    if (n < 1 || n > HLE_WAIT_MANY_MAX)
        return hle_fail(HL_E_VALUE, "wait over 1..%d objects per domain, got %d", HLE_WAIT_MANY_MAX, n);
    struct hl_futex_waitv wv[HLE_WAIT_MANY_MAX + 1];
    struct hl_fence *fs[HLE_WAIT_MANY_MAX];
    uint64_t thr[HLE_WAIT_MANY_MAX];
    int sweep = 0;
    for (int i = 0; i < n; i++) {
        int64_t idx = hle_check_handle(c, handles[i], HL_KIND_SYNC, 1);
        if (idx < 0) return (int)idx;
        fs[i] = slot(c, (uint32_t)idx);
        uint32_t k = HL_HANDLE_KIND(handles[i]);
        thr[i] = k == HL_KIND_TIMELINE ? values[i] : 1;
        if (k == HL_KIND_MERGED) sweep = 1;
    }
    for (int i = 0; i < n; i++) { /* already complete: no clock, no unlock */
        uint64_t w = ld(&fs[i]->word);
        if (w >= thr[i]) {
            *index = i;
            *word = w;
            return HL_OK;
        }
    }
    uint64_t t0 = now_ns();
    /* short spin while locked (with the GIL), as hle_wait's: a word that
     * completes within it is seen without giving the lock away and taking it
     * back (the cross-process round trip) */
    uint64_t locked = timeout == 0 ? 0 : spin > 2000 ? 2000 : (spin > 0 ? (uint64_t)spin : 0);
    if (locked) {
        for (unsigned it = 0;; it++) {
            for (int i = 0; i < n; i++) {
                uint64_t w = __atomic_load_n(&fs[i]->word, __ATOMIC_ACQUIRE);
                if (w >= thr[i]) {
                    *index = i;
                    *word = w;
                    return HL_OK;
                }
            }
            cpu_relax();
            if ((it & 63) == 63 && now_ns() - t0 >= locked) break;
        }
    }
    BUSY_ENTER(c);
    void *tok = hle_unlock(c);
    int r;
    for (;;) {
        uint64_t t = now_ns();
        int64_t left = timeout;
        if (timeout > 0) left = t - t0 >= (uint64_t)timeout ? 0 : timeout - (int64_t)(t - t0);
        struct any_wait x = {c, n, __atomic_load_n(&c->kick, __ATOMIC_SEQ_CST), fs, thr, wv, sweep};
        struct hle_waiter wt = {any_poll, any_sleep, NULL, &x, t, left, spin > 0 ? (uint64_t)spin : 0,
                                hle_interruptible(c)};
        r = hle_wait_loop(c, &wt, &tok);
        if (r) break;
        *index = -1;
        for (int i = 0; i < n && *index < 0; i++) {
            uint64_t w = ld(&fs[i]->word);
            if (w >= thr[i]) {
                *index = i;
                *word = w;
            }
        }
        if (*index >= 0) break;
        if (timeout == 0) {
            r = HL_E_TIMEOUT;
            break;
        }
        spin = 0; /* a kick (another thread's notifier or close): wait again */
    }
    BUSY_LEAVE(c);
    hle_relock(c, tok);
    if (r == HL_E_INTR || r == HL_E_TIMEOUT) return r;
    if (CLOSING(c) || r == HL_E_CLOSED) return hle_closed_error(c, "the domain was closed during the wait");
    return r;
}

void hle_kick(hle_ctx *c) {
    __atomic_add_fetch(&c->kick, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &c->kick, FUTEX_WAKE_PRIVATE, 0x7fffffff, 0, 0, 0);
}
