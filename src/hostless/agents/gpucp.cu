/*
 * gpucp.cu -- the GPU command processor: a resident kernel that consumes a
 * hostless queue with no host in the loop (compiled with NVRTC by
 * hostless.agents.gpucp, from this file and hostless.h).
 *
 * One block of HL_CP_THREADS threads.  Thread 0 is the front end: it takes
 * the packet at the queue's read index when its cell is READY (SKIP cells are
 * consumed), waits for the packet's inputs (fences: word != 0; timelines:
 * word >= value or failed), resolves the argument block and its buffers
 * (host heap or device heap; every handle checked against the private view:
 * tag, index, kind, generation, extents by subtraction), and checks the
 * kernel's shapes.  Then every thread runs the kernel.  Thread 0 then
 * signals the packet's fence or timeline (system-scope CAS / CAS loop, after
 * a system fence, so a waiter that sees the signal sees the data), pushes the
 * follow-up packets into their queues (direct dispatch, GPU -> GPU or GPU ->
 * CPU agent), frees the cell and advances the read index.
 *
 * Failure passes through: an input that failed, a bad packet (unknown kernel,
 * a handle that names no live buffer, a shape that does not fit) fails the
 * packet's signal with the input's status or ERROR, runs nothing, pushes no
 * follow-up and fails the follow-ups' signals instead, so downstream waiters
 * are released.  The loop ends on a STOP packet or when the host sets
 * ctl->stop; a host process that dies takes its CUDA context and this kernel
 * with it (the domain's recovery marks its fences OWNER_DIED).
 *
 * Holding: the device takes no references.  Like every device signaler (see
 * hostless_ops.h), it relies on the producer holding the packet's objects
 * until the packet completes, which a Graph does for its lifetime.
 */
#include "hostless.h"

#define HL_CP_THREADS 256
#define HL_CP_MAX_BUFS 4
#define HL_CP_STOP_POLL 4096

/* pinned host memory, mapped: the host's window on the processor */
struct hl_cp_ctl {
    hl_u64 stop;       /* host: 1 = leave at the next poll */
    hl_u64 state;      /* 1 running, 2 left (STOP or stop), 3 attach failed */
    hl_u64 packets;    /* packets taken */
    hl_u64 failed;     /* packets failed */
    hl_u64 last_error; /* (packet index << 16) | reason of the last failure */
    hl_u64 heartbeat;  /* bumped every HL_CP_STOP_POLL idle polls */
    hl_u64 pad[2];
};

enum { R_OK = 0, R_INPUT = 1, R_KERNEL = 2, R_ARGS = 3, R_BUFFER = 4, R_SHAPE = 5, R_DTYPE = 6 };

struct cp_buf {
    char *data;
    hl_u64 nbytes;
    hl_u64 count;
    hl_u32 ndim;
    hl_u32 f32;
    hl_u64 shape[HL_BUFFER_MAX_DIMS];
};

struct cp_job {
    int run;            /* kernel id to run, 0 = none */
    int nbuf;
    struct cp_buf b[HL_CP_MAX_BUFS];
    double s0, s1;
    hl_u64 m, k, n;     /* gemm; softmax: rows m, columns n */
};

__device__ static volatile hl_u64 *vol(hl_u64 *p) { return (volatile hl_u64 *)p; }

__device__ static int stop_requested(struct hl_cp_ctl *ctl) { return *vol(&ctl->stop) != 0; }

