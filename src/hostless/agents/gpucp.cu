/*
 * gpucp.cu -- the GPU command processor: a resident kernel that consumes a
 * hostless queue with no host in the loop (compiled with NVRTC by
 * hostless.agents.gpucp, from this file and hostless.h).
 *
 * Grid: block 0 is the front end (its warp 0 only; the other warps leave at
 * once); blocks 1..W are the workers, HL_CP_THREADS threads each.  The host
 * launches it on a green context's SM partition when the driver has them,
 * else as a bounded grid next to other work (hostless.agents.gpucp).
 *
 * The front end takes the packet at the queue's read index when its cell is
 * READY (SKIP cells are consumed), waits for the packet's inputs (fences:
 * word != 0; timelines: word >= value or failed), decodes its argument block
 * and buffers (host heap or device heap; every handle checked against the
 * private view: tag, index, kind, generation, extents by subtraction), and
 * checks the kernel's shapes.  It hands the job to the workers through
 * device memory (struct cp_share: a generation word they poll) and waits for
 * all of them to finish; then it signals the packet's fence or timeline
 * (system-scope CAS after a system fence, so a waiter that sees the signal
 * sees the data) and pushes the follow-up packets (direct dispatch, GPU ->
 * GPU or GPU -> CPU agent).
 *
 * The bus is the cost: every read of host memory is a round trip over PCIe
 * (~1 us).  So the front end reads with the whole warp (a 64-byte slot, a
 * packet or an argument block is one round trip, a lane per word), keeps a
 * small cache of decoded argument blocks (a hit re-reads the block and the
 * liveness of its buffers in one round trip and compares), and does work
 * for what comes next while the workers run: it decodes the follow-up for
 * its own queue, reads the signal's slot and the cells it will push into.
 * A follow-up for its own queue runs in place, without the ring, when the
 * queue is empty at that moment (the push and the pop it stands for would
 * be adjacent, so nobody can tell the difference but the statistics).
 *
 * Failure passes through: an input that failed, a bad packet (unknown kernel,
 * a handle that names no live buffer, a shape that does not fit, an
 * argument block over HL_CP_ARGS_WORDS words) fails the packet's signal with
 * the input's status or ERROR, runs nothing, pushes no follow-up and fails
 * the follow-ups' signals instead, so downstream waiters are released.  The
 * loop ends on a STOP packet or when the host sets ctl->stop; a host process
 * that dies takes its CUDA context and this kernel with it (the domain's
 * recovery marks its fences OWNER_DIED).
 *
 * Holding: the device takes no references.  Like every device signaler (see
 * hostless_ops.h), it relies on the producer holding the packet's objects,
 * and those of its follow-ups, until they complete, which a Graph does for
 * its lifetime.  A slot's words are read at once and each is bounds-checked,
 * so a slot changing under the read yields at worst a wrong extent inside
 * the heap, which only such a holding violation can cause.  The argument
 * block of an in-flight packet (its follow-ups' too) must not change: the
 * follow-up for this queue is decoded while its parent runs.
 */
#include "hostless.h"

#define HL_CP_THREADS 256
#define HL_CP_MAX_BUFS 4
#define HL_CP_ARGS_WORDS 128 /* an argument block of at most 1 KiB */
#define HL_CP_CACHE 8        /* decoded argument blocks kept */
#define HL_CP_STOP_POLL 4096
#define HL_CP_FULL 0xffffffffu
#define HL_CP_TILE 32        /* gemm: 32x32 output tiles, 32-deep k steps */

/* pinned host memory, mapped: the host's window on the processor */
struct hl_cp_ctl {
    hl_u64 stop;       /* host: 1 = leave at the next poll */
    hl_u64 state;      /* 1 running, 2 left (STOP or stop), 3 attach failed */
    hl_u64 packets;    /* packets run (taken from the ring or in place) */
    hl_u64 failed;     /* packets failed */
    hl_u64 last_error; /* (packets at the time << 16) | reason of the last failure */
    hl_u64 heartbeat;  /* bumped every HL_CP_STOP_POLL idle polls */
    hl_u64 inplace;    /* follow-ups run in place (own queue, empty) */
    hl_u64 handoff_ns; /* summed %globaltimer from a stage's join to the next in-place stage's fork */
};

enum { R_OK = 0, R_INPUT = 1, R_KERNEL = 2, R_ARGS = 3, R_BUFFER = 4, R_SHAPE = 5, R_DTYPE = 6 };
enum { K_STOP = -1, K_NONE = 0, K_COPY = 1, K_ADD = 2, K_SCALE = 3, K_RELU = 4, K_GEMM = 5, K_SUM = 6,
       K_SOFTMAX = 7, K_NORMALIZE = 9 };

