/*
 * agent.c -- the native agent loop: the consumer of one queue, in C.
 *
 * The same rule as hostless.agents.loop (contract in hostless_engine.h):
 * pop, check, wait on the inputs, run (a C kernel, or the Python callback),
 * signal, push the follow-ups.  A bad packet fails alone with ERROR.  Every
 * handle a packet names is imported (kind and generation checked by
 * hle_import) for the packet's duration and released after it; every count
 * of an argument block is checked against the block's size by subtraction
 * and read once into a local.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define AGENT_IDLE_NS 50000000ll   /* one bounded doorbell sleep: should_stop is asked between them */
#define AGENT_WAIT_SLICE 50000000ll /* one slice of an input wait */
#define AGENT_MAX_HELD 64            /* handles one packet may hold */
#define AGENT_HOPS 1024              /* remembered hop counts of own-queue follow-ups */
#define AGENT_MAX_KBUFS 16           /* buffers a C kernel takes (more: the Python kernel) */

struct agent {
    hle_ctx *c;
    uint64_t q;
    struct hle_agent_cfg *cfg;
    int stop;
    uint64_t held[AGENT_MAX_HELD];
    int nheld;
    uint64_t hop_idx[AGENT_HOPS];
    uint8_t hop_n[AGENT_HOPS];
};

/* A decoded argument block (pointers into the held block; counts local). */
struct kargs {
    const char *base;
    uint32_t nbuffers, nscalars, nfollow;
    uint64_t buf_off, sc_off, fo_off;
};

static void record(struct agent *a, uint64_t sig, const char *why) {
    if (a->cfg->record && sig) a->cfg->record(a->cfg->ud, sig, why);
}

/* Import h as one of `kind` (0: fence, merged or timeline) for this packet. */
static int hold(struct agent *a, uint64_t h, uint32_t kind) {
    uint32_t k = HL_HANDLE_KIND(h);
    if (kind == HL_KIND_SYNC) {
        if (k != HL_KIND_FENCE && k != HL_KIND_MERGED && k != HL_KIND_TIMELINE)
            return hle_fail(HL_E_HANDLE, "handle 0x%llx is of kind %u, not a fence or timeline",
                            (unsigned long long)h, k);
        kind = k == HL_KIND_MERGED ? HL_KIND_FENCE : k;
    } else if (k != kind && !(kind == HL_KIND_FENCE && k == HL_KIND_MERGED)) {
        return hle_fail(HL_E_HANDLE, "handle 0x%llx is of kind %u, not %u", (unsigned long long)h, k, kind);
    }
    if (a->nheld >= AGENT_MAX_HELD) return hle_fail(HL_E_RANGE, "a packet names more than %d handles", AGENT_MAX_HELD);
    int r = hle_import(a->c, h, kind);
    if (r) return r;
    a->held[a->nheld++] = h;
    return HL_OK;
}

static void release_all(struct agent *a) {
    while (a->nheld > 0) hle_release(a->c, a->held[--a->nheld]);
}

