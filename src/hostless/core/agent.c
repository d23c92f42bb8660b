/*
 * agent.c -- the native agent loop: the consumer of one queue, in C.
 *
 * The command processor of every cpu and npu agent, by the rule on bad
 * packets stated in hostless_engine.h (hle_agent_run's contract, the one
 * statement of it): pop, check, wait on the inputs, run (a C kernel, or the
 * Python callback), signal, push the follow-ups.  The pure checks of a
 * packet's handles, points and input words are hostless_ops.h's
 * (hl_signal_kind_ok, hl_wait_kind_ok, hl_point_ok, hl_input_status), shared
 * with the GPU command processor (gpucp.cu).  A bad packet fails alone with ERROR.  Every
 * handle a packet names is imported (kind and generation checked by
 * hle_import) for the packet's duration and released after it; every count
 * of an argument block is checked against the block's size by subtraction
 * and read once into a local.  ERT packets are run by agent_ert.c (the
 * emulated NPU's command processor); agent_loop.h holds what both share.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_loop.h"

/* A packet (or follow-up) with signal `sig` failed: cfg's count and the queue's statistics. */
static void count_failure(struct agent *a, uint64_t sig) {
    a->cfg->failures++;
    if (!a->qs) return;
    __atomic_add_fetch(&a->qs->failed, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&a->qs->last_failed, sig, __ATOMIC_RELAXED);
}