/* What the workers need: plain values, no handles. */
struct cp_job {
    int run;  /* K_* */
    int nbuf;
    char *data[HL_CP_MAX_BUFS];
    hl_u64 nbytes[HL_CP_MAX_BUFS];
    hl_u64 count[HL_CP_MAX_BUFS];
    double s0, s1;
    hl_u64 m, k, n; /* gemm (m,k)x(k,n); softmax: m rows of n */
};

/* device memory: the front end's hand-off to the worker blocks */
struct cp_share {
    unsigned int go;   /* bumped once per job (the job is written before) */
    unsigned int done; /* worker blocks finished, cumulative */
    unsigned int pad[14];
    struct cp_job job;
};

/* A decoded argument block (the front end's cache). */
struct cp_entry {
    hl_u64 args;      /* its handle, 0 = empty */
    const hl_u64 *src; /* its words in the host heap */
    hl_u32 nw;        /* words */
    hl_u32 nfollow;   /* follow-ups, from word fo */
    hl_u32 fo;
    hl_u32 nbuf;
    hl_u32 kernel;    /* the packet's kernel id it was decoded for */
    hl_u64 bh[HL_CP_MAX_BUFS]; /* buffer handles (words 2..) */
    struct cp_job job;
    hl_u64 aw[HL_CP_ARGS_WORDS];
};

__device__ static volatile hl_u64 *vol(hl_u64 *p) { return (volatile hl_u64 *)p; }
__device__ static hl_u64 rd(const hl_u64 *p) { return *(const volatile hl_u64 *)p; }
__device__ static hl_u64 gtimer(void) {
    hl_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* ------------------------------------------------------------------ workers */

__device__ static float block_sum(float v, float *red) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(HL_CP_FULL, v, o);
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[wid] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < HL_CP_THREADS / 32; i++) t += red[i];
    return t;
}

/* Worker block wb of nw: its share of the job (every thread of the block). */
__device__ static void cp_run(const struct cp_job *job, int wb, int nw, float *As, float *Bs, float *red) {
    const int t = threadIdx.x, T = HL_CP_THREADS;
    const hl_u64 gt = (hl_u64)wb * T + t, GT = (hl_u64)nw * T;
    float *out = (float *)job->data[job->nbuf - 1], *x = (float *)job->data[0];
    hl_u64 n = job->count[job->nbuf - 1];
    switch (job->run) {
    case K_COPY: {
        hl_u64 nb = job->nbytes[job->nbuf - 1];
        const char *s = job->data[0];
        char *d = job->data[job->nbuf - 1];
        if (((hl_u64)s | (hl_u64)d | nb) % 16 == 0)
            for (hl_u64 i = gt; i < nb / 16; i += GT) ((float4 *)d)[i] = ((const float4 *)s)[i];
        else
            for (hl_u64 i = gt; i < nb; i += GT) d[i] = s[i];
        break;
    }
    case K_ADD: {
        const float *y = (const float *)job->data[1];
        for (hl_u64 i = gt; i < n; i += GT) out[i] = x[i] + y[i];
        break;
    }
    case K_SCALE: {
        float f = (float)job->s0;
        for (hl_u64 i = gt; i < n; i += GT) out[i] = x[i] * f;
        break;
    }
    case K_RELU:
        for (hl_u64 i = gt; i < n; i += GT) out[i] = fmaxf(x[i], 0.f);
        break;
    case K_NORMALIZE: {
        float mean = (float)job->s0, inv = (float)(1.0 / job->s1);
        for (hl_u64 i = gt; i < n; i += GT) out[i] = (x[i] - mean) * inv;
        break;
    }
    case K_GEMM: { /* 32x32 output tiles over the worker blocks; 2x2 outputs a thread */
        const float *w = (const float *)job->data[1];
        const hl_u64 M = job->m, K = job->k, N = job->n, S = HL_CP_TILE;
        const hl_u64 tm = (M + S - 1) / S, tn = (N + S - 1) / S;
        const int ty = t >> 4, tx = t & 15;
        for (hl_u64 tile = wb; tile < tm * tn; tile += nw) {
            hl_u64 bi = (tile / tn) * S, bj = (tile % tn) * S;
            float a00 = 0.f, a01 = 0.f, a10 = 0.f, a11 = 0.f;
            for (hl_u64 kk = 0; kk < K; kk += S) {
                for (int e = t; e < S * S; e += T) {
                    int rr = e / S, cc = e % S;
                    hl_u64 r = bi + rr, c = kk + cc;
                    As[e] = (r < M && c < K) ? x[r * K + c] : 0.f;
                    r = kk + rr;
                    c = bj + cc;
                    Bs[e] = (r < K && c < N) ? w[r * N + c] : 0.f;
                }
                __syncthreads();
#pragma unroll 8
                for (int q = 0; q < S; q++) {
                    float p0 = As[(2 * ty) * S + q], p1 = As[(2 * ty + 1) * S + q];
                    float q0 = Bs[q * S + 2 * tx], q1 = Bs[q * S + 2 * tx + 1];
                    a00 += p0 * q0;
                    a01 += p0 * q1;
                    a10 += p1 * q0;
                    a11 += p1 * q1;
                }
                __syncthreads();
            }
            hl_u64 r0 = bi + 2 * ty, c0 = bj + 2 * tx;
            if (r0 < M && c0 < N) out[r0 * N + c0] = a00;
            if (r0 < M && c0 + 1 < N) out[r0 * N + c0 + 1] = a01;
            if (r0 + 1 < M && c0 < N) out[(r0 + 1) * N + c0] = a10;
            if (r0 + 1 < M && c0 + 1 < N) out[(r0 + 1) * N + c0 + 1] = a11;
        }
        break;
    }
    case K_SUM: { /* one block: a deterministic order */
        if (wb != 0) break;
        float s = 0.f;
        for (hl_u64 i = t; i < job->count[0]; i += T) s += x[i];
        s = block_sum(s, red);
        if (t == 0) out[0] = s;
        break;
    }
    case K_SOFTMAX: { /* one warp per row, over every worker's warps */
        const int lane = t & 31;
        const hl_u64 gw = (hl_u64)wb * (T / 32) + (t >> 5), GW = (hl_u64)nw * (T / 32), N = job->n;
        for (hl_u64 r = gw; r < job->m; r += GW) {
            const float *xr = x + r * N;
            float *orow = out + r * N;
            float mx = -__int_as_float(0x7f800000);
            for (hl_u64 c = lane; c < N; c += 32) mx = fmaxf(mx, xr[c]);
            for (int s = 16; s; s >>= 1) mx = fmaxf(mx, __shfl_xor_sync(HL_CP_FULL, mx, s));
            float sum = 0.f;
            for (hl_u64 c = lane; c < N; c += 32) sum += __expf(xr[c] - mx);
            for (int s = 16; s; s >>= 1) sum += __shfl_xor_sync(HL_CP_FULL, sum, s);
            for (hl_u64 c = lane; c < N; c += 32) orow[c] = __expf(xr[c] - mx) / sum;
        }
        break;
    }
    }
}