/* Decode the argument block `h` (held on success). */
static int decode_args(struct agent *a, uint64_t h, struct kargs *k) {
    int r = hold(a, h, HL_KIND_BUFFER);
    if (r) return r;
    uint64_t n = 0;
    const char *p = hl_buffer_data(&a->c->dv, h, &n);
    if (!p) return hle_fail(HL_E_HANDLE, "argument block 0x%llx is not a live buffer", (unsigned long long)h);
    struct hl_kernarg ka;
    if (n < sizeof ka) return hle_fail(HL_E_VALUE, "argument block of %llu bytes is shorter than its header",
                                       (unsigned long long)n);
    memcpy(&ka, p, sizeof ka);
    if (ka.magic != HL_KERNARG_MAGIC) return hle_fail(HL_E_VALUE, "argument block has a bad magic 0x%x", ka.magic);
    uint64_t left = n - sizeof ka;
    k->base = p;
    k->nbuffers = ka.nbuffers;
    k->nscalars = ka.nscalars;
    k->nfollow = ka.nfollow;
    k->buf_off = sizeof ka;
    if ((uint64_t)k->nbuffers * 8 > left) return hle_fail(HL_E_VALUE, "argument block: %u buffers past its end", k->nbuffers);
    left -= (uint64_t)k->nbuffers * 8;
    k->sc_off = k->buf_off + (uint64_t)k->nbuffers * 8;
    if ((uint64_t)k->nscalars * 8 > left) return hle_fail(HL_E_VALUE, "argument block: %u scalars past its end", k->nscalars);
    left -= (uint64_t)k->nscalars * 8;
    k->fo_off = k->sc_off + (uint64_t)k->nscalars * 8;
    if ((uint64_t)k->nfollow * sizeof(struct hl_follow) > left)
        return hle_fail(HL_E_VALUE, "argument block: %u follow-ups past its end", k->nfollow);
    return HL_OK;
}

static uint64_t karg_u64(const struct kargs *k, uint64_t off, uint32_t i) {
    uint64_t v;
    memcpy(&v, k->base + off + (uint64_t)i * 8, 8);
    return v;
}

static void karg_follow(const struct kargs *k, uint32_t i, struct hl_follow *f) {
    memcpy(f, k->base + k->fo_off + (uint64_t)i * sizeof *f, sizeof *f);
}

/* A buffer with its metadata checked against its size. */
static int kbuf(struct agent *a, uint64_t h, struct hle_kbuf *b) {
    int r = hold(a, h, HL_KIND_BUFFER);
    if (r) return r;
    uint64_t n = 0;
    char *p = hl_buffer_data(&a->c->dv, h, &n);
    if (!p || (uint64_t)(p - a->c->base) < HL_BUFFER_META_SIZE)
        return hle_fail(HL_E_HANDLE, "buffer 0x%llx is not a live buffer of this heap", (unsigned long long)h);
    struct hl_buffer_meta m;
    memcpy(&m, p - HL_BUFFER_META_SIZE, sizeof m);
    if (m.ndim > HL_BUFFER_MAX_DIMS || m.itemsize == 0 || m.nbytes != n)
        return hle_fail(HL_E_VALUE, "buffer 0x%llx has inconsistent metadata", (unsigned long long)h);
    uint64_t cnt = 1;
    for (uint32_t i = 0; i < m.ndim; i++) {
        if (m.shape[i] && cnt > UINT64_MAX / m.shape[i])
            return hle_fail(HL_E_VALUE, "buffer 0x%llx: shape overflows", (unsigned long long)h);
        cnt *= m.shape[i];
    }
    if (cnt > n / m.itemsize || cnt * m.itemsize != n)
        return hle_fail(HL_E_VALUE, "buffer 0x%llx: shape, dtype and size disagree", (unsigned long long)h);
    b->data = p;
    b->nbytes = n;
    b->count = cnt;
    b->ndim = m.ndim;
    b->itemsize = m.itemsize;
    memcpy(b->dtype, m.dtype, sizeof b->dtype);
    b->dtype[sizeof b->dtype - 1] = 0;
    for (uint32_t i = 0; i < m.ndim; i++) b->shape[i] = m.shape[i];
    return HL_OK;
}

/* Finish signal h with `status` (timeline: value on success, else failed);
 * the handle is held for the call.  Never fails (a signal that cannot be
 * signaled is left alone). */
static void finish_signal(struct agent *a, uint64_t h, uint64_t value, uint64_t status) {
    if (!h) return;
    uint32_t k = HL_HANDLE_KIND(h);
    if (k != HL_KIND_FENCE && k != HL_KIND_TIMELINE) return;
    if (hle_import(a->c, h, k)) return;
    if (k == HL_KIND_TIMELINE) {
        if (status == HL_STATUS_SUCCESS)
            hle_timeline_signal(a->c, h, value);
        else
            hle_timeline_fail(a->c, h, status);
    } else {
        hle_signal(a->c, h, status);
    }
    hle_release(a->c, h);
}

