/* gpucp_sync.cu -- part of gpucp.cu's program (read after the parts before it in gpucp.CU_PARTS,
 * never compiled alone): waits, signals, failure passing, queue pushes. */

/* Wait for input h (value v for a timeline; both checked by the caller: hl_wait_kind_ok,
 * hl_point_ok): 0 (succeeded), its failure status (hl_input_status: ERROR for a final word that is
 * not a status), or -1 (stop). */
__device__ __noinline__ static hl_i64 cp_wait(const struct hl_dom *d, hl_u64 h, hl_u64 v, struct hl_cp_ctl *ctl) {
    struct hl_fence *f = hl_fence_slot(d, h, 0);
    if (!f || !hl_wait_kind_ok(h) || !hl_fence_matches(f, h)) return HL_STATUS_ERROR;
    int tl = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
    hl_u64 w;
    for (unsigned long long n = 0;; n++) {
        w = *vol(&f->word);
        if (tl ? (w & HL_TIMELINE_FAILED) || w >= v : w != 0) break;
        if ((n & 1023) == 1023 && *vol(&ctl->stop)) return -1;
        __nanosleep(32);
    }
    const hl_u32 st = hl_input_status(h, w);
    if (st != HL_STATUS_SUCCESS) return (hl_i64)st;
    __threadfence_system(); /* the producer's data before our reads */
    return 0;
}

/* An input whose ctl and word were read already: 1 when they show it succeeded (at v). */
__device__ static int input_done(hl_u64 h, hl_u64 v, hl_u64 c, hl_u64 w) {
    if (!hl_ctl_matches(c, h)) return 0;
    if (HL_HANDLE_KIND(h) == HL_KIND_TIMELINE) return !(w & HL_TIMELINE_FAILED) && w >= v;
    return w == HL_STATUS_SUCCESS;
}

/* {word, ctl} of a slot (offsets 0 and 8 of its 64-byte aligned slot): the operand of the 16-byte CAS */
struct __align__(16) cp_wc {
    hl_u64 word, ctl;
};

/* One CAS of slot f's completion word from *expect to `desired` while its ctl is still c (the LIVE
 * object the caller matched): with HL_CP_CAS128 the check and the write are one atomic step (write
 * rule (c)), else the word alone is CASed after the caller's match.  1: written; 0: the word was
 * not *expect (*expect receives it); -1: the slot holds another object now (nothing written).
 * System scope, relaxed: the caller fences before. */
__device__ static int cp_cas_slot(struct hl_fence *f, hl_u64 *expect, hl_u64 c, hl_u64 desired) {
#if HL_CP_CAS128
    struct cp_wc e, n;
    e.word = *expect;
    e.ctl = c;
    n.word = desired;
    n.ctl = c;
    const struct cp_wc o = atomicCAS_system((struct cp_wc *)(void *)f, e, n);
    if (o.ctl != c) return -1;
    if (o.word == e.word) return 1;
    *expect = o.word;
    return 0;
#else
    const hl_u64 o = (hl_u64)atomicCAS_system((unsigned long long *)&f->word, (unsigned long long)*expect,
                                              (unsigned long long)desired);
    if (o == *expect) return 1;
    *expect = o;
    return 0;
#endif
}

/* Signal h with `status` (timeline: `value` on success; a failure fails it).  ctl and word: the
 * slot's, read before (0, 0: read them now).  A handle that is not a live fence or timeline
 * (hl_signal_kind_ok, hl_ctl_matches) is left alone, as is a success past HL_TIMELINE_MAX.  Every
 * write is cp_cas_slot against that ctl.  Returns 1 when h is known to hold success (at `value`
 * or later for a timeline). */
__device__ __noinline__ static int cp_signal(const struct hl_dom *d, hl_u64 h, hl_u64 value, hl_u32 status, hl_u64 c,
                                hl_u64 word) {
    struct hl_fence *f = hl_fence_slot(d, h, 0);
    if (!h || !f || !hl_signal_kind_ok(h)) return 0;
    if (!c) {
        c = rd(&f->ctl);
        word = rd(&f->word);
    }
    if (!hl_ctl_matches(c, h)) return 0;
    if (!hl_status_valid(status)) status = HL_STATUS_ERROR;
    __threadfence_system(); /* what came before (a job's writes) before the signal */
    int r;
    if (HL_HANDLE_KIND(h) == HL_KIND_TIMELINE) {
        hl_u64 cur = word;
        if (status != HL_STATUS_SUCCESS) {
#if HL_CP_CAS128
            /* the word only: aux (the value reached) is not ours to write without a reference */
            while (!(cur & HL_TIMELINE_FAILED) && (r = cp_cas_slot(f, &cur, c, HL_TIMELINE_FAILED | status)) == 0) {
            }
#else
            hl_timeline_fail(f, status, 0);
#endif
            return 0;
        }
        if (value > HL_TIMELINE_MAX) return 0;
        while (!(cur & HL_TIMELINE_FAILED) && value > cur) {
            if ((r = cp_cas_slot(f, &cur, c, value)) != 0) return r > 0;
        }
        return !(cur & HL_TIMELINE_FAILED);
    }
    hl_u64 expected = 0;
    r = cp_cas_slot(f, &expected, c, (hl_u64)status);
    return r > 0 ? status == HL_STATUS_SUCCESS : r == 0 && expected == HL_STATUS_SUCCESS;
}