__device__ static void worker_loop(struct cp_share *sh) {
    __shared__ struct cp_job job;
    __shared__ float As[HL_CP_TILE * HL_CP_TILE], Bs[HL_CP_TILE * HL_CP_TILE];
    __shared__ float red[HL_CP_THREADS / 32];
    const int wb = blockIdx.x - 1, nw = gridDim.x - 1;
    unsigned int gen = 0;
    for (;;) {
        if (threadIdx.x == 0) {
            while (*(volatile unsigned int *)&sh->go == gen) __nanosleep(20);
            __threadfence(); /* the job was written before go */
        }
        __syncthreads();
        if (threadIdx.x < sizeof(struct cp_job) / 8)
            ((hl_u64 *)&job)[threadIdx.x] = ((const volatile hl_u64 *)&sh->job)[threadIdx.x];
        gen++;
        __syncthreads();
        if (job.run == K_STOP) return;
        cp_run(&job, wb, nw, As, Bs, red);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system(); /* this block's writes, before the front end's signal */
            atomicAdd(&sh->done, 1u);
        }
    }
}

/* --------------------------------------------------------------- front end */

/* Lane `lane` reads word `lane % 8` of slot h's 64 bytes into s[] (lanes
 * whose slot index is out of range read nothing: s stays 0, which no check
 * accepts).  The caller __syncwarp()s before reading s. */
__device__ static void slot_read(const struct hl_dom *d, hl_u64 h, hl_u64 *s, int word) {
    struct hl_fence *f = hl_fence_slot(d, h, 0);
    s[word] = f ? rd((const hl_u64 *)f + word) : 0;
}

/* A buffer slot's words s[8] (word, ctl, refs, waiters|owner, aux, parents0, -, err):
 * data address and its checked metadata into job slot i.  R_OK or R_*. */