static void finish(struct agent *a, const struct hl_packet *p, uint64_t status, uint64_t idx) {
    if (a->c->trace) hle_trace_emit(a->c, HL_EV_END, a->q, idx, p->signal, status, 0);
    finish_signal(a, p->signal, p->signal_value, status);
}

/* Fail the signals of the follow-ups of p that will never run (recursive, bounded). */
static void fail_downstream(struct agent *a, const struct hl_packet *p, uint64_t status, int *budget, int depth) {
    if ((p->type != HL_PKT_KERNEL && p->type != HL_PKT_ERT) || !p->args || depth >= HLE_AGENT_FAIL_DEPTH) return;
    int mark = a->nheld;
    struct kargs k;
    if (decode_args(a, p->args, &k) == HL_OK) {
        for (uint32_t i = 0; i < k.nfollow && *budget > 0; i++) {
            struct hl_follow f;
            karg_follow(&k, i, &f);
            (*budget)--;
            finish_signal(a, f.packet.signal, f.packet.signal_value, status);
            fail_downstream(a, &f.packet, status, budget, depth + 1);
        }
    }
    while (a->nheld > mark) hle_release(a->c, a->held[--a->nheld]);
}

/* The packet's signal and waits name objects of the right kinds and values. */
static int check(struct agent *a, const struct hl_packet *p) {
    if (p->type != HL_PKT_KERNEL && p->type != HL_PKT_ERT && p->type != HL_PKT_BARRIER)
        return hle_fail(HL_E_VALUE, "unknown packet type %u", p->type);
    int r;
    if (p->signal) {
        uint32_t k = HL_HANDLE_KIND(p->signal);
        if (k != HL_KIND_FENCE && k != HL_KIND_TIMELINE)
            return hle_fail(HL_E_HANDLE, "signal 0x%llx is not a fence or timeline", (unsigned long long)p->signal);
        if ((r = hold(a, p->signal, k))) return r;
        if (k == HL_KIND_TIMELINE && p->signal_value > HL_TIMELINE_MAX)
            return hle_fail(HL_E_VALUE, "timeline signal value 0x%llx is not below 2**62",
                            (unsigned long long)p->signal_value);
    }
    for (int i = 0; i < 2; i++) {
        if (!p->wait[i]) continue;
        if ((r = hold(a, p->wait[i], HL_KIND_SYNC))) return r;
        if (HL_HANDLE_KIND(p->wait[i]) == HL_KIND_TIMELINE && p->wait_value[i] > HL_TIMELINE_MAX)
            return hle_fail(HL_E_VALUE, "timeline wait value 0x%llx is not below 2**62",
                            (unsigned long long)p->wait_value[i]);
    }
    return HL_OK;
}

/* SUCCESS, or the first failed input's status (ERROR: timeout, bad word). */
static uint64_t wait_inputs(struct agent *a, const struct hl_packet *p) {
    uint64_t t0 = now_ns();
    int64_t limit = a->cfg->wait_timeout_ns;
    for (int i = 0; i < 2; i++) {
        uint64_t h = p->wait[i];
        if (!h) continue;
        int tl = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
        uint64_t thr = tl ? p->wait_value[i] : 1, w = 0;
        for (;;) {
            int64_t slice = AGENT_WAIT_SLICE;
            if (limit >= 0) {
                int64_t left = limit - (int64_t)(now_ns() - t0);
                if (left < slice) slice = left > 0 ? left : 0;
            }
            int r = hle_wait(a->c, h, thr, slice, a->cfg->spin_ns, &w);
            if (r == HL_OK) break;
            if (r != HL_E_TIMEOUT) return HL_STATUS_ERROR; /* closed, released under us */
            if (limit >= 0 && (int64_t)(now_ns() - t0) >= limit) {
                char why[160];
                snprintf(why, sizeof why, "TimeoutError: input 0x%llx not complete within %g s (the agent's wait_timeout)",
                         (unsigned long long)h, (double)limit / 1e9);
                record(a, p->signal, why);
                return HL_STATUS_ERROR;
            }
            if (a->cfg->should_stop && a->cfg->should_stop(a->cfg->ud)) {
                a->stop = 1;
                return HL_STATUS_ERROR;
            }
        }
        uint64_t s;
        if (tl)
            s = (w & HL_TIMELINE_FAILED) ? (w & 0xffffffffull) : HL_STATUS_SUCCESS;
        else
            s = w;
        if (!hl_status_valid(s) || s == HL_STATUS_ACTIVE) s = HL_STATUS_ERROR;
        if (s != HL_STATUS_SUCCESS) return s;
    }
    return HL_STATUS_SUCCESS;
}

