/*
 * trace.c -- the domain's trace ring: events written lock-free by any
 * participant (a sequence number per event makes torn reads detectable).
 */
#include "engine.h"

#include <sys/syscall.h>
#include <unistd.h>
#include <linux/futex.h>

void hle_trace_emit_at(hle_ctx *c, uint64_t ts, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d,
                          uint64_t e) {
    struct hl_trace *t = c->trace;
    if (!t) return;
    uint64_t i = __atomic_fetch_add(&t->write, 1, __ATOMIC_RELAXED);
    struct hl_trace_event *ev = (struct hl_trace_event *)((char *)t + 64) + (i % c->trace_cap);
    __atomic_store_n(&ev->seq, 0, __ATOMIC_RELAXED);
    ev->ts_ns = ts;
    ev->type = type;
    ev->participant = c->me >= 0 ? HL_OWNER(c->inc, (uint32_t)c->me) : 0; /* who: a track per participant (ABI 6) */
    ev->a = a;
    ev->b = b;
    ev->c = cc;
    ev->d = d;
    ev->e = e;
    __atomic_store_n(&ev->seq, i + 1, __ATOMIC_RELEASE);
}

void hle_trace_emit(hle_ctx *c, uint32_t type, uint64_t a, uint64_t b, uint64_t cc, uint64_t d, uint64_t e) {
    if (c->trace) hle_trace_emit_at(c, now_ns(), type, a, b, cc, d, e);
}