/* Import h as one of `kind` (0: fence, merged or timeline) for this packet. */
int agent_hold(struct agent *a, uint64_t h, uint32_t kind) {
    uint32_t k = HL_HANDLE_KIND(h);
    if (kind == HL_KIND_SYNC) {
        if (!hl_wait_kind_ok(h))
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

/* Kept imports (hle_agent_run's contract in hostless_engine.h): each object
 * held from held[from] on that is not kept yet is imported once more (the
 * local count only: it is held) and kept, while there is room, when packets
 * come more often than keep_ns. */
void agent_keep(struct agent *a, int from) {
    if (a->cfg->keep_ns <= 0 || a->wait_avg > (uint64_t)a->cfg->keep_ns) return; /* packets come rarely */
    for (int i = from; i < a->nheld && a->nkept < HLE_AGENT_MAX_KEPT; i++) {
        uint64_t h = a->held[i];
        int seen = 0;
        for (int j = 0; j < a->nkept && !seen; j++) seen = a->kept[j] == h;
        uint32_t k = HL_HANDLE_KIND(h) == HL_KIND_MERGED ? HL_KIND_FENCE : HL_HANDLE_KIND(h);
        if (!seen && hle_import(a->c, h, k) == HL_OK) a->kept[a->nkept++] = h;
    }
}

/* Release the kept objects (all, or those no other participant holds). */
static void drop_kept(struct agent *a, int all) {
    int n = 0;
    for (int i = 0; i < a->nkept; i++) {
        uint64_t h = a->kept[i];
        if (all || !hle_held_by_others(a->c, h))
            hle_release(a->c, h);
        else
            a->kept[n++] = h;
    }
    a->nkept = n;
}

static void release_all(struct agent *a) {
    while (a->nheld > 0) hle_release(a->c, a->held[--a->nheld]);
}

/* Decode the argument block `h` (held on success). */
static int decode_args(struct agent *a, uint64_t h, struct kargs *k) {
    int r = agent_hold(a, h, HL_KIND_BUFFER);
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

static void karg_follow(const struct kargs *k, uint32_t i, struct hl_follow *f) {
    memcpy(f, k->base + k->fo_off + (uint64_t)i * sizeof *f, sizeof *f);
}

/* A buffer with its metadata checked against its size. */
int agent_kbuf(struct agent *a, uint64_t h, struct hle_kbuf *b) {
    int r = agent_hold(a, h, HL_KIND_BUFFER);
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
    if (!h || !hl_signal_kind_ok(h)) return;
    uint32_t k = HL_HANDLE_KIND(h);
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
        if (!hl_signal_kind_ok(p->signal))
            return hle_fail(HL_E_HANDLE, "signal 0x%llx is not a fence or timeline", (unsigned long long)p->signal);
        if ((r = agent_hold(a, p->signal, HL_HANDLE_KIND(p->signal)))) return r;
        if (!hl_point_ok(p->signal, p->signal_value))
            return hle_fail(HL_E_VALUE, "timeline signal value 0x%llx is not below 2**62",
                            (unsigned long long)p->signal_value);
    }
    for (int i = 0; i < 2; i++) {
        if (!p->wait[i]) continue;
        if ((r = agent_hold(a, p->wait[i], HL_KIND_SYNC))) return r;
        if (!hl_point_ok(p->wait[i], p->wait_value[i]))
            return hle_fail(HL_E_VALUE, "timeline wait value 0x%llx is not below 2**62",
                            (unsigned long long)p->wait_value[i]);
    }
    return HL_OK;
}

/* SUCCESS, or the first failed input's status (ERROR: timeout, bad word). */
static uint64_t wait_inputs(struct agent *a, const struct hl_packet *p) {
    uint64_t t0 = 0; /* read when an input is not complete at once (its first wait timed out) */
    int64_t limit = a->cfg->wait_timeout_ns;
    for (int i = 0; i < 2; i++) {
        uint64_t h = p->wait[i];
        if (!h) continue;
        int tl = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
        uint64_t thr = tl ? p->wait_value[i] : 1, w = 0;
        for (;;) {
            int64_t slice = AGENT_WAIT_SLICE;
            if (limit >= 0 && t0) {
                int64_t left = limit - (int64_t)(now_ns() - t0);
                if (left < slice) slice = left > 0 ? left : 0;
            } else if (limit >= 0 && limit < slice) {
                slice = limit;
            }
            int r = hle_wait(a->c, h, thr, slice, a->cfg->spin_ns, &w);
            if (r == HL_OK) break;
            if (r != HL_E_TIMEOUT) return HL_STATUS_ERROR; /* closed, released under us */
            if (!t0) t0 = now_ns() - (uint64_t)slice; /* the first slice waited in full */
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
        uint64_t s = hl_input_status(h, w); /* ERROR for a final word that is no status */
        uint32_t ps;
        if (tl && s != HL_STATUS_SUCCESS && hle_point_status(a->c, h, thr, w, &ps) == HL_OK)
            s = ps; /* reached before the failure: SUCCESS (ABI 6) */
        if (s != HL_STATUS_SUCCESS) return s;
    }
    return HL_STATUS_SUCCESS;
}

/* Run a KERNEL packet whose block is decoded: the C kernel, else the callback. */
static uint64_t run_kernel(struct agent *a, uint64_t idx, const struct hl_packet *p, const struct kargs *k) {
    uint32_t ck = p->kernel < HLE_AGENT_MAX_CUS ? a->map[p->kernel] : 0;
    if (ck && k->nbuffers <= AGENT_MAX_KBUFS && k->nscalars <= AGENT_MAX_KSCALARS) {
        struct hle_kbuf b[AGENT_MAX_KBUFS];
        uint64_t sc[AGENT_MAX_KSCALARS];
        for (uint32_t i = 0; i < k->nscalars; i++) sc[i] = karg_u64(k, k->sc_off, i);
        int r = HL_OK;
        for (uint32_t i = 0; i < k->nbuffers && r == HL_OK; i++) r = agent_kbuf(a, karg_u64(k, k->buf_off, i), &b[i]);
        if (r == HL_OK) r = hle_kernel_run(&a->kenv, ck, b, (int)k->nbuffers, sc, (int)k->nscalars);
        if (r == HL_OK) return HL_STATUS_SUCCESS;
        if (r < 0) {
            record(a, p->signal, hle_errmsg());
            return HL_STATUS_ERROR;
        }
        /* r == 1: dtypes, shapes or a GEMM without BLAS: the Python kernel */
    }
    if (!a->cfg->python_kernel) {
        char why[160];
        if (ck)
            snprintf(why, sizeof why, "BadPacket: kernel %u needs the Python kernel for these arguments "
                     "(dtypes, broadcasting, more than %d buffers, or GEMM without a BLAS) and this agent has none",
                     p->kernel, AGENT_MAX_KBUFS);
        else
            snprintf(why, sizeof why, "BadPacket: unknown kernel %u", p->kernel);
        record(a, p->signal, why);
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
    /* follow_timeout bounds the pushes of the packet together: the clock is read only
     * when there are several (a push into a free cell reads none) */
    int64_t total = a->cfg->follow_timeout_ns > 0 ? a->cfg->follow_timeout_ns : 0;
    uint64_t deadline = k->nfollow > 1 ? now_ns() + (uint64_t)total : 0;
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
            int64_t left = total;
            if (deadline) {
                uint64_t now = now_ns();
                left = now < deadline ? (int64_t)(deadline - now) : 0;
            }
            r = hle_queue_push(a->c, f.queue, &f.packet, left, &w);
            hle_release(a->c, f.queue);
        }
        if (r != HL_OK) {
            count_failure(a, f.packet.signal);
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
            else
                status = agent_run_ert(a, p, &k);
        }
    }
    finish(a, p, status, idx);
    if (status != HL_STATUS_SUCCESS) {
        count_failure(a, p->signal);
        int budget = HLE_AGENT_FAIL_BUDGET;
        fail_downstream(a, p, status, &budget, 0);
    } else if (have_args && k.nfollow) {
        push_follow(a, &k, hops);
    }
    agent_keep(a, 0);
    release_all(a);
}

/* A packet queued for the dead consumer this agent replaced (hle_queue_stale_below):
 * nothing of it runs (a STOP included); its signal and its follow-ups' fail with
 * OWNER_DIED, as if its consumer's recovery had failed them. */
static void discard_stale(struct agent *a, uint64_t idx, const struct hl_packet *p) {
    finish(a, p, HL_STATUS_OWNER_DIED, idx);
    int budget = HLE_AGENT_FAIL_BUDGET;
    fail_downstream(a, p, HL_STATUS_OWNER_DIED, &budget, 0);
    count_failure(a, p->signal);
    release_all(a);
}

void hle_agent_default_table(const struct hle_agent_cfg *cfg, uint32_t *present, uint8_t *map) {
    memset(map, 0, HLE_AGENT_MAX_CUS);
    *present = 0;
    if (cfg->kind == HLE_AGENT_NPU) {
        struct hle_agent_cfg t;
        memset(&t, 0, sizeof t);
        hle_agent_npu_cus(&t);
        memcpy(map, t.kernel_map, HLE_AGENT_MAX_CUS);
        *present = t.present;
        return;
    }
    for (uint32_t i = 1; i < HLE_AGENT_MAX_CUS; i++)
        if ((cfg->c_kernels >> i & 1) && hle_agent_has_kernel(i) && i != HL_K_INT8_GEMM) {
            map[i] = (uint8_t)i;
            *present |= 1u << i;
        }
    if (cfg->python_kernel || cfg->python_cu) *present = UINT32_MAX; /* Python knows the rest */
}

/* The kernel table (contract in hostless_engine.h). */
static void load_table(struct agent *a) {
    struct hle_agent_cfg *cfg = a->cfg;
    int empty = cfg->present == 0;
    for (int i = 0; i < HLE_AGENT_MAX_CUS; i++)
        if (cfg->kernel_map[i]) empty = 0;
    if (empty) {
        hle_agent_default_table(cfg, &a->present, a->map);
        return;
    }
    for (int i = 0; i < HLE_AGENT_MAX_CUS; i++) a->map[i] = hle_agent_has_kernel(cfg->kernel_map[i]) ? cfg->kernel_map[i] : 0;
    a->present = cfg->present;
    for (int i = 0; i < HLE_AGENT_MAX_CUS; i++)
        if (a->map[i]) a->present |= 1u << i;
}

/* The doorbell spin for the next pop (contract in hostless_engine.h).  The
 * measured wait of a pop that parked includes the wake-up (tens of us in a
 * VM): packets that come within HLE_AGENT_BUSY_NS of each other count as frequent
 * even when the wake-up alone is longer than spin_ns. */
static int64_t next_spin(const struct agent *a) {
    int64_t max = a->cfg->spin_ns > 0 ? a->cfg->spin_ns : 0;
    if (a->cfg->fixed_spin || max == 0) return max;
    uint64_t busy = max > HLE_AGENT_BUSY_NS ? (uint64_t)max : (uint64_t)HLE_AGENT_BUSY_NS;
    if (a->wait_avg >= busy) return 0; /* packets come rarely: park at once */
    uint64_t s = 4 * a->wait_avg;
    if (s < AGENT_SPIN_FLOOR_NS) s = AGENT_SPIN_FLOOR_NS;
    return s < (uint64_t)max ? (int64_t)s : max;
}

static void note_wait(struct agent *a, uint64_t waited) {
    if (waited > 1000000000ull) waited = 1000000000ull;
    a->wait_avg = a->wait_avg == UINT64_MAX ? waited : (a->wait_avg + waited) / 2;
}

int hle_agent_run(hle_ctx *c, uint64_t queue, struct hle_agent_cfg *cfg) {
    int r = hle_need_attached(c);
    if (r) return r;
    struct agent *a = calloc(1, sizeof *a);
    if (!a) return hle_fail(HL_E_NOMEM, "out of memory");
    a->c = c;
    a->q = queue;
    a->cfg = cfg;
    a->wait_avg = UINT64_MAX;
    load_table(a);
    cfg->blas_loaded = hle_blas_load(&a->kenv, cfg->blas_path, cfg->blas_threads, cfg->blas_why, sizeof cfg->blas_why);
    if ((r = hle_import(c, queue, HL_KIND_QUEUE))) goto out_free;
    if ((r = hle_queue_bind(c, queue))) goto out;
    a->stale_below = hle_queue_stale_below(c, queue);
    struct hl_qview v;
    if ((r = hle_queue_view(c, queue, &v))) goto out;
    a->qs = v.q;
    __atomic_fetch_or(&v.q->flags, HL_QUEUE_COUNTS, __ATOMIC_SEQ_CST); /* monitors: these figures are kept */
    uint64_t last_packet = now_ns(), last_sweep = last_packet;
    int device_seen = 0;
    int waiting = 0;   /* a wait for the next packet is under way (sliced while keeping) */
    int64_t spin = 0;  /* that wait's spin budget */
    uint64_t t0 = 0;   /* and its start */
    while (!a->stop) {
        if (CLOSING(c)) {
            r = hle_closed_error(c, "the domain was closed while the agent ran");
            goto out;
        }
        struct hl_packet p;
        uint64_t idx;
        uint64_t now = now_ns();
        if (!waiting) {
            spin = next_spin(a);
            if (spin) cfg->spins++;
            else cfg->parks++;
            t0 = now;
            waiting = 1;
        }
        int64_t left = spin > (int64_t)(now - t0) ? spin - (int64_t)(now - t0) : 0;
        uint64_t nap = 0;
        uint32_t producer = 0;
        if (cfg->idle_nap_ns > 0 && !device_seen && now - last_packet >= (uint64_t)HLE_AGENT_IDLE_AFTER_NS)
            nap = (uint64_t)(cfg->idle_nap_ns < AGENT_IDLE_NS ? cfg->idle_nap_ns : AGENT_IDLE_NS);
        r = hle_queue_pop_nap(c, queue, a->nkept ? HLE_AGENT_KEEP_SLICE_NS : AGENT_IDLE_NS, left, nap, &idx, &p,
                              &producer);
        if (r == HL_E_TIMEOUT && a->nkept) { /* a slice of keeping: sweep, or drop all after keep_ns */
            drop_kept(a, now_ns() - last_packet >= (uint64_t)cfg->keep_ns);
            /* the pop's spin yields the CPU only past HLE_SPIN_PURE_NS, which may be more
             * than a slice: yield here too, so that a machine with fewer cores than busy
             * processes is not starved */
            if (left > 0) sched_yield();
            continue;
        }
        waiting = 0;
        if (r == HL_E_TIMEOUT) {
            a->wait_avg = UINT64_MAX; /* idle: park at once */
            if (cfg->should_stop && cfg->should_stop(cfg->ud)) break;
            continue;
        }
        if (r) goto out;
        last_packet = now_ns();
        note_wait(a, last_packet - t0);
        if (HL_PRODUCER_IS_DEVICE(producer)) device_seen = 1; /* a device rings by stores: keep poll_ns */
        uint8_t hops = hops_take(a, idx);
        if (idx < a->stale_below) {
            discard_stale(a, idx, &p);
            __atomic_add_fetch(&v.q->completed, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        if (p.type == HL_PKT_STOP) {
            finish(a, &p, HL_STATUS_SUCCESS, idx);
            break;
        }
        execute(a, idx, &p, hops);
        uint64_t done = now_ns();
        __atomic_add_fetch(&v.q->busy_ns, done - last_packet, __ATOMIC_RELAXED);
        /* the kept objects no one else holds: swept at most every keep slice while packets
         * come (each look reads a slot's line, which its signaller has just written) */
        if (a->nkept && done - last_sweep >= (uint64_t)HLE_AGENT_KEEP_SLICE_NS) {
            drop_kept(a, 0);
            last_sweep = done;
        }
        cfg->packets++;
        if ((cfg->packets & 63) == 0 && cfg->should_stop && cfg->should_stop(cfg->ud)) break;
        __atomic_add_fetch(&v.q->completed, 1, __ATOMIC_SEQ_CST);
    }
    r = HL_OK;
out:
    drop_kept(a, 1);
    hle_release(c, queue);
out_free:
    free(a);
    return r;
}

/* Contract in engine.h: a packet's signal and its follow-ups', failed as an agent fails those
 * of a packet that will not run, for a caller that is no agent (cpfwd.c). */
void hle_agent_fail_packet(hle_ctx *c, const struct hl_packet *p, uint64_t status) {
    struct hle_agent_cfg cfg;
    struct agent *a = calloc(1, sizeof *a);
    if (!a) return;
    memset(&cfg, 0, sizeof cfg);
    a->c = c;
    a->cfg = &cfg;
    int budget = HLE_AGENT_FAIL_BUDGET;
    finish_signal(a, p->signal, p->signal_value, status);
    fail_downstream(a, p, status, &budget, 0);
    release_all(a);
    free(a);
}