__device__ static int buffer_from_slot(const struct hl_dom *d, const hl_u64 *dh_va, hl_u64 h, const hl_u64 *s,
                                       struct cp_job *job, int i, hl_u64 shape[HL_BUFFER_MAX_DIMS], hl_u32 *ndim,
                                       int *f32) {
    if (HL_HANDLE_KIND(h) != HL_KIND_BUFFER || !hl_ctl_matches(s[1], h)) return R_BUFFER;
    hl_u64 e = s[7], off = s[0], n = s[4];
    if (hl_buffer_extent(d, e, off, n) != HL_OK || !d->heap) return R_BUFFER;
    const struct hl_buffer_meta *m;
    int heap = HL_PLACE_HEAP(e);
    if (heap >= 0) {
        hl_u64 g = s[5]; /* the metadata block */
        if (heap >= 8 || !dh_va[heap] || g >= d->heap_granules ||
            d->heap_granules - g < (HL_BUFFER_META_SIZE + HL_GRANULE - 1) / HL_GRANULE)
            return R_BUFFER;
        job->data[i] = (char *)dh_va[heap] + off;
        m = (const struct hl_buffer_meta *)(d->heap_data + g * HL_GRANULE);
    } else {
        if (off < HL_BUFFER_META_SIZE) return R_BUFFER;
        job->data[i] = (char *)d->heap_data + off;
        m = (const struct hl_buffer_meta *)(d->heap_data + off - HL_BUFFER_META_SIZE);
    }
    /* one round trip: independent loads of the metadata */
    hl_u64 nb = m->nbytes, w1 = ((const hl_u64 *)m)[1], dt = ((const hl_u64 *)m)[2];
    hl_u64 sh[HL_BUFFER_MAX_DIMS];
#pragma unroll
    for (int k = 0; k < HL_BUFFER_MAX_DIMS; k++) sh[k] = m->shape[k];
    hl_u32 nd = (hl_u32)w1, isz = (hl_u32)(w1 >> 32);
    if (nb != n || nd > HL_BUFFER_MAX_DIMS || isz == 0) return R_SHAPE;
    hl_u64 cnt = 1;
    for (hl_u32 k = 0; k < nd; k++) {
        if (sh[k] && cnt > ~0ull / sh[k]) return R_SHAPE;
        cnt *= sh[k];
        shape[k] = sh[k];
    }
    if (cnt > n / isz || cnt * isz != n) return R_SHAPE;
    job->nbytes[i] = n;
    job->count[i] = cnt;
    *ndim = nd;
    *f32 = isz == 4 && (dt & 0xffffffffull) == 0x0034663cull; /* "<f4\0" */
    return R_OK;
}

/* The kernel's shape checks (lane 0): R_OK with job->run set, or R_*. */
__device__ static int job_check(struct cp_job *job, hl_u32 kernel, hl_u32 nscalars,
                                hl_u64 shape[HL_CP_MAX_BUFS][HL_BUFFER_MAX_DIMS], const hl_u32 *ndim, const int *f32) {
    const int nb = job->nbuf, o = nb - 1;
    if (kernel == K_COPY) {
        if (nb != 2 || job->nbytes[0] != job->nbytes[1]) return R_SHAPE;
        job->run = K_COPY;
        return R_OK;
    }
    for (int i = 0; i < nb; i++)
        if (!f32[i]) return R_DTYPE;
    switch (kernel) {
    case K_ADD:
        if (nb != 3 || job->count[1] != job->count[0] || job->count[o] != job->count[0]) return R_SHAPE;
        break;
    case K_SCALE:
        if (nb != 2 || nscalars < 1 || job->count[o] != job->count[0]) return R_SHAPE;
        break;
    case K_RELU:
        if (nb != 2 || job->count[o] != job->count[0]) return R_SHAPE;
        break;
    case K_GEMM:
        if (nb != 3 || ndim[0] != 2 || ndim[1] != 2 || ndim[2] != 2) return R_SHAPE;
        if (shape[0][1] != shape[1][0] || shape[2][0] != shape[0][0] || shape[2][1] != shape[1][1]) return R_SHAPE;
        job->m = shape[0][0];
        job->k = shape[0][1];
        job->n = shape[1][1];
        break;
    case K_SUM:
        if (nb != 2 || job->count[o] < 1) return R_SHAPE;
        break;
    case K_SOFTMAX:
        if (nb != 2 || job->count[o] != job->count[0] || ndim[0] < 1 || shape[0][ndim[0] - 1] == 0) return R_SHAPE;
        job->n = shape[0][ndim[0] - 1];
        job->m = job->count[0] / job->n;
        break;
    case K_NORMALIZE:
        if (nb != 2 || job->count[o] != job->count[0]) return R_SHAPE;
        if (nscalars < 1) job->s0 = 0.0;
        if (nscalars < 2) job->s1 = 1.0;
        break;
    default:
        return R_KERNEL;
    }
    job->run = (int)kernel;
    return R_OK;
}

struct cp_front {
    struct hl_dom d;
    struct hl_qview v;
    struct cp_entry cache[HL_CP_CACHE];
    struct hl_packet pk[2]; /* the packet to run, and the in-place candidate */
    int ent[2];             /* their cache entries, -1 = not decoded */
    hl_u64 tmp[32];         /* lane scratch */
    hl_u64 shape[HL_CP_MAX_BUFS][HL_BUFFER_MAX_DIMS];
    hl_u32 ndim[HL_CP_MAX_BUFS];
    int f32[HL_CP_MAX_BUFS];
    int rc[HL_CP_MAX_BUFS];
    int res;
};

