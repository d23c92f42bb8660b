/*
 * agent_loop.h -- internal to the native agent loop (core/agent.c, and
 * core/agent_ert.c, its ERT command processor): the loop's state, a decoded
 * argument block and the helpers both files use.  Not part of any API; it
 * refuses to compile outside the engine (engine.h's HOSTLESS_INTERNAL).
 */
#ifndef HOSTLESS_AGENT_LOOP_H
#define HOSTLESS_AGENT_LOOP_H

#include <string.h>

#include "engine.h"

#define AGENT_IDLE_NS 50000000ll   /* one bounded doorbell sleep: should_stop is asked between them */
#define AGENT_WAIT_SLICE 50000000ll /* one slice of an input wait */
#define AGENT_MAX_HELD 64            /* handles one packet may hold */
#define AGENT_HOPS 1024              /* remembered hop counts of own-queue follow-ups */
#define AGENT_MAX_KBUFS 16           /* buffers a C kernel takes (more: the Python kernel) */
#define AGENT_MAX_KSCALARS 8         /* scalars a C kernel takes (more: the Python kernel) */
#define AGENT_SPIN_FLOOR_NS 20000ll  /* the least adaptive spin once packets come often */
#define ERT_RECORDED 2               /* an ERT command failed in the Python CU (already recorded) */

struct agent {
    hle_ctx *c;
    uint64_t q;
    struct hle_agent_cfg *cfg;
    int stop;
    uint64_t held[AGENT_MAX_HELD];
    int nheld;
    uint64_t hop_idx[AGENT_HOPS];
    uint8_t hop_n[AGENT_HOPS];
    uint64_t stale_below;           /* packets below it were queued for the consumer we replaced */
    uint8_t map[HLE_AGENT_MAX_CUS]; /* id / CU -> HL_K_* (0: none in C) */
    uint32_t present;               /* bit i: id / CU i exists */
    struct hle_kenv kenv;
    uint64_t py_status;             /* the failure status of the last Python CU */
    uint64_t wait_avg;              /* recent doorbell wait (ns, a running average); UINT64_MAX: idle */
    struct hl_queue *qs;            /* the queue's header: its statistics (failed, busy_ns, last_failed) */
    uint64_t kept[HLE_AGENT_MAX_KEPT]; /* handles kept imported between packets (cfg->keep_ns) */
    int nkept;
};

/* A decoded argument block (pointers into the held block; counts local). */
struct kargs {
    const char *base;
    uint32_t nbuffers, nscalars, nfollow;
    uint64_t buf_off, sc_off, fo_off;
};

static inline void record(struct agent *a, uint64_t sig, const char *why) {
    if (a->cfg->record && sig) a->cfg->record(a->cfg->ud, sig, why);
}

static inline uint64_t karg_u64(const struct kargs *k, uint64_t off, uint32_t i) {
    uint64_t v;
    memcpy(&v, k->base + off + (uint64_t)i * 8, 8);
    return v;
}

/* agent.c: import h as one of `kind` (HL_KIND_SYNC: fence, merged or timeline)
 * for this packet (released after it); a buffer with its metadata checked
 * against its size (held likewise). */
int agent_hold(struct agent *a, uint64_t h, uint32_t kind);
int agent_kbuf(struct agent *a, uint64_t h, struct hle_kbuf *b);
/* agent.c: keep the handles held from held[from] on imported past the packet
 * (hle_agent_run's kept imports); call before releasing them. */
void agent_keep(struct agent *a, int from);

/* agent_ert.c: run an ERT packet whose block is decoded (its first buffer is
 * the command): SUCCESS, or the failure status (recorded). */
uint64_t agent_run_ert(struct agent *a, const struct hl_packet *p, const struct kargs *k);

#endif /* HOSTLESS_AGENT_LOOP_H */