/* A buffer of this domain, host or device resident, with its metadata checked. */
__device__ static int cp_buffer(const struct hl_dom *d, const hl_u64 *dh_va, hl_u64 h, struct cp_buf *b) {
    struct hl_fence *f = hl_fence_slot(d, h, HL_KIND_BUFFER);
    const struct hl_buffer_meta *m;
    hl_u32 heap;
    hl_u64 off, n;
    int r;
    if (!f || !hl_fence_matches(f, h) || !d->heap) return R_BUFFER;
    r = hl_buffer_device(d, h, &heap, &off, &n);
    if (r == HL_OK) {
        hl_u64 g = hl_load64(&f->parents[0]); /* the metadata block */
        if (!dh_va[heap] || g >= d->heap_granules || d->heap_granules - g < (HL_BUFFER_META_SIZE + HL_GRANULE - 1) / HL_GRANULE)
            return R_BUFFER;
        b->data = (char *)dh_va[heap] + off;
        m = (const struct hl_buffer_meta *)(d->heap_data + g * HL_GRANULE);
    } else if (r == HL_E_VALUE) {
        char *p = (char *)hl_buffer_data(d, h, &n);
        if (!p || (hl_u64)(p - d->heap_data) < HL_BUFFER_META_SIZE) return R_BUFFER;
        b->data = p;
        m = (const struct hl_buffer_meta *)(p - HL_BUFFER_META_SIZE);
    } else {
        return R_BUFFER;
    }
    hl_u64 nb = m->nbytes;
    hl_u32 ndim = m->ndim, isz = m->itemsize;
    if (nb != n || ndim > HL_BUFFER_MAX_DIMS || isz == 0) return R_SHAPE;
    hl_u64 cnt = 1;
    for (hl_u32 i = 0; i < ndim; i++) {
        hl_u64 s = m->shape[i];
        if (s && cnt > ~0ull / s) return R_SHAPE;
        cnt *= s;
        b->shape[i] = s;
    }
    if (cnt > n / isz || cnt * isz != n) return R_SHAPE;
    b->nbytes = n;
    b->count = cnt;
    b->ndim = ndim;
    b->f32 = isz == 4 && m->dtype[0] == '<' && m->dtype[1] == 'f' && m->dtype[2] == '4' && m->dtype[3] == 0;
    return R_OK;
}

/* Wait for input `h` (value v for a timeline); returns 0 (succeeded), its failure status, or -1 (stop). */
__device__ static hl_i64 cp_wait(const struct hl_dom *d, hl_u64 h, hl_u64 v, struct hl_cp_ctl *ctl) {
    struct hl_fence *f = hl_fence_slot(d, h, 0);
    if (!f || !hl_fence_matches(f, h)) return HL_STATUS_ERROR;
    int tl = HL_HANDLE_KIND(h) == HL_KIND_TIMELINE;
    for (unsigned long long n = 0;; n++) {
        hl_u64 w = *vol(&f->word);
        if (tl) {
            if (w & HL_TIMELINE_FAILED) return (hl_i64)(w & 0xffffffffull);
            if (w >= v) break;
        } else if (w != 0) {
            if (w != HL_STATUS_SUCCESS) return (hl_i64)(w & 0xffffffffull);
            break;
        }
        if ((n & 1023) == 1023 && stop_requested(ctl)) return -1;
        __nanosleep(64);
    }
    __threadfence_system(); /* the producer's data before our reads */
    return 0;
}

/* Signal a packet's fence or timeline with `status` (timeline: `value` on success). */
__device__ static void cp_signal(const struct hl_dom *d, hl_u64 h, hl_u64 value, hl_u32 status) {
    if (!h) return;
    __threadfence_system();
    if (HL_HANDLE_KIND(h) == HL_KIND_TIMELINE) {
        struct hl_fence *f = hl_fence_slot(d, h, HL_KIND_TIMELINE);
        if (!f || !hl_fence_matches(f, h)) return;
        if (status == HL_STATUS_SUCCESS)
            hl_timeline_advance(f, value, 0);
        else
            hl_timeline_fail(f, status, 0);
    } else {
        hl_fence_signal(d, h, status);
    }
}

/* Take the packet at the read index: 1 taken, 0 a SKIP consumed, -1 nothing yet. */
__device__ static int cp_pop(struct hl_qview *v, hl_u64 *r, struct hl_packet *out) {
    hl_u64 mask = v->capacity - 1, i = *r;
    hl_u64 cl = *vol(&v->cells[i & mask]);
    hl_u32 st = HL_CELL_STATE(cl);
    if (HL_CELL_SEQ(cl) != (i & 0xffffffffffffull) || (st != HL_CELL_READY && st != HL_CELL_SKIP)) return -1;
    __threadfence_system();
    if (st == HL_CELL_READY) {
        const volatile hl_u64 *src = (const volatile hl_u64 *)&v->packets[i & mask];
        hl_u64 *dst = (hl_u64 *)out;
        for (int w = 0; w < 8; w++) dst[w] = src[w];
    }
    hl_store64(&v->cells[i & mask], HL_CELL(i + v->capacity, 0, HL_CELL_FREE));
    *r = i + 1;
    hl_store64(&v->q->read_index, i + 1);
    return st == HL_CELL_READY;
}