/* Decode packet pk's argument block into the cache (the whole warp; every
 * lane gets the same result): R_OK or R_*.  *entry is always set; on failure
 * the entry's nfollow and follow-ups are valid when the block's header was
 * (so that the caller can fail them), and the entry is not kept. */
__device__ static int decode_warp(struct cp_front *F, const hl_u64 *dh_va, const struct hl_packet *pk, int *entry,
                                  int avoid) {
    const int lane = threadIdx.x;
    const struct hl_dom *d = &F->d;
    hl_u64 ah = pk->args;
    int slot = (int)((HL_HANDLE_INDEX(ah) ^ (HL_HANDLE_GEN(ah) << 3)) & (HL_CP_CACHE - 1));
    if (slot == avoid) slot = (slot + 1) & (HL_CP_CACHE - 1);
    struct cp_entry *E = &F->cache[slot];
    /* a hit: the block's words and its buffers' ctl words, re-read in one round trip and compared */
    if (E->args == ah && ah && E->kernel == pk->kernel) {
        hl_u64 c = 0;
        if (lane == 0) {
            struct hl_fence *f = hl_fence_slot(d, ah, HL_KIND_BUFFER);
            c = f ? rd(&f->ctl) : 0;
        } else if (lane <= (int)E->nbuf) {
            struct hl_fence *f = hl_fence_slot(d, E->bh[lane - 1], HL_KIND_BUFFER);
            c = f ? rd(&f->ctl) : 0;
        }
        int same = lane == 0 ? hl_ctl_matches(c, ah) : (lane <= (int)E->nbuf ? hl_ctl_matches(c, E->bh[lane - 1]) : 1);
        for (hl_u32 i = lane; i < E->nw; i += 32) same &= rd(E->src + i) == E->aw[i];
        if (__all_sync(HL_CP_FULL, same)) {
            *entry = slot;
            return R_OK;
        }
    }
    __syncwarp();
    *entry = slot;
    if (lane == 0) {
        E->args = 0;
        E->nfollow = 0;
    }
    /* a miss: the block's slot, its words, its buffers' slots and metadata */
    if (lane < 8) slot_read(d, ah, F->tmp, lane);
    __syncwarp();
    if (lane == 0) {
        const hl_u64 *s = F->tmp;
        int r = R_ARGS;
        if (HL_HANDLE_KIND(ah) == HL_KIND_BUFFER && hl_ctl_matches(s[1], ah) && HL_PLACE_HEAP(s[7]) < 0 &&
            hl_buffer_extent(d, s[7], s[0], s[4]) == HL_OK && s[4] >= 16 && s[4] % 8 == 0 &&
            s[4] / 8 <= HL_CP_ARGS_WORDS) {
            E->src = (const hl_u64 *)(d->heap_data + s[0]);
            E->nw = (hl_u32)(s[4] / 8);
            r = R_OK;
        }
        F->res = r;
    }
    __syncwarp();
    if (F->res) return F->res;
    for (hl_u32 i = lane; i < E->nw; i += 32) E->aw[i] = rd(E->src + i);
    __syncwarp();
    if (lane == 0) {
        struct hl_kernarg ka;
        const hl_u64 *a = E->aw;
        ka.magic = (hl_u32)a[0];
        ka.nbuffers = (hl_u16)(a[0] >> 32);
        ka.nscalars = (hl_u16)(a[0] >> 48);
        ka.nfollow = (hl_u16)a[1];
        hl_u64 left = E->nw - 2, nf9 = (hl_u64)ka.nfollow * (sizeof(struct hl_follow) / 8);
        int r = R_OK;
        if (ka.magic != HL_KERNARG_MAGIC || ka.nbuffers > left) r = R_ARGS;
        else if ((left -= ka.nbuffers, ka.nscalars > left)) r = R_ARGS;
        else if ((left -= ka.nscalars, nf9 > left)) r = R_ARGS;
        else if (ka.nbuffers < 1 || ka.nbuffers > HL_CP_MAX_BUFS) r = R_ARGS;
        if (r == R_OK) {
            E->nbuf = ka.nbuffers;
            E->nfollow = ka.nfollow;
            E->fo = 2 + ka.nbuffers + ka.nscalars;
            for (int i = 0; i < ka.nbuffers; i++) E->bh[i] = a[2 + i];
            E->job.nbuf = ka.nbuffers;
            E->job.run = K_NONE;
            E->job.s0 = __longlong_as_double((long long)(ka.nscalars > 0 ? a[2 + ka.nbuffers] : 0));
            E->job.s1 = __longlong_as_double((long long)(ka.nscalars > 1 ? a[3 + ka.nbuffers] : 0));
            F->tmp[31] = ka.nscalars;
        }
        F->res = r;
    }
    __syncwarp();
    if (F->res) return F->res;
    /* lanes 8b..8b+7 read buffer b's slot; then lane b checks it and reads its metadata */
    __shared__ hl_u64 bs[HL_CP_MAX_BUFS][8];
    if (lane < 8 * (int)E->nbuf) slot_read(d, E->bh[lane >> 3], bs[lane >> 3], lane & 7);
    __syncwarp();
    if (lane < (int)E->nbuf)
        F->rc[lane] = buffer_from_slot(d, dh_va, E->bh[lane], bs[lane], &E->job, lane, F->shape[lane], &F->ndim[lane],
                                       &F->f32[lane]);
    __syncwarp();
    if (lane == 0) {
        int r = R_OK;
        for (hl_u32 i = 0; i < E->nbuf && r == R_OK; i++) r = F->rc[i];
        if (r == R_OK) r = job_check(&E->job, pk->kernel, (hl_u32)F->tmp[31], F->shape, F->ndim, F->f32);
        if (r == R_OK) {
            E->args = ah;
            E->kernel = pk->kernel;
        }
        F->res = r;
    }
    __syncwarp();
    return F->res;
}