/* Run a KERNEL packet whose block is decoded: the C kernel, else the callback. */
static uint64_t run_kernel(struct agent *a, uint64_t idx, const struct hl_packet *p, const struct kargs *k) {
    if (hle_agent_has_kernel(p->kernel) && (a->cfg->c_kernels >> (p->kernel & 31) & 1) && k->nbuffers <= AGENT_MAX_KBUFS && k->nscalars <= 8) {
        struct hle_kbuf b[AGENT_MAX_KBUFS];
        uint64_t sc[8];
        for (uint32_t i = 0; i < k->nscalars; i++) sc[i] = karg_u64(k, k->sc_off, i);
        int r = HL_OK;
        for (uint32_t i = 0; i < k->nbuffers && r == HL_OK; i++) r = kbuf(a, karg_u64(k, k->buf_off, i), &b[i]);
        if (r == HL_OK) r = hle_kernel_run(p->kernel, b, (int)k->nbuffers, sc, (int)k->nscalars);
        if (r == HL_OK) return HL_STATUS_SUCCESS;
        if (r < 0) {
            record(a, p->signal, hle_errmsg());
            return HL_STATUS_ERROR;
        }
        /* r == 1: dtypes or shapes the C kernel leaves to the Python one */
    }
    if (!a->cfg->python_kernel) {
        record(a, p->signal, "BadPacket: unknown kernel (no Python kernels in this agent)");
        return HL_STATUS_ERROR;
    }
    return a->cfg->python_kernel(a->cfg->ud, idx, p);
}

static uint8_t hops_take(struct agent *a, uint64_t idx) {
    uint32_t s = (uint32_t)(idx % AGENT_HOPS);
    if (a->hop_idx[s] != idx + 1) return 0;
    a->hop_idx[s] = 0;
    return a->hop_n[s];
}

static void push_follow(struct agent *a, const struct kargs *k, uint8_t hops) {
    uint64_t deadline = now_ns() + (uint64_t)(a->cfg->follow_timeout_ns > 0 ? a->cfg->follow_timeout_ns : 0);
    int budget = HLE_AGENT_FAIL_BUDGET;
    for (uint32_t i = 0; i < k->nfollow; i++) {
        struct hl_follow f;
        karg_follow(k, i, &f);
        int r;
        uint64_t w = 0;
        if (f.queue == a->q) {
            if (hops + 1 > HLE_AGENT_HOP_LIMIT)
                r = hle_fail(HL_E_RANGE, "follow-up chain through the own queue longer than %d", HLE_AGENT_HOP_LIMIT);
            else if ((r = hle_queue_push(a->c, a->q, &f.packet, 0, &w)) == HL_OK) {
                uint32_t s = (uint32_t)(w % AGENT_HOPS);
                a->hop_idx[s] = w + 1;
                a->hop_n[s] = (uint8_t)(hops + 1);
            }
        } else if (HL_HANDLE_KIND(f.queue) != HL_KIND_QUEUE) {
            r = hle_fail(HL_E_HANDLE, "follow-up queue 0x%llx is not a queue", (unsigned long long)f.queue);
        } else if ((r = hle_import(a->c, f.queue, HL_KIND_QUEUE)) == HL_OK) {
            uint64_t now = now_ns();
            r = hle_queue_push(a->c, f.queue, &f.packet, now < deadline ? (int64_t)(deadline - now) : 0, &w);
            hle_release(a->c, f.queue);
        }
        if (r != HL_OK) {
            a->cfg->failures++;
            finish_signal(a, f.packet.signal, f.packet.signal_value, HL_STATUS_ERROR);
            fail_downstream(a, &f.packet, HL_STATUS_ERROR, &budget, 0);
        }
    }
}