/* Decode a KERNEL packet into *job; returns R_* (R_OK: *job ready). */
__device__ static int cp_decode(const struct hl_dom *d, const hl_u64 *dh_va, const struct hl_packet *p,
                                struct cp_job *job, const char **fo, hl_u32 *nfollow) {
    hl_u64 n = 0;
    const char *a = (const char *)hl_buffer_data(d, p->args, &n);
    struct hl_kernarg ka;
    *nfollow = 0;
    if (!a || n < sizeof ka) return R_ARGS;
    for (unsigned i = 0; i < sizeof ka; i++) ((char *)&ka)[i] = a[i];
    if (ka.magic != HL_KERNARG_MAGIC) return R_ARGS;
    hl_u64 left = n - sizeof ka;
    if ((hl_u64)ka.nbuffers * 8 > left) return R_ARGS;
    left -= (hl_u64)ka.nbuffers * 8;
    if ((hl_u64)ka.nscalars * 8 > left) return R_ARGS;
    left -= (hl_u64)ka.nscalars * 8;
    if ((hl_u64)ka.nfollow * sizeof(struct hl_follow) > left) return R_ARGS;
    const hl_u64 *bufs = (const hl_u64 *)(a + sizeof ka);
    const hl_u64 *sc = bufs + ka.nbuffers;
    *fo = (const char *)(sc + ka.nscalars);
    *nfollow = ka.nfollow;
    if (ka.nbuffers < 1 || ka.nbuffers > HL_CP_MAX_BUFS) return R_ARGS;
    job->nbuf = ka.nbuffers;
    for (int i = 0; i < ka.nbuffers; i++) {
        int r = cp_buffer(d, dh_va, bufs[i], &job->b[i]);
        if (r) return r;
    }
    hl_u64 w0 = ka.nscalars > 0 ? sc[0] : 0, w1 = ka.nscalars > 1 ? sc[1] : 0;
    job->s0 = __longlong_as_double((long long)w0);
    job->s1 = __longlong_as_double((long long)w1);
    const struct cp_buf *o = &job->b[ka.nbuffers - 1], *x = &job->b[0];
    hl_u32 k = p->kernel;
    if (k == 1) { /* copy: bytes of any dtype */
        if (ka.nbuffers != 2 || x->nbytes != o->nbytes) return R_SHAPE;
        job->run = 1;
        return R_OK;
    }
    for (int i = 0; i < ka.nbuffers; i++)
        if (!job->b[i].f32) return R_DTYPE;
    switch (k) {
    case 2: /* add */
        if (ka.nbuffers != 3 || job->b[1].count != x->count || o->count != x->count) return R_SHAPE;
        break;
    case 3: /* scale */
        if (ka.nbuffers != 2 || ka.nscalars < 1 || o->count != x->count) return R_SHAPE;
        break;
    case 4: /* relu */
        if (ka.nbuffers != 2 || o->count != x->count) return R_SHAPE;
        break;
    case 5: { /* gemm (m,k) x (k,n) -> (m,n) */
        const struct cp_buf *w = &job->b[1];
        if (ka.nbuffers != 3 || x->ndim != 2 || w->ndim != 2 || o->ndim != 2) return R_SHAPE;
        if (x->shape[1] != w->shape[0] || o->shape[0] != x->shape[0] || o->shape[1] != w->shape[1]) return R_SHAPE;
        job->m = x->shape[0];
        job->k = x->shape[1];
        job->n = w->shape[1];
        break;
    }
    case 6: /* sum -> out[0] */
        if (ka.nbuffers != 2 || o->count < 1) return R_SHAPE;
        break;
    case 7: /* softmax over the last axis */
        if (ka.nbuffers != 2 || o->count != x->count || x->ndim < 1 || x->shape[x->ndim - 1] == 0) return R_SHAPE;
        job->n = x->shape[x->ndim - 1];
        job->m = x->count / job->n;
        break;
    case 9: /* normalize: (x - mean) / std */
        if (ka.nbuffers != 2 || o->count != x->count) return R_SHAPE;
        if (ka.nscalars < 1) job->s0 = 0.0;
        if (ka.nscalars < 2) job->s1 = 1.0;
        break;
    default:
        return R_KERNEL;
    }
    job->run = (int)k;
    return R_OK;
}