/* Wait for input h (value v for a timeline): 0 (succeeded), its failure status, or -1 (stop). */
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
        if ((n & 1023) == 1023 && *vol(&ctl->stop)) return -1;
        __nanosleep(32);
    }
    __threadfence_system(); /* the producer's data before our reads */
    return 0;
}

/* Signal h with `status` (timeline: `value` on success).  pre: the slot's
 * ctl and word, read while the packet ran (0, 0: read them now).  Returns 1
 * when h is known to hold success (at `value` or later for a timeline). */
__device__ static int cp_signal(const struct hl_dom *d, hl_u64 h, hl_u64 value, hl_u32 status, hl_u64 pre_ctl,
                                 hl_u64 pre_word) {
    struct hl_fence *f = hl_fence_slot(d, h, 0);
    if (!h || !f) return 0;
    if (!pre_ctl) {
        pre_ctl = rd(&f->ctl);
        pre_word = rd(&f->word);
    }
    if (!hl_ctl_matches(pre_ctl, h)) return 0;
    __threadfence_system();
    if (HL_HANDLE_KIND(h) == HL_KIND_TIMELINE) {
        if (status != HL_STATUS_SUCCESS) {
            hl_timeline_fail(f, status, 0);
            return 0;
        }
        hl_u64 cur = pre_word;
        if (value > HL_TIMELINE_MAX) return 0;
        while (!(cur & HL_TIMELINE_FAILED) && value > cur && !hl_cas64(&f->word, &cur, value)) {
        }
        return !(cur & HL_TIMELINE_FAILED);
    }
    if (HL_HANDLE_KIND(h) == HL_KIND_FENCE && hl_status_valid(status)) {
        hl_u64 expected = 0;
        return hl_cas64(&f->word, &expected, (hl_u64)status) ? status == HL_STATUS_SUCCESS
                                                             : expected == HL_STATUS_SUCCESS;
    }
    return 0;
}

/* Queues pushed into: their validated views, kept while their slot's ctl
 * says the same live queue (one read instead of hl_queue_open's). */
#define HL_CP_QCACHE 4
struct cp_qcache {
    hl_u64 handle[HL_CP_QCACHE];
    struct hl_qview v[HL_CP_QCACHE];
};

/* Push p into queue q (lane 0): hl_queue_push, retried while full (bounded). */
__device__ static int cp_push(const struct hl_dom *d, struct cp_qcache *qc, hl_u64 q, const struct hl_packet *p) {
    int i = (int)(HL_HANDLE_INDEX(q) & (HL_CP_QCACHE - 1)), pr;
    struct hl_fence *f = hl_fence_slot(d, q, HL_KIND_QUEUE);
    if (!f) return HL_E_HANDLE;
    if (qc->handle[i] != q || !hl_ctl_matches(rd(&f->ctl), q)) {
        qc->handle[i] = 0;
        if ((pr = hl_queue_open(d, q, &qc->v[i])) != HL_OK) return pr;
        qc->handle[i] = q;
    }
    pr = HL_E_FULL;
    for (long s = 0; s < (1L << 22) && pr == HL_E_FULL; s++) pr = hl_queue_push(&qc->v[i], p, HL_PRODUCER_DEVICE, 0);
    return pr;
}