/* Lane 0: fail the signals of the follow-ups nested in packet p's argument block, and in theirs
 * (blocks from depth `depth` down to HL_CP_FAIL_DEPTH; *budget signals in all), as core/agent.c's
 * fail_downstream: those packets will never run.  Each block is checked as a decode checks it (a
 * live buffer in the host heap, by its slot read at once; its magic; its counts against its size
 * by subtraction); a bad one fails nothing further. */
__device__ __noinline__ static void cp_fail_nested(const struct hl_dom *d, const struct hl_packet *p, hl_u32 status, int *budget,
                                      int depth) {
    const hl_u64 *fw[HL_CP_FAIL_DEPTH]; /* a frame: a block's follow-ups, how many, the next one */
    hl_u32 nf[HL_CP_FAIL_DEPTH], at[HL_CP_FAIL_DEPTH];
    int top = 0;
    hl_u32 type = p->type;
    hl_u64 args = p->args;
    for (;;) {
        struct hl_fence *bf = (type == HL_PKT_KERNEL || type == HL_PKT_ERT) && args && depth + top < HL_CP_FAIL_DEPTH
                                  ? hl_fence_slot(d, args, HL_KIND_BUFFER)
                                  : 0;
        if (bf) {
            hl_u64 s[8];
#pragma unroll
            for (int k = 0; k < 8; k++) s[k] = rd((const hl_u64 *)bf + k);
            const hl_u64 *blk = (const hl_u64 *)host_block(d, args, s);
            if (blk && s[4] >= 16) {
                const hl_u64 a0 = rd(blk), a1 = rd(blk + 1);
                const hl_u64 nb = (hl_u16)(a0 >> 32), ns = (hl_u16)(a0 >> 48), n = (hl_u16)a1;
                hl_u64 left = s[4] / 8 - 2;
                if ((hl_u32)a0 == HL_KERNARG_MAGIC && nb <= left && ns <= left - nb &&
                    n * HL_FOLLOW_WORDS <= left - nb - ns && n) {
                    fw[top] = blk + 2 + nb + ns;
                    nf[top] = (hl_u32)n;
                    at[top] = 0;
                    top++;
                }
            }
        }
        for (;;) { /* the next follow-up to fail, depth first */
            if (top == 0) return;
            if (at[top - 1] >= nf[top - 1] || *budget <= 0) {
                top--;
                continue;
            }
            const hl_u64 *w = fw[top - 1] + (hl_u64)at[top - 1]++ * HL_FOLLOW_WORDS;
            struct hl_packet q;
#pragma unroll
            for (int k = 0; k < 8; k++) ((hl_u64 *)&q)[k] = rd(w + 1 + k);
            --*budget;
            cp_signal(d, q.signal, q.signal_value, status, 0, 0);
            type = q.type;
            args = q.args;
            break;
        }
    }
}

/* Queues pushed into: their validated views and the index after our last push. */
struct cp_qcache {
    hl_u32 producer; /* HL_PRODUCER_DEVICE_OF(our host participant): recovery of it skips our reservations */
    hl_u64 handle[HL_CP_QCACHE];
    hl_u64 next[HL_CP_QCACHE];
    struct hl_qview v[HL_CP_QCACHE];
};

/* The view of queue q (lane 0): from the cache when c (its slot's ctl, read
 * by the caller, or 0: read it now) says the same live queue, else opened
 * and kept.  0 when q is not a live queue. */
__device__ static int cp_qview(const struct hl_dom *d, struct cp_qcache *qc, hl_u64 q, hl_u64 c) {
    int i = (int)(HL_HANDLE_INDEX(q) & (HL_CP_QCACHE - 1));
    struct hl_fence *f = hl_fence_slot(d, q, HL_KIND_QUEUE);
    if (!f) return -1;
    if (!c) c = rd(&f->ctl);
    if (qc->handle[i] == q && hl_ctl_matches(c, q)) return i;
    qc->handle[i] = 0;
    if (hl_queue_open(d, q, &qc->v[i]) != HL_OK) return -1;
    qc->handle[i] = q;
    qc->next[i] = HL_QUEUE_NO_HINT;
    return i;
}