static void execute(struct agent *a, uint64_t idx, const struct hl_packet *p, uint8_t hops) {
    if (a->c->trace) hle_trace_emit(a->c, HL_EV_START, a->q, idx, p->signal, p->kernel, 0);
    struct kargs k = {0};
    int have_args = 0;
    uint64_t status;
    int r = check(a, p);
    if (r) {
        record(a, p->signal, hle_errmsg());
        status = HL_STATUS_ERROR;
    } else {
        status = wait_inputs(a, p);
    }
    if (status == HL_STATUS_SUCCESS && p->type != HL_PKT_BARRIER) {
        if (!p->args) {
            record(a, p->signal, "BadPacket: packet without an argument block");
            status = HL_STATUS_ERROR;
        } else if ((r = decode_args(a, p->args, &k)) != HL_OK) {
            record(a, p->signal, hle_errmsg());
            status = HL_STATUS_ERROR;
        } else {
            have_args = 1;
            if (p->type == HL_PKT_KERNEL)
                status = run_kernel(a, idx, p, &k);
            else if (a->cfg->python_kernel)
                status = a->cfg->python_kernel(a->cfg->ud, idx, p);
            else
                status = HL_STATUS_ERROR;
        }
    }
    finish(a, p, status, idx);
    if (status != HL_STATUS_SUCCESS) {
        a->cfg->failures++;
        int budget = HLE_AGENT_FAIL_BUDGET;
        fail_downstream(a, p, status, &budget, 0);
    } else if (have_args && k.nfollow) {
        push_follow(a, &k, hops);
    }
    release_all(a);
}

int hle_agent_run(hle_ctx *c, uint64_t queue, struct hle_agent_cfg *cfg) {
    int r = hle_need_attached(c);
    if (r) return r;
    struct agent *a = calloc(1, sizeof *a);
    if (!a) return hle_fail(HL_E_NOMEM, "out of memory");
    a->c = c;
    a->q = queue;
    a->cfg = cfg;
    if ((r = hle_import(c, queue, HL_KIND_QUEUE))) goto out_free;
    if ((r = hle_queue_bind(c, queue))) goto out;
    struct hl_qview v;
    if ((r = hle_queue_view(c, queue, &v))) goto out;
    while (!a->stop) {
        if (CLOSING(c)) {
            r = hle_closed_error(c, "the domain was closed while the agent ran");
            goto out;
        }
        struct hl_packet p;
        uint64_t idx;
        r = hle_queue_pop(c, queue, AGENT_IDLE_NS, cfg->spin_ns, &idx, &p);
        if (r == HL_E_TIMEOUT) {
            if (cfg->should_stop && cfg->should_stop(cfg->ud)) break;
            continue;
        }
        if (r) goto out;
        uint8_t hops = hops_take(a, idx);
        if (p.type == HL_PKT_STOP) {
            finish(a, &p, HL_STATUS_SUCCESS, idx);
            break;
        }
        execute(a, idx, &p, hops);
        cfg->packets++;
        if ((cfg->packets & 63) == 0 && cfg->should_stop && cfg->should_stop(cfg->ud)) break;
        __atomic_add_fetch(&v.q->completed, 1, __ATOMIC_SEQ_CST);
    }
    r = HL_OK;
out:
    hle_release(c, queue);
out_free:
    free(a);
    return r;
}