__device__ static void front_end(char *base, unsigned long long size, hl_u64 qh, const hl_u64 *dh_va,
                                 struct hl_cp_ctl *ctl, struct cp_share *sh) {
    __shared__ struct cp_front F;
    __shared__ struct cp_qcache QC;
    const int lane = threadIdx.x;
    const unsigned int nworkers = gridDim.x - 1;
    unsigned int gen = 0;
    /* counters kept here and written out (a read-modify-write of host memory is a round trip) */
    hl_u64 r = 0, completed = 0, npk = 0, nfail = 0, ninplace = 0, beats = 0, handoff = 0, handoff_from = 0;
    hl_u64 last_sig = 0, last_val = 0;
    int cur = 0, have = 0;
    if (lane == 0) {
        F.res = hl_attach(&F.d, base, size) != HL_OK || hl_queue_open(&F.d, qh, &F.v) != HL_OK;
        for (int i = 0; i < HL_CP_CACHE; i++) F.cache[i].args = 0;
        for (int i = 0; i < HL_CP_QCACHE; i++) QC.handle[i] = 0;
    }
    __syncwarp();
    int ok = !F.res;
    if (ok) {
        r = rd(&F.v.q->read_index);
        completed = rd(&F.v.q->completed);
        if (lane == 0) *vol(&ctl->state) = 1;
    } else if (lane == 0) {
        *vol(&ctl->state) = 3;
    }
    const hl_u64 mask = ok ? F.v.capacity - 1 : 0;
    while (ok) {
        struct hl_packet *P = &F.pk[cur];
        if (!have) {
            /* take the packet at the read index */
            int got = -1;
            if (lane == 0) {
                for (unsigned long long spins = 0;; spins++) {
                    hl_u64 cl = rd(&F.v.cells[r & mask]);
                    hl_u32 st = HL_CELL_STATE(cl);
                    if (HL_CELL_SEQ(cl) == (r & 0xffffffffffffull) && (st == HL_CELL_READY || st == HL_CELL_SKIP)) {
                        got = st == HL_CELL_READY;
                        break;
                    }
                    if ((spins % HL_CP_STOP_POLL) == HL_CP_STOP_POLL - 1) {
                        *vol(&ctl->heartbeat) = ++beats;
                        if (*vol(&ctl->stop)) break;
                    }
                    __nanosleep(32);
                }
                __threadfence_system(); /* the cell before the packet's bytes */
            }
            got = __shfl_sync(HL_CP_FULL, got, 0);
            if (got < 0) break; /* stop */
            if (got == 1 && lane < 8) ((hl_u64 *)P)[lane] = rd((const hl_u64 *)&F.v.packets[r & mask] + lane);
            __syncwarp(); /* the packet is in shared memory: its loads completed */
            if (lane == 0) {
                *vol(&F.v.cells[r & mask]) = HL_CELL(r + F.v.capacity, 0, HL_CELL_FREE);
                *vol(&F.v.q->read_index) = r + 1;
            }
            r++;
            if (got == 0) continue; /* a SKIP */
            F.ent[cur] = -1;
            handoff_from = 0;
        }
        have = 0;
        hl_u32 status = HL_STATUS_SUCCESS, reason = R_OK;
        int leave = P->type == HL_PKT_STOP;
        /* inputs (our own last successful signal is known without a read) */
        if (lane == 0) {
            *vol(&ctl->packets) = ++npk;
            for (int i = 0; i < 2 && status == HL_STATUS_SUCCESS; i++) {
                hl_u64 h = P->wait[i];
                if (!h) continue;
                if (h == last_sig && (HL_HANDLE_KIND(h) == HL_KIND_FENCE || P->wait_value[i] <= last_val)) continue;
                hl_i64 w = cp_wait(&F.d, h, P->wait_value[i], ctl);
                if (w < 0) {
                    status = HL_STATUS_CANCEL;
                    leave = 1;
                } else if (w) {
                    status = (hl_u32)w;
                    reason = R_INPUT;
                }
            }
            if (status == HL_STATUS_SUCCESS && P->type != HL_PKT_KERNEL && P->type != HL_PKT_BARRIER &&
                P->type != HL_PKT_STOP) {
                status = HL_STATUS_ERROR;
                reason = R_KERNEL;
            }
        }
        status = __shfl_sync(HL_CP_FULL, status, 0);
        reason = __shfl_sync(HL_CP_FULL, reason, 0);
        leave = __shfl_sync(HL_CP_FULL, leave, 0);
        /* decode (also after a failed input: its follow-ups are failed below) */
        int e = F.ent[cur];
        if (P->type == HL_PKT_KERNEL && e < 0) {
            int rr = decode_warp(&F, dh_va, P, &e, -1);
            if (rr && status == HL_STATUS_SUCCESS) {
                status = HL_STATUS_ERROR;
                reason = (hl_u32)rr;
            }
        }
        const struct cp_entry *Ef = P->type == HL_PKT_KERNEL ? &F.cache[e] : 0; /* its follow-ups */
        const struct cp_entry *E = status == HL_STATUS_SUCCESS ? Ef : 0;          /* its job */
        hl_u64 pre_ctl = 0, pre_word = 0, t_join = 0;
        if (E) {
            /* fork */
            if (lane == 0) {
                sh->job = E->job;
                __threadfence();
                atomicAdd(&sh->go, 1u);
                if (handoff_from) {
                    handoff += gtimer() - handoff_from;
                    *vol(&ctl->handoff_ns) = handoff;
                }
            }
            gen++;
            /* while the workers run: the signal's slot, and the follow-up for this queue decoded */
            if (lane == 0 && P->signal) {
                struct hl_fence *f = hl_fence_slot(&F.d, P->signal, 0);
                if (f) {
                    pre_ctl = rd(&f->ctl);
                    pre_word = rd(&f->word);
                }
            }
            int nxt = cur ^ 1;
            F.ent[nxt] = -1;
            for (hl_u32 i = 0; i < E->nfollow; i++) {
                const hl_u64 *fw = E->aw + E->fo + i * (sizeof(struct hl_follow) / 8);
                if (fw[0] != qh) continue;
                if (lane < 8) ((hl_u64 *)&F.pk[nxt])[lane] = fw[1 + lane];
                __syncwarp();
                if (F.pk[nxt].type == HL_PKT_KERNEL) {
                    int e2 = -1;
                    if (decode_warp(&F, dh_va, &F.pk[nxt], &e2, e) == R_OK) F.ent[nxt] = e2;
                }
                break;
            }
            /* join */
            if (lane == 0) {
                const unsigned int target = gen * nworkers;
                while ((int)(*(volatile unsigned int *)&sh->done - target) < 0) {
                }
                t_join = gtimer();
            }
            __syncwarp();
        }
        /* signal, then the follow-ups: the first for this queue runs in place when the queue is empty */
        if (lane == 0) {
            __threadfence_system(); /* the workers' writes before the signal */
            int known = cp_signal(&F.d, P->signal, P->signal_value, status, pre_ctl, pre_word);
            last_sig = known ? P->signal : 0;
            last_val = P->signal_value;
            if (status != HL_STATUS_SUCCESS) {
                *vol(&ctl->failed) = ++nfail;
                *vol(&ctl->last_error) = (npk << 16) | reason;
            }
            int inplace_done = 0;
            for (hl_u32 i = 0; Ef && i < Ef->nfollow; i++) {
                struct hl_follow f;
                const hl_u64 *fw = Ef->aw + Ef->fo + i * (sizeof(struct hl_follow) / 8);
                for (int k = 0; k < 9; k++) ((hl_u64 *)&f)[k] = fw[k];
                if (status != HL_STATUS_SUCCESS) {
                    cp_signal(&F.d, f.packet.signal, f.packet.signal_value, status, 0, 0);
                    continue;
                }
                if (f.queue == qh && !inplace_done && !leave) {
                    /* empty: nothing published or reserved at the read index (one round trip for both) */
                    hl_u64 w = rd(&F.v.q->write_index), c = rd(&F.v.cells[r & mask]);
                    if (w == r && c == HL_CELL(r, 0, HL_CELL_FREE)) {
                        inplace_done = 1;
                        have = 1;
                        *vol(&ctl->inplace) = ++ninplace;
                        continue;
                    }
                }
                if (cp_push(&F.d, &QC, f.queue, &f.packet) != HL_OK)
                    cp_signal(&F.d, f.packet.signal, f.packet.signal_value, HL_STATUS_ERROR, 0, 0);
            }
            *vol(&F.v.q->completed) = ++completed;
        }
        have = __shfl_sync(HL_CP_FULL, have, 0);
        if (have) {
            cur ^= 1;
            handoff_from = t_join;
        }
        __syncwarp();
        if (leave) break;
    }
    if (lane == 0) {
        sh->job.run = K_STOP;
        __threadfence();
        atomicAdd(&sh->go, 1u);
        *vol(&ctl->state) = ok ? 2 : 3;
    }
}

extern "C" __global__ void __launch_bounds__(HL_CP_THREADS)
hl_cp_main(char *base, unsigned long long size, unsigned long long qhandle, const unsigned long long *dh_va,
           struct hl_cp_ctl *ctl, struct cp_share *sh) {
    if (blockIdx.x > 0) {
        worker_loop(sh);
    } else if (threadIdx.x < 32) {
        front_end(base, size, qhandle, (const hl_u64 *)dh_va, ctl, sh);
    }
}