__device__ static float block_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < HL_CP_THREADS / 32; i++) t += red[i];
    return t;
}

/* Every thread of the block: run the decoded kernel. */
__device__ static void cp_run(struct cp_job *job, float *tile, float *red) {
    const int t = threadIdx.x, T = HL_CP_THREADS;
    struct cp_buf *o = &job->b[job->nbuf - 1];
    float *out = (float *)o->data, *x = (float *)job->b[0].data;
    hl_u64 n = o->count;
    switch (job->run) {
    case 1: {
        hl_u64 nb = o->nbytes;
        const char *s = job->b[0].data;
        char *d = o->data;
        if (((hl_u64)s | (hl_u64)d | nb) % 4 == 0)
            for (hl_u64 i = t; i < nb / 4; i += T) ((float *)d)[i] = ((const float *)s)[i];
        else
            for (hl_u64 i = t; i < nb; i += T) d[i] = s[i];
        break;
    }
    case 2: {
        const float *y = (const float *)job->b[1].data;
        for (hl_u64 i = t; i < n; i += T) out[i] = x[i] + y[i];
        break;
    }
    case 3: {
        float f = (float)job->s0;
        for (hl_u64 i = t; i < n; i += T) out[i] = x[i] * f;
        break;
    }
    case 4:
        for (hl_u64 i = t; i < n; i += T) out[i] = fmaxf(x[i], 0.f);
        break;
    case 5: { /* 16x16 output tiles, 16-wide k steps through shared memory */
        const float *w = (const float *)job->b[1].data;
        hl_u64 M = job->m, K = job->k, N = job->n;
        float *As = tile, *Bs = tile + 256;
        int ty = t >> 4, tx = t & 15;
        for (hl_u64 bi = 0; bi < M; bi += 16)
            for (hl_u64 bj = 0; bj < N; bj += 16) {
                float acc = 0.f;
                for (hl_u64 kk = 0; kk < K; kk += 16) {
                    hl_u64 r = bi + ty, c = kk + tx;
                    As[t] = (r < M && c < K) ? x[r * K + c] : 0.f;
                    r = kk + ty;
                    c = bj + tx;
                    Bs[t] = (r < K && c < N) ? w[r * N + c] : 0.f;
                    __syncthreads();
#pragma unroll
                    for (int q = 0; q < 16; q++) acc += As[ty * 16 + q] * Bs[q * 16 + tx];
                    __syncthreads();
                }
                if (bi + ty < M && bj + tx < N) out[(bi + ty) * N + bj + tx] = acc;
            }
        break;
    }
    case 6: {
        float s = 0.f;
        for (hl_u64 i = t; i < job->b[0].count; i += T) s += x[i];
        s = block_sum(s, red);
        if (t == 0) out[0] = s;
        break;
    }
    case 7: { /* one warp per row */
        int lane = t & 31, wid = t >> 5;
        hl_u64 N = job->n;
        for (hl_u64 r = wid; r < job->m; r += T / 32) {
            const float *xr = x + r * N;
            float *orow = out + r * N;
            float mx = -__int_as_float(0x7f800000);
            for (hl_u64 c = lane; c < N; c += 32) mx = fmaxf(mx, xr[c]);
            for (int s = 16; s; s >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
            float sum = 0.f;
            for (hl_u64 c = lane; c < N; c += 32) sum += __expf(xr[c] - mx);
            for (int s = 16; s; s >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, s);
            for (hl_u64 c = lane; c < N; c += 32) orow[c] = __expf(xr[c] - mx) / sum;
        }
        break;
    }
    case 9: {
        float mean = (float)job->s0, inv = (float)(1.0 / job->s1);
        for (hl_u64 i = t; i < n; i += T) out[i] = (x[i] - mean) * inv;
        break;
    }
    }
}

extern "C" __global__ void __launch_bounds__(HL_CP_THREADS)
hl_cp_main(char *base, unsigned long long size, unsigned long long qhandle, const unsigned long long *dh_va,
           struct hl_cp_ctl *ctl) {
    __shared__ struct hl_dom d;
    __shared__ struct hl_qview v;
    __shared__ struct hl_packet p;
    __shared__ struct cp_job job;
    __shared__ int op;    /* 0 nothing to run, 1 run job, 2 leave after this packet */
    __shared__ int taken; /* a packet was taken this round */
    __shared__ float tile[512];
    __shared__ float red[HL_CP_THREADS / 32];
    hl_u64 r = 0;
    if (threadIdx.x == 0) {
        op = 0;
        taken = 0;
        if (hl_attach(&d, base, size) != HL_OK || hl_queue_open(&d, qhandle, &v) != HL_OK) {
            *vol(&ctl->state) = 3;
            op = 2;
        } else {
            r = hl_load64(&v.q->read_index);
            *vol(&ctl->state) = 1;
        }
    }
    __syncthreads();
    while (op != 2) {
        hl_u32 status = HL_STATUS_SUCCESS, reason = R_OK, nfollow = 0;
        const char *fo = 0;
        if (threadIdx.x == 0) {
            int got = -1;
            for (unsigned long long spins = 0; got != 1; spins++) {
                got = cp_pop(&v, &r, &p);
                if (got == 1) break;
                if ((spins % HL_CP_STOP_POLL) == HL_CP_STOP_POLL - 1) {
                    *vol(&ctl->heartbeat) += 1;
                    if (stop_requested(ctl)) break;
                }
                if (got < 0) __nanosleep(32);
            }
            job.run = 0;
            taken = got == 1;
            if (got != 1) {
                op = 2;
            } else {
                *vol(&ctl->packets) += 1;
                for (int i = 0; i < 2 && status == HL_STATUS_SUCCESS; i++) {
                    if (!p.wait[i]) continue;
                    hl_i64 w = cp_wait(&d, p.wait[i], p.wait_value[i], ctl);
                    if (w < 0) {
                        status = HL_STATUS_CANCEL;
                        op = 2;
                    } else if (w) {
                        status = (hl_u32)w;
                        reason = R_INPUT;
                    }
                }
                if (status == HL_STATUS_SUCCESS && p.type == HL_PKT_KERNEL) {
                    reason = cp_decode(&d, dh_va, &p, &job, &fo, &nfollow);
                    if (reason) {
                        status = HL_STATUS_ERROR;
                        job.run = 0;
                    }
                } else if (status == HL_STATUS_SUCCESS && p.type != HL_PKT_BARRIER && p.type != HL_PKT_STOP) {
                    status = HL_STATUS_ERROR;
                    reason = R_KERNEL;
                }
                if (op != 2) op = job.run ? 1 : 0;
            }
        }
        __syncthreads();
        if (op == 1) cp_run(&job, tile, red);
        __syncthreads();
        if (threadIdx.x == 0 && taken) {
            __threadfence_system(); /* the kernel's writes before the signal */
            cp_signal(&d, p.signal, p.signal_value, status);
            if (status != HL_STATUS_SUCCESS) {
                *vol(&ctl->failed) += 1;
                *vol(&ctl->last_error) = ((r - 1) << 16) | reason;
            }
            for (hl_u32 i = 0; i < nfollow; i++) {
                struct hl_follow f;
                const char *src = fo + (hl_u64)i * sizeof f;
                for (unsigned b = 0; b < sizeof f; b++) ((char *)&f)[b] = ((const volatile char *)src)[b];
                if (status == HL_STATUS_SUCCESS) {
                    hl_u64 idx = 0;
                    int pr = HL_E_FULL;
                    for (long s = 0; s < (1L << 22) && pr == HL_E_FULL; s++)
                        pr = hl_queue_try_push(&d, f.queue, &f.packet, HL_PRODUCER_DEVICE, &idx);
                    if (pr != HL_OK) cp_signal(&d, f.packet.signal, f.packet.signal_value, HL_STATUS_ERROR);
                } else {
                    cp_signal(&d, f.packet.signal, f.packet.signal_value, status);
                }
            }
            hl_store64(&v.q->completed, hl_load64(&v.q->completed) + 1);
            if (p.type == HL_PKT_STOP) op = 2;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *vol(&ctl->state) = 2;
}
