/*
 * cpfwd.c -- the GPU command processor's host forwarder: on a GPU whose atomics
 * on host memory are not atomic against the host's (PCIe without them), the
 * processor (agents/gpucp*.cu) pushes no follow-up into a queue itself; it
 * hands each to this thread of its host process through the outbox
 * (struct hl_cp_outbox, hostless_gpucp.h: private pinned memory, one writer per
 * word at a time), and this thread pushes it with the host's atomics.
 *
 * The rules are the processor's (gpucp.cu's header comment) and the CPU
 * agents': a follow-up into another queue waits up to HL_CP_PUSH_NS while
 * that queue is full; one into the processor's own queue never waits (only the
 * processor frees its cells), and its hop count goes to the outbox's hop[]
 * before the packet is published, where the processor reads it with the
 * packet; a follow-up that cannot be pushed (its queue handle stale, of
 * another kind, full, its consumer dead) fails its signal and those nested in
 * it with ERROR (hle_agent_fail_packet).  What the outbox holds comes from the
 * processor, but the queue handles and packets in it come from the domain:
 * they are checked as any packet's are (the import checks the handle).
 *
 * The thread polls the outbox's next slot: spinning HLE_CPFWD_SPIN_NS after
 * the last follow-up, then napping HLE_CPFWD_NAP_NS between looks (timer slack
 * 1 us).  It counts as a GIL-free section of the context (hle_leave waits for
 * it) and leaves when stopped or when the context closes, after forwarding
 * what the outbox already holds.  The context's local reference counts are
 * not atomic: while it runs, no other thread of the process may import or
 * release handles of that context (the processor's host process only watches
 * the kernel meanwhile, and stops the forwarder before it releases anything).
 */
#include "engine.h"
#include "hostless/hostless_gpucp.h"

#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#define HLE_CPFWD_SPIN_NS 200000ull
#define HLE_CPFWD_NAP_NS 20000l

struct hle_cpfwd {
    hle_ctx *c;
    struct hl_cp_outbox *ob;
    uint64_t own;   /* the processor's queue */
    uint64_t pos;   /* the next outbox position to take */
    int stop;
    pthread_t th;
    uint64_t pushed, failed;
};

/* Push follow-up o (a private copy of its slot). */
static void forward(struct hle_cpfwd *f, const struct hl_cp_out *o) {
    hle_ctx *c = f->c;
    const uint64_t q = o->queue;
    int r = hle_import(c, q, HL_KIND_QUEUE); /* checks the handle: tag, index, kind, generation */
    if (r == HL_OK) {
        if (q == f->own) { /* never waits: only the processor frees its cells */
            struct hl_qview v;
            uint64_t w = 0;
            r = hle_queue_view(c, q, &v);
            if (r == HL_OK) r = hl_queue_reserve(&v, (uint32_t)c->me, HL_QUEUE_NO_HINT, &w);
            if (r == HL_OK) {
                uint64_t hops = o->hops < 255 ? o->hops : 255;
                __atomic_store_n(&f->ob->hop[w % HL_CP_HOPS], HL_CP_HOP_WORD(w, hops), __ATOMIC_RELEASE);
                hl_queue_publish(&v, w, &o->packet, (uint32_t)c->me);
            }
        } else {
            void *tok = NULL;
            uint64_t idx = 0;
            r = hle_queue_push_unlocked(c, q, &o->packet, (int64_t)HL_CP_PUSH_NS, &idx, 0, &tok);
        }
        hle_release(c, q);
    }
    if (r == HL_OK) {
        f->pushed++;
    } else {
        f->failed++;
        hle_agent_fail_packet(c, &o->packet, HL_STATUS_ERROR);
    }
}

/* Forward the slot at f->pos if the processor wrote it: 1, else 0. */
static int take(struct hle_cpfwd *f) {
    struct hl_cp_out *s = &f->ob->slot[f->pos % HL_CP_OUTBOX];
    if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != f->pos + 1) return 0;
    struct hl_cp_out o;
    memcpy(&o, s, sizeof o);
    forward(f, &o);
    f->pos++;
    __atomic_store_n(&f->ob->taken, f->pos, __ATOMIC_RELEASE); /* its slot is free for the next lap */
    return 1;
}

static void *run(void *arg) {
    struct hle_cpfwd *f = arg;
    uint64_t idle_since = 0;
    prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE) && !CLOSING(f->c)) {
        if (take(f)) {
            idle_since = 0;
            continue;
        }
        uint64_t t = now_ns();
        if (!idle_since) idle_since = t;
        if (t - idle_since > HLE_CPFWD_SPIN_NS) {
            struct timespec ts = {0, HLE_CPFWD_NAP_NS};
            nanosleep(&ts, NULL);
        }
    }
    if (!CLOSING(f->c))
        for (int i = 0; i < HL_CP_OUTBOX && take(f); i++) {
        } /* what the outbox holds when stopped */
    BUSY_LEAVE(f->c);
    return NULL;
}

/* Contract in engine.h. */
int hle_cpfwd_start(hle_ctx *c, void *outbox, uint64_t own_queue, struct hle_cpfwd **out) {
    if (!c->base) return hle_fail(HL_E_CLOSED, "the domain is closed");
    if (!outbox || ((uintptr_t)outbox & 7)) return hle_fail(HL_E_VALUE, "the outbox must be 8-byte aligned");
    struct hle_cpfwd *f = calloc(1, sizeof *f);
    if (!f) return hle_fail(HL_E_NOMEM, "no memory for the forwarder");
    f->c = c;
    f->ob = outbox;
    f->own = own_queue;
    __atomic_store_n(&f->ob->taken, 0, __ATOMIC_RELAXED);
    for (uint64_t i = 0; i < HL_CP_OUTBOX; i++) __atomic_store_n(&f->ob->slot[i].seq, 0, __ATOMIC_RELAXED);
    for (uint64_t i = 0; i < HL_CP_HOPS; i++) __atomic_store_n(&f->ob->hop[i], 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    BUSY_ENTER(c);
    int e = pthread_create(&f->th, NULL, run, f);
    if (e) {
        BUSY_LEAVE(c);
        free(f);
        return hle_fail_errno(e);
    }
    *out = f;
    return HL_OK;
}

/* Contract in engine.h. */
void hle_cpfwd_stop(struct hle_cpfwd *f, uint64_t *pushed, uint64_t *failed) {
    __atomic_store_n(&f->stop, 1, __ATOMIC_RELEASE);
    pthread_join(f->th, NULL);
    if (pushed) *pushed = f->pushed;
    if (failed) *failed = f->failed;
    free(f);
}