/* Reserve a cell of cached queue i.  A full queue is retried until %globaltimer reaches *dl (0: set
 * to HL_CP_PUSH_NS from now; one packet's follow-ups share it), and not at all when !wait (our own
 * queue: only we free its cells). */
__device__ static int cp_reserve(struct cp_qcache *qc, int i, hl_u64 *w, hl_u64 *dl, int wait) {
    int pr = hl_queue_reserve(&qc->v[i], qc->producer, qc->next[i], w);
    if (pr == HL_E_FULL && wait) {
        if (!*dl) *dl = gtimer() + HL_CP_PUSH_NS;
        while (pr == HL_E_FULL && gtimer() < *dl) {
            __nanosleep(256);
            pr = hl_queue_reserve(&qc->v[i], qc->producer, HL_QUEUE_NO_HINT, w);
        }
    }
    qc->next[i] = pr == HL_OK ? *w + 1 : HL_QUEUE_NO_HINT;
    return pr;
}

/* The outbox (hostless_gpucp.h; lane 0's): the next position, and the first one not known free. */
struct cp_out_state {
    hl_u64 pos, free_below;
    hl_u64 own_pos; /* the position of our last follow-up into our own queue */
    int own_pending; /* it may not be in our queue yet: nothing runs in place meanwhile */
};

/* Hand follow-up p for queue q to the host forwarder (no atomic crosses the bus): waits while the
 * outbox is full until %globaltimer reaches *dl (as cp_reserve), then HL_E_FULL. */
__device__ static int cp_out_put(struct hl_cp_outbox *ob, struct cp_out_state *os, hl_u64 q, hl_u64 hops,
                                 const struct hl_packet *p, hl_u64 *dl) {
    while (os->pos >= os->free_below) {
        os->free_below = rd(&ob->taken) + HL_CP_OUTBOX;
        if (os->pos < os->free_below) break;
        if (!*dl) *dl = gtimer() + HL_CP_PUSH_NS;
        if (gtimer() >= *dl) return HL_E_FULL;
        __nanosleep(256);
    }
    struct hl_cp_out *s = &ob->slot[os->pos % HL_CP_OUTBOX];
    *vol(&s->queue) = q;
    *vol(&s->hops) = hops;
#pragma unroll
    for (int k = 0; k < 8; k++) *vol((hl_u64 *)&s->packet + k) = ((const hl_u64 *)p)[k];
    __threadfence_system(); /* the slot before its seq */
    *vol(&s->seq) = os->pos + 1;
    os->pos++;
    return HL_OK;
}

/* Word k of follow-up i of entry e (from shared memory, or device memory past HL_CP_FW words):
 * 0 its queue, 1..8 its packet. */
__device__ __forceinline__ static hl_u64 follow_word(const struct cp_front *F, const struct cp_gent *gc, int e,
                                                     int which, hl_u32 i, hl_u32 k) {
    hl_u32 o = i * HL_FOLLOW_WORDS + k;
    return o < HL_CP_FW ? F->fw[which][o] : gc[e].aw[F->dir[e].fo + o];
}

/* The round trip's atomics, made by warps 1 (the signal: a fence, then a CAS from the word read
 * before) and 2 (the reserve of the first other queue's cell) while warp 0 makes its loads: a
 * warp's system-scope atomic waits for that warp's earlier loads of host memory (measured: a read
 * and a CAS issued together by one warp take two round trips, two reads one). */
struct cp_sideop {
    int sig;          /* warp 1: signal */
    int sys;          /* with a system fence (else GPU scope) */
    hl_u64 *word;
    hl_u64 expected, desired, old, ctl; /* ctl: the signal's slot as matched (cp_cas_slot) */
    int gone;         /* the slot held another object at the CAS: nothing written */
    int resv;         /* warp 2: reserve in queue q0 (its slot's ctl q0_c) */
    hl_u64 q0, q0_c, qw;
    int qi, qr;
};

__device__ static void sideop_run(struct cp_front *F, struct cp_qcache *QC, struct cp_sideop *SO, int warp) {
    if (warp == 1 && SO->sig) {
        if (SO->sys)
            __threadfence_system();
        else
            __threadfence();
#if HL_CP_SIGNAL_CAS128
        hl_u64 old = SO->expected;
        const int r = cp_cas_slot((struct hl_fence *)(void *)SO->word, &old, SO->ctl, SO->desired);
        SO->old = old;
        SO->gone = r < 0;
#else
        SO->old = atomicCAS_system((unsigned long long *)SO->word, (unsigned long long)SO->expected,
                                   (unsigned long long)SO->desired);
#endif
    } else if (warp == 2 && SO->resv) {
        hl_u64 dl = 0;
        SO->qi = cp_qview(&F->d, QC, SO->q0, SO->q0_c);
        SO->qr = SO->qi >= 0 ? cp_reserve(QC, SO->qi, &SO->qw, &dl, 1) : HL_E_HANDLE;
    }
}

