/*
 * gpucp.cu -- the GPU command processor: a resident kernel that consumes a
 * hostless queue with no host in the loop (compiled with NVRTC by
 * hostless.agents.gpucp, from this file and hostless.h).
 *
 * Grid: block 0 is the front end (warp 0 takes and decodes packets; its
 * other warps join it to run small jobs); blocks 1..W are the workers,
 * HL_CP_THREADS threads each, that run the larger jobs.  The host
 * launches it on a green context's SM partition when the driver has them,
 * else as a bounded grid next to other work (hostless.agents.gpucp).
 *
 * The front end takes the packet at the queue's read index when its cell is
 * READY (SKIP cells are consumed), waits for the packet's inputs (fences:
 * word != 0; timelines: word >= value or failed), decodes its argument block
 * and buffers (host heap or device heap; every handle checked against the
 * private view: tag, index, kind, generation, extents by subtraction), and
 * checks the kernel's shapes.  A small job it runs with block 0's other
 * warps; a larger one it hands to the workers through device memory (struct
 * cp_share: a generation word they poll) and waits for all of them to
 * finish.  Then it signals the packet's fence or timeline (a system-scope
 * CAS after a fence: GPU scope when the output is device memory, which is
 * coherent at the L2 that copy engines and peers read through, system scope
 * when it is host memory; a waiter that sees the signal sees the data) and
 * pushes the follow-up packets (direct dispatch, GPU -> GPU or GPU -> CPU
 * agent).
 *
 * The bus is the cost: every read of host memory is a round trip over PCIe
 * (~1 us), and the front end is built to make few of them, each one wide:
 * - it reads with the whole warp: a 64-byte slot, a packet or an argument
 *   block is one round trip, a lane per word;
 * - it keeps decoded argument blocks (HL_CP_CACHE: a directory in shared
 *   memory, the words and the decoded job in device memory); a hit re-reads
 *   the block and its buffers' ctl words in one round trip and compares;
 * - the reads a packet needs besides (its inputs' words, its signal's slot,
 *   the first other queue's slot) ride along in that round trip;
 * - a small job (job_local) runs on block 0 itself, no fork to the workers;
 * - a follow-up for its own queue runs in place, without the ring, when the
 *   queue is empty at that moment (the push and the pop it stands for would
 *   be adjacent, so nobody can tell but the statistics); its cache entry is
 *   checked, and its side reads made, in the round trip that carries its
 *   parent's signal;
 * - that round trip's atomics (the signal's CAS; the reserve of the first
 *   other queue's cell, hl_queue_reserve hinted with the index after this
 *   processor's last push there) are made by block 0's warps 1 and 2, since
 *   one warp's atomic waits for that warp's earlier loads; the reserved
 *   follow-up is published after the signal.
 *
 * ERT packets (HL_PKT_ERT) run as the emulated NPU runs them (core/agent.c):
 * the block's first buffer is an XRT command; START_CU / START_NPU run the
 * kernel whose id is the CU their cu_mask names, on the buffers and scalars
 * in the command, with the state written back into its header word
 * (RUNNING, COMPLETED or ERROR).  CMD_CHAIN and the other opcodes fail.
 *
 * Failure passes through: an input that failed, a bad packet (unknown kernel,
 * a handle that names no live buffer, a shape that does not fit, an
 * argument block over HL_CP_ARGS_WORDS words) fails the packet's signal with
 * the input's status or ERROR, runs nothing, pushes no follow-up and fails
 * the follow-ups' signals instead (and those nested in their blocks,
 * HL_CP_FAIL_DEPTH deep, HL_CP_FAIL_BUDGET signals), so downstream waiters
 * are released.  The CPU agents' bad-packet rule (hle_agent_run's contract in include/hostless/hostless_engine.h, core/agent.c),
 * with the checks shared through hostless_ops.h: before anything waits or
 * runs, the signal must be a live fence or timeline (kind, and generation
 * against its slot's ctl from the side reads) with a point below 2**62, each
 * input a fence, merged fence or timeline with such a point
 * (hl_signal_kind_ok, hl_wait_kind_ok, hl_point_ok); an input's final word
 * that is not a status fails the packet with ERROR (hl_input_status).  A
 * follow-up into a queue that stays full waits until a deadline shared by the
 * packet's follow-ups (HL_CP_PUSH_NS), one into our own queue never waits
 * (only we free its cells), and a chain through our own queue (in place or
 * through the ring) is cut after HL_CP_HOP_LIMIT hops; a follow-up that
 * cannot be pushed fails its signal (and its nested ones) with ERROR.  A
 * write to a slot is a CAS that checks the slot's ctl in the same step (a
 * 16-byte CAS over {word, ctl}, write rule (c)) where the device has one
 * (HL_CP_CAS128).  The
 * loop ends on a STOP packet or when the host sets ctl->stop; a host process
 * that dies takes its CUDA context and this kernel with it (the domain's
 * recovery marks its fences OWNER_DIED).
 *
 * Holding: the device takes no references.  Like every device signaler (see
 * hostless_ops.h), it relies on the producer holding the packet's objects,
 * and those of its follow-ups, until they complete, which a Graph does for
 * its lifetime.  A slot's words are read at once and each is bounds-checked,
 * so a slot changing under the read yields at worst a wrong extent inside
 * the heap, which only such a holding violation can cause.  A producer may
 * rewrite an argument block between uses (a hit compares every word: the
 * header, buffers, scalars and follow-up queues must match, the follow-up
 * packets are refreshed), not while its packet is in flight: a follow-up's
 * block is read in the round trip after its parent's job.
 */
#include "hostless.h"
#include "hostless_gpucp.h" /* the control block, the job and its cache: shared with the host */

#define HL_CP_FW 36          /* follow-up words kept in shared memory (4 follow-ups) */
#define HL_CP_STOP_POLL 4096
#define HL_CP_FULL 0xffffffffu
#define HL_CP_TILE 64        /* gemm: 64x64 output tiles, */
#define HL_CP_KSTEP 32       /* 32-deep k steps */
#define HL_CP_UNROLL 8       /* elementwise: loads in flight a thread */
#define HL_CP_QCACHE 4       /* queues pushed into, kept validated */
#define HL_FOLLOW_WORDS 9    /* sizeof(struct hl_follow) / 8 */
#define HL_CP_ERT_WORDS 32   /* an ERT command of at most 256 bytes */
#define HL_CP_HOP_LIMIT 64   /* as hostless_engine.h's HLE_AGENT_HOP_LIMIT: own-queue chains cut after it */
#define HL_CP_FAIL_DEPTH 16  /* HLE_AGENT_FAIL_DEPTH: nested follow-ups failed this deep */
#define HL_CP_FAIL_BUDGET 256 /* HLE_AGENT_FAIL_BUDGET: and this many signals a packet */
#define HL_CP_HOPS 256       /* remembered hop counts of our pushes into our own queue */
#define HL_CP_PUSH_NS 1000000000ull /* a packet's follow-ups wait for a full queue this long, in all */

/* A slot's completion word is written by a 16-byte CAS over {word, ctl} (write rule (c): only while
 * the slot is still the object the caller matched) where the device and compiler have one (sm_90,
 * CUDA 12.4); -DHL_CP_CAS128=0 makes it a CAS of the word after the match (hostless.agents.gpucp
 * passes it when HL_CP_CAS128=0 is in the environment). */
#ifndef HL_CP_CAS128
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDACC_VER_MAJOR__) && \
    (__CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4))
#define HL_CP_CAS128 1
#else
#define HL_CP_CAS128 0
#endif
#endif
#ifndef HL_CP_SIGNAL_CAS128 /* the same for a packet's signal after its job (the hot path) */
#define HL_CP_SIGNAL_CAS128 HL_CP_CAS128
#endif

/* the failure reasons (HL_CP_R_*) and kernel ids (HL_K_*, hostless_kernels.h) under short names */
enum { R_OK = HL_CP_R_OK, R_INPUT = HL_CP_R_INPUT, R_KERNEL = HL_CP_R_KERNEL, R_ARGS = HL_CP_R_ARGS,
       R_BUFFER = HL_CP_R_BUFFER, R_SHAPE = HL_CP_R_SHAPE, R_DTYPE = HL_CP_R_DTYPE, R_HANDLE = HL_CP_R_HANDLE };
enum { K_STOP = -1, K_NONE = 0, K_COPY = HL_K_COPY, K_ADD = HL_K_ADD, K_SCALE = HL_K_SCALE, K_RELU = HL_K_RELU,
       K_GEMM = HL_K_GEMM, K_SUM = HL_K_SUM, K_SOFTMAX = HL_K_SOFTMAX, K_NORMALIZE = HL_K_NORMALIZE };

/* shared memory: a cache entry's directory */
struct cp_dir {
    hl_u64 args;               /* the block's handle, 0 = empty */
    const hl_u64 *src;         /* its words in the host heap */
    hl_u64 bh[HL_CP_MAX_BUFS]; /* its buffer handles */
    hl_u64 q0;                 /* the first follow-up's queue that is not ours, 0 = none */
    hl_u32 kernel;             /* the packet's kernel id it was decoded for */
    hl_u32 nw, nbuf, nfollow, fo; /* words; buffers; follow-ups, from word fo */
    hl_u32 local;              /* job_local */
    hl_u32 self;               /* 1 + the index of the first follow-up for our queue, 0 = none */
    hl_u32 out_host;           /* its output is in host memory (its signal needs a system fence) */
    hl_u32 ert_hdr;            /* an ERT command's header word as read */
    hl_u32 *ert;               /* an ERT packet's command (its state is written back), else 0 */
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

/* Block wb of nw: its share of the job (every thread of the block: a worker
 * block, or block 0 with its front-end warp for a local job). */
__device__ __noinline__ static void cp_run(const struct cp_job *job, int wb, int nw, float *As, float *Bs, float *red) {
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
    case K_ADD:
    case K_SCALE:
    case K_RELU:
    case K_NORMALIZE: {
        /* HL_CP_UNROLL loads in flight a thread: in host memory each load is a bus round trip,
         * issued together they cost about one */
        const float *y = job->run == K_ADD ? (const float *)job->data[1] : x;
        const float s0 = (float)job->s0, inv = job->run == K_NORMALIZE ? (float)(1.0 / job->s1) : 0.f;
        for (hl_u64 base = gt; base < n; base += GT * HL_CP_UNROLL) {
            float a[HL_CP_UNROLL], b[HL_CP_UNROLL];
#pragma unroll
            for (int u = 0; u < HL_CP_UNROLL; u++) {
                hl_u64 i = base + u * GT;
                a[u] = i < n ? x[i] : 0.f;
                b[u] = i < n && job->run == K_ADD ? y[i] : 0.f;
            }
#pragma unroll
            for (int u = 0; u < HL_CP_UNROLL; u++) {
                hl_u64 i = base + u * GT;
                float v = job->run == K_ADD ? a[u] + b[u]
                          : job->run == K_SCALE ? a[u] * s0
                          : job->run == K_RELU ? fmaxf(a[u], 0.f)
                                               : (a[u] - s0) * inv;
                if (i < n) out[i] = v;
            }
        }
        break;
    }
    case K_GEMM: { /* 64x64 output tiles over the blocks, 4x4 outputs a thread, 32-deep k steps */
        const float *w = (const float *)job->data[1];
        const hl_u64 M = job->m, K = job->k, N = job->n, S = HL_CP_TILE, KS = HL_CP_KSTEP;
        const hl_u64 tm = (M + S - 1) / S, tn = (N + S - 1) / S;
        const int ty = t >> 4, tx = t & 15;
        for (hl_u64 tile = wb; tile < tm * tn; tile += nw) {
            const hl_u64 bi = (tile / tn) * S, bj = (tile % tn) * S;
            float acc[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = 0.f;
            for (hl_u64 kk = 0; kk < K; kk += KS) {
#pragma unroll
                for (int e = t; e < (int)(S * KS); e += T) {
                    int r = e / (int)KS, c = e % (int)KS; /* A: row r, column c of the tile; kept transposed */
                    As[c * S + r] = (bi + r < M && kk + c < K) ? x[(bi + r) * K + kk + c] : 0.f;
                    int r2 = e / (int)S, c2 = e % (int)S; /* B: row r2, column c2 */
                    Bs[r2 * S + c2] = (kk + r2 < K && bj + c2 < N) ? w[(kk + r2) * N + bj + c2] : 0.f;
                }
                __syncthreads();
#pragma unroll 8
                for (int q = 0; q < (int)KS; q++) {
                    float av[4], bv[4];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        av[i] = As[q * S + ty * 4 + i];
                        bv[i] = Bs[q * S + tx * 4 + i];
                    }
#pragma unroll
                    for (int i = 0; i < 4; i++)
#pragma unroll
                        for (int j = 0; j < 4; j++) acc[i][j] += av[i] * bv[j];
                }
                __syncthreads();
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    hl_u64 r = bi + ty * 4 + i, c = bj + tx * 4 + j;
                    if (r < M && c < N) out[r * N + c] = acc[i][j];
                }
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
    case K_SOFTMAX: { /* one warp per row, over every block's warps */
        const int lane = t & 31;
        const hl_u64 gw = (hl_u64)wb * (T / 32) + (t >> 5), GW = (hl_u64)nw * (T / 32), N = job->n, M = job->m;
        if (N <= 256) { /* rows of up to 256 in registers, 4 rows at a time: their loads in flight together */
            for (hl_u64 r0 = gw; r0 < M; r0 += GW * 4) {
                float v[4][8];
#pragma unroll
                for (int q = 0; q < 4; q++)
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        hl_u64 r = r0 + q * GW, col = lane + 32 * c;
                        v[q][c] = r < M && col < N ? x[r * N + col] : -__int_as_float(0x7f800000);
                    }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    hl_u64 r = r0 + q * GW;
                    float mx = v[q][0];
#pragma unroll
                    for (int c = 1; c < 8; c++) mx = fmaxf(mx, v[q][c]);
                    for (int s = 16; s; s >>= 1) mx = fmaxf(mx, __shfl_xor_sync(HL_CP_FULL, mx, s));
                    float sum = 0.f;
#pragma unroll
                    for (int c = 0; c < 8; c++) {
                        v[q][c] = lane + 32 * c < N ? __expf(v[q][c] - mx) : 0.f;
                        sum += v[q][c];
                    }
                    for (int s = 16; s; s >>= 1) sum += __shfl_xor_sync(HL_CP_FULL, sum, s);
#pragma unroll
                    for (int c = 0; c < 8; c++)
                        if (r < M && lane + 32 * c < N) out[r * N + lane + 32 * c] = v[q][c] / sum;
                }
            }
            break;
        }
        for (hl_u64 r = gw; r < M; r += GW) {
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

__device__ static void worker_loop(struct cp_share *sh, struct cp_job *job, float *As, float *Bs, float *red) {
    const int wb = blockIdx.x - 1, nw = gridDim.x - 1;
    unsigned int gen = 0;
    for (;;) {
        if (threadIdx.x == 0) {
            while (*(volatile unsigned int *)&sh->go == gen) __nanosleep(20);
            __threadfence(); /* the job was written before go */
        }
        __syncthreads();
        if (threadIdx.x < HL_CP_JOB_WORDS)
            ((hl_u64 *)job)[threadIdx.x] = ((const volatile hl_u64 *)&sh->job)[threadIdx.x];
        gen++;
        __syncthreads();
        if (job->run == K_STOP) return;
        cp_run(job, wb, nw, As, Bs, red);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system(); /* this block's writes, before the front end's signal */
            atomicAdd(&sh->done, 1u);
        }
    }
}

/* Block 0's barriers between its front-end warp and its other warps (named
 * barriers: the two sides reach them from different code) */
__device__ static void bar_a(void) { asm volatile("bar.sync 1;" ::: "memory"); }
__device__ static void bar_b(void) { asm volatile("bar.sync 2;" ::: "memory"); }
/* warps 0, 1 and 2: the side operations of the round trip after a job (see cp_sideop) */
__device__ static void bar_c(void) { asm volatile("bar.sync 3, 96;" ::: "memory"); }
__device__ static void bar_d(void) { asm volatile("bar.sync 4, 96;" ::: "memory"); }

struct cp_front;
struct cp_qcache;
struct cp_sideop;
__device__ static void sideop_run(struct cp_front *F, struct cp_qcache *QC, struct cp_sideop *SO, int warp);

/* Block 0's warps 1..7, once per packet: the local job the front end hands them in *job (K_NONE:
 * none), then warps 1 and 2 make the round trip's side operations. */
__device__ static void helper_loop(struct cp_job *job, float *As, float *Bs, float *red, struct cp_front *F,
                                   struct cp_qcache *QC, struct cp_sideop *SO) {
    const int warp = threadIdx.x >> 5;
    for (;;) {
        bar_a(); /* a job, none, or the stop is in *job */
        if (job->run == K_STOP) return;
        if (job->run != K_NONE) cp_run(job, 0, 1, As, Bs, red);
        bar_b(); /* done */
        if (warp == 1 || warp == 2) {
            bar_c(); /* the side operations are posted */
            if ((threadIdx.x & 31) == 0) sideop_run(F, QC, SO, warp);
            __syncwarp();
            bar_d(); /* and made */
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

/* The data of host buffer h from its slot's words s[8] (see below), or 0 when s is not that live
 * buffer in the host heap (kind, generation, placement, extent: hl_ctl_matches, hl_buffer_extent). */
__device__ static char *host_block(const struct hl_dom *d, hl_u64 h, const hl_u64 *s) {
    if (HL_HANDLE_KIND(h) != HL_KIND_BUFFER || !hl_ctl_matches(s[1], h) || HL_PLACE_HEAP(s[7]) >= 0 ||
        hl_buffer_extent(d, s[7], s[0], s[4]) != HL_OK)
        return 0;
    return (char *)d->heap_data + s[0];
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
        if (job->s1 == 0.0) return R_ARGS; /* std zero (or -0): as the CPU kernels refuse it */
        break;
    default:
        return R_KERNEL;
    }
    job->run = (int)kernel;
    return R_OK;
}

/* A job small enough that block 0 runs it itself: a fork to the worker
 * blocks and the join cost more than the work (a few microseconds). */
__device__ static int job_local(const struct cp_job *job) {
    const hl_u64 n = job->count[job->nbuf - 1];
    switch (job->run) {
    case K_COPY:
        return job->nbytes[1] <= (64u << 10);
    case K_GEMM:
        return job->m * job->n <= 64 * 64 && job->k <= 256;
    case K_SUM:
        return 1; /* one block runs it in any case */
    default:
        return n <= 16384;
    }
}

struct cp_front {
    struct hl_dom d;
    struct hl_qview v;
    hl_u64 qh;                    /* our queue's handle */
    struct cp_dir dir[HL_CP_CACHE];
    struct hl_packet pk[2];       /* the packet to run, and its in-place follow-up */
    int ent[2];                   /* their cache entries, -1 = not decoded */
    hl_u64 fw[2][HL_CP_FW];       /* their first follow-ups' words */
    hl_u64 side[2][8];            /* their side reads' results (see side_addrs) */
    const hl_u64 *sda[8];         /* the side reads' addresses, for the round being prepared */
    hl_u64 tmp[32];               /* lane scratch */
    hl_u64 ew[HL_CP_ERT_WORDS];   /* an ERT command's words */
    hl_u64 bs[HL_CP_MAX_BUFS][8]; /* buffer slots */
    hl_u64 shape[HL_CP_MAX_BUFS][HL_BUFFER_MAX_DIMS];
    hl_u32 ndim[HL_CP_MAX_BUFS];
    int f32[HL_CP_MAX_BUFS];
    int rc[HL_CP_MAX_BUFS];
    int res;
};

/* The cache entry of argument block ah (direct-mapped; `avoid`, an entry in use, is skipped). */
__device__ static int cache_slot(hl_u64 ah, int avoid) {
    int s = (int)((HL_HANDLE_INDEX(ah) ^ ((hl_i64)HL_HANDLE_GEN(ah) << 5)) & (HL_CP_CACHE - 1));
    return s == avoid ? (s + 1) & (HL_CP_CACHE - 1) : s;
}

/* Lane 0: the side reads of packet pk into F->sda: its inputs' ctl and word
 * (0, 1; 2, 3) except `skip` (its parent's signal, settled by the parent),
 * its signal's ctl and word (4, 5), and the ctl of the first other queue of
 * its follow-ups as cache entry e last saw it (6).  Lanes 24..30 read them. */
__device__ static void side_addrs(struct cp_front *F, const struct hl_packet *pk, hl_u64 skip, int e) {
    for (int i = 0; i < 8; i++) F->sda[i] = 0;
    for (int i = 0; i < 2; i++) {
        struct hl_fence *f = pk->wait[i] && pk->wait[i] != skip ? hl_fence_slot(&F->d, pk->wait[i], 0) : 0;
        if (f) {
            F->sda[2 * i] = &f->ctl;
            F->sda[2 * i + 1] = &f->word;
        }
    }
    struct hl_fence *f = pk->signal ? hl_fence_slot(&F->d, pk->signal, 0) : 0;
    if (f) {
        F->sda[4] = &f->ctl;
        F->sda[5] = &f->word;
    }
    const struct cp_dir *D = &F->dir[e];
    if ((pk->type == HL_PKT_KERNEL || pk->type == HL_PKT_ERT) && D->args == pk->args && D->q0) {
        struct hl_fence *qf = hl_fence_slot(&F->d, D->q0, HL_KIND_QUEUE);
        if (qf) F->sda[6] = &qf->ctl;
    }
}

/* The loads of a hit check, issued (consumed by hit_settle): the lane's words
 * of the block (host) and of the entry (device memory), and the ctl word of
 * the lane's object (lane 0: the block; 1..nbuf: its buffers). */
struct hit_loads {
    hl_u64 hv[HL_CP_ARGS_WORDS / 32], gv[HL_CP_ARGS_WORDS / 32], c;
};

__device__ __forceinline__ static void hit_issue(const struct hl_dom *d, const struct cp_dir *D, const struct cp_gent *G, hl_u64 ah,
                                 int lane, struct hit_loads *L) {
    hl_u64 h = lane == 0 ? ah : (lane <= (int)D->nbuf ? D->bh[lane - 1] : 0);
    struct hl_fence *f = h ? hl_fence_slot(d, h, HL_KIND_BUFFER) : 0;
    L->c = f ? rd(&f->ctl) : 0;
#pragma unroll
    for (int k = 0; k < HL_CP_ARGS_WORDS / 32; k++) {
        hl_u32 i = lane + 32 * k;
        L->hv[k] = i < D->nw ? rd(D->src + i) : 0;
        L->gv[k] = i < D->nw ? G->aw[i] : 0;
    }
}

/* 1 (every lane) when the entry stands for the block as read: the header,
 * buffer handles, scalars and follow-up queues unchanged and every object
 * live.  The follow-ups' packets may change between uses (a producer patches
 * their signal values per use): they are refreshed, in the entry and in
 * F->fw[which]. */
__device__ __forceinline__ static int hit_settle(struct cp_front *F, struct cp_gent *G, const struct cp_dir *D, hl_u64 ah, int which,
                                 const struct hit_loads *L, int lane) {
    int same = lane == 0 ? hl_ctl_matches(L->c, ah) : (lane <= (int)D->nbuf ? hl_ctl_matches(L->c, D->bh[lane - 1]) : 1);
    const hl_u32 fo = D->fo;
#pragma unroll
    for (int k = 0; k < HL_CP_ARGS_WORDS / 32; k++) {
        hl_u32 i = lane + 32 * k;
        if (i >= D->nw) continue;
        if (i < fo || (i - fo) % HL_FOLLOW_WORDS == 0)
            same &= L->hv[k] == L->gv[k];
        else if (L->hv[k] != L->gv[k])
            G->aw[i] = L->hv[k];
        if (i >= fo && i - fo < HL_CP_FW) F->fw[which][i - fo] = L->hv[k];
    }
    return __all_sync(HL_CP_FULL, same);
}

/* Write `state` into an ERT command's header word (hdr: the word as read), as a command processor
 * reports progress (a posted store to host memory; the signal's system fence orders it). */
__device__ static void ert_state(hl_u32 *cmd, hl_u32 hdr, hl_u32 state) {
    *(volatile hl_u32 *)cmd = hl_ert_with_state(hdr, state);
}

/* Lane 0: the START_CU / START_NPU command in F->ew (nbytes read of it) into entry D / G: its CU
 * (*kid), buffers and scalars, decoded by hostless_ert.h as the native processor decodes them
 * (core/agent.c).  R_OK, R_KERNEL (another opcode: CMD_CHAIN and the rest are not run on the GPU;
 * a cu_mask naming no CU or several) or R_ARGS. */
__device__ static int ert_decode(struct cp_front *F, struct cp_dir *D, struct cp_gent *G, hl_u32 nbytes, hl_u32 *kid) {
    const hl_u32 *w = (const hl_u32 *)F->ew;
    const hl_u32 hdr = w[0];
    const hl_u32 op = hl_ert_opcode(hdr);
    D->ert_hdr = hdr;
    if (op != HL_ERT_START_CU && op != HL_ERT_START_NPU) return R_KERNEL;
    if (hl_ert_check(hdr, nbytes)) return R_ARGS;
    if (hl_ert_cu_index(w[1], kid)) return R_KERNEL;
    struct hl_ert_args ea;
    if (hl_ert_cu_args(w + 1, hl_ert_count(hdr), op, &ea)) return R_ARGS;
    const hl_u32 nb = ea.nbuf, ns = ea.ns;
    if (nb < 1 || nb > HL_CP_MAX_BUFS) return R_ARGS;
    for (hl_u32 i = 0; i < nb; i++) D->bh[i] = hl_ert_u64(ea.bufs + 2 * i);
    D->nbuf = nb;
    G->job.nbuf = (int)nb;
    G->job.s0 = __longlong_as_double((long long)(ns > 0 ? hl_ert_u64(ea.scalars) : 0));
    G->job.s1 = __longlong_as_double((long long)(ns > 1 ? hl_ert_u64(ea.scalars + 2) : 0));
    F->tmp[31] = ns;
    return R_OK;
}

/* Decode packet pk's argument block into cache entry *entry (the whole warp;
 * every lane gets the same result): R_OK or R_*.  The side reads F->sda ride
 * along in the first round trip (results in F->side[which]).  *entry is
 * always set; on failure the entry is not kept, and its follow-ups
 * (F->fw[which], the directory's nfollow/fo) are valid when the block's
 * header was (so that the caller can fail them).  avoid: an entry that must
 * not be evicted, or -1. */
__device__ static int decode_warp(struct cp_front *F, struct cp_gent *gc, const hl_u64 *dh_va,
                                  const struct hl_packet *pk, int *entry, int avoid, int which, hl_u64 *nhit,
                                  hl_u64 *nmiss) {
    const int lane = threadIdx.x;
    const struct hl_dom *d = &F->d;
    const hl_u64 ah = pk->args;
    const int slot = cache_slot(ah, avoid);
    struct cp_dir *D = &F->dir[slot];
    struct cp_gent *G = &gc[slot];
    *entry = slot;
    const int cand = D->args == ah && ah && D->kernel == pk->kernel;
    struct hit_loads L;
    if (cand) hit_issue(d, D, G, ah, lane, &L);
    hl_u64 sv = lane >= 24 && F->sda[lane - 24] ? rd(F->sda[lane - 24]) : 0;
    if (lane >= 24) F->side[which][lane - 24] = sv;
    if (cand && hit_settle(F, G, D, ah, which, &L, lane)) {
        if (lane == 0) ++*nhit;
        __syncwarp();
        return R_OK;
    }
    __syncwarp();
    if (lane == 0) {
        D->args = 0;
        D->nfollow = 0;
        ++*nmiss;
    }
    /* a miss: the block's slot, its words, its buffers' slots and metadata */
    if (lane < 8) slot_read(d, ah, F->tmp, lane);
    __syncwarp();
    if (lane == 0) {
        const hl_u64 *s = F->tmp;
        int r = R_ARGS;
        const char *blk = host_block(d, ah, s);
        if (blk && s[4] >= 16 && s[4] % 8 == 0 && s[4] / 8 <= HL_CP_ARGS_WORDS) {
            D->src = (const hl_u64 *)blk;
            D->nw = (hl_u32)(s[4] / 8);
            r = R_OK;
        }
        F->res = r;
    }
    __syncwarp();
    if (F->res) return F->res;
    for (hl_u32 i = lane; i < D->nw; i += 32) G->aw[i] = rd(D->src + i);
    __syncwarp();
    if (lane == 0) {
        const hl_u64 *a = G->aw;
        hl_u32 magic = (hl_u32)a[0], nbuf = (hl_u16)(a[0] >> 32), nsc = (hl_u16)(a[0] >> 48);
        hl_u32 nf = (hl_u16)a[1];
        hl_u64 left = D->nw - 2, nf9 = (hl_u64)nf * HL_FOLLOW_WORDS;
        int r = R_OK;
        if (magic != HL_KERNARG_MAGIC || nbuf > left) r = R_ARGS;
        else if ((left -= nbuf, nsc > left)) r = R_ARGS;
        else if ((left -= nsc, nf9 > left)) r = R_ARGS;
        if (r == R_OK) { /* the follow-ups are known: a failure below can still fail them */
            D->nfollow = nf;
            D->fo = 2 + nbuf + nsc;
            if (nbuf < 1 || nbuf > HL_CP_MAX_BUFS) r = R_ARGS;
        }
        if (r == R_OK) {
            D->nbuf = nbuf;
            for (hl_u32 i = 0; i < nbuf; i++) D->bh[i] = a[2 + i];
            G->job.nbuf = (int)nbuf;
            G->job.run = K_NONE;
            G->job.s0 = __longlong_as_double((long long)(nsc > 0 ? a[2 + nbuf] : 0));
            G->job.s1 = __longlong_as_double((long long)(nsc > 1 ? a[3 + nbuf] : 0));
            F->tmp[31] = nsc;
        }
        F->res = r;
    }
    __syncwarp();
    for (hl_u32 i = lane; i < D->nfollow * HL_FOLLOW_WORDS && i < HL_CP_FW; i += 32) F->fw[which][i] = G->aw[D->fo + i];
    __syncwarp();
    if (F->res) return F->res;
    hl_u32 kid = pk->kernel;
    if (lane == 0) D->ert = 0;
    if (pk->type == HL_PKT_ERT) {
        /* an ERT command, the block's first buffer: START_CU / START_NPU name the CU (the kernel
         * id, as the emulated NPU maps them) and carry the buffers and scalars */
        if (lane < 8) slot_read(d, D->bh[0], F->bs[0], lane);
        __syncwarp();
        if (lane == 0) {
            const hl_u64 *sl = F->bs[0];
            const hl_u64 h = D->bh[0];
            int r = R_ARGS;
            char *cmd = host_block(d, h, sl);
            if (cmd && sl[4] >= 8) {
                /* whole words, the last one partly past the command (inside the heap: checked) */
                hl_u64 words = (sl[4] + 7) / 8, room = (d->heap_data_size - sl[0]) / 8;
                if (words > room) words = room;
                if (words > HL_CP_ERT_WORDS) words = HL_CP_ERT_WORDS;
                D->ert = (hl_u32 *)cmd;
                F->tmp[30] = words;
                F->tmp[29] = sl[4] < words * 8 ? sl[4] : words * 8; /* bytes of the command read */
                r = R_OK;
            }
            F->res = r;
        }
        __syncwarp();
        if (F->res) return F->res;
        for (hl_u32 i = lane; i < (hl_u32)F->tmp[30]; i += 32) F->ew[i] = rd((const hl_u64 *)D->ert + i);
        __syncwarp();
        if (lane == 0) {
            F->res = ert_decode(F, D, G, (hl_u32)F->tmp[29], &kid);
            if (F->res) ert_state(D->ert, (hl_u32)F->ew[0], HL_ERT_STATE_ERROR);
        }
        __syncwarp();
        if (F->res) return F->res;
    }
    /* lanes 8b..8b+7 read buffer b's slot; then lane b checks it and reads its metadata */
    if (lane < 8 * (int)D->nbuf) slot_read(d, D->bh[lane >> 3], F->bs[lane >> 3], lane & 7);
    __syncwarp();
    if (lane < (int)D->nbuf)
        F->rc[lane] = buffer_from_slot(d, dh_va, D->bh[lane], F->bs[lane], &G->job, lane, F->shape[lane],
                                       &F->ndim[lane], &F->f32[lane]);
    __syncwarp();
    if (lane == 0) {
        int r = R_OK;
        for (hl_u32 i = 0; i < D->nbuf && r == R_OK; i++) r = F->rc[i];
        if (r == R_OK) r = job_check(&G->job, kid, (hl_u32)F->tmp[31], F->shape, F->ndim, F->f32);
        if (r && D->ert) ert_state(D->ert, (hl_u32)F->ew[0], HL_ERT_STATE_ERROR);
        if (r == R_OK) {
            D->kernel = pk->kernel;
            D->local = job_local(&G->job);
            D->out_host = HL_PLACE_HEAP(F->bs[D->nbuf - 1][7]) < 0 || D->ert; /* an ERT header is host memory */
            D->self = 0;
            D->q0 = 0;
            for (hl_u32 i = 0; i < D->nfollow; i++) {
                hl_u64 q = G->aw[D->fo + i * HL_FOLLOW_WORDS];
                if (q == F->qh && !D->self) D->self = i + 1;
                if (q != F->qh && !D->q0) D->q0 = q;
            }
            D->args = D->ert ? 0 : ah; /* an ERT command's words are not compared by a hit: never kept */
        }
        F->res = r;
    }
    __syncwarp();
    return F->res;
}

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

__device__ static void front_end(char *base, unsigned long long size, hl_u64 qh, unsigned int host_index,
                                 const hl_u64 *dh_va, struct hl_cp_ctl *ctl, struct cp_share *sh, struct cp_gent *gc,
                                 struct cp_job *ljob, float *As, float *Bs, float *red, struct cp_front &F,
                                 struct cp_qcache &QC, struct cp_sideop &SO) {
    __shared__ hl_u64 s_w, s_c;
    __shared__ int s_hit;
    __shared__ hl_u64 hop_idx[HL_CP_HOPS]; /* 1 + the index of a packet we pushed into our own queue */
    __shared__ hl_u8 hop_n[HL_CP_HOPS];    /* and its hop count */
    hl_u32 hops = 0;                        /* lane 0: the current packet's hops through our own queue */
    const int lane = threadIdx.x;
    const unsigned int nworkers = gridDim.x - 1;
    unsigned int gen = 0;
    /* counters kept here and written out (a read-modify-write of host memory is a round trip) */
    hl_u64 r = 0, completed = 0, npk = 0, nfail = 0, ninplace = 0, beats = 0, handoff = 0, handoff_from = 0;
    hl_u64 nhit = 0, nmiss = 0, nlocal = 0, jobns = 0, fencens = 0, roundns = 0, tailns = 0, t_round = 0, postns = 0;
    hl_u64 clk_t = gtimer(), clk_c = (hl_u64)clock64();
    hl_u64 last_sig = 0, last_val = 0; /* our last signal, when it is known to hold success */
    int cur = 0, have = 0, pend_free = 0, ljob_of = -1;
    /* statistics go out when the queue is idle and every 64 packets: each store to host memory is
     * a posted write that the next system fence would wait for */
#define FLUSH_STATS()                                                                                 \
    do {                                                                                              \
        *vol(&ctl->packets) = npk;                                                                    \
        *vol(&ctl->inplace) = ninplace;                                                               \
        *vol(&ctl->handoff_ns) = handoff;                                                             \
        *vol(&ctl->hits) = nhit;                                                                      \
        *vol(&ctl->misses) = nmiss;                                                                   \
        *vol(&ctl->local) = nlocal;                                                                   \
        *vol(&ctl->job_ns) = jobns;                                                                   \
        *vol(&ctl->fence_ns) = fencens;                                                               \
        *vol(&ctl->round_ns) = roundns;                                                               \
        *vol(&ctl->tail_ns) = tailns;                                                                 \
        *vol(&ctl->post_ns) = postns;                                                                 \
        {                                                                                             \
            hl_u64 tn = gtimer(), cn = (hl_u64)clock64();                                             \
            if (tn - clk_t > 100000) {                                                                \
                *vol(&ctl->sm_khz) = (cn - clk_c) * 1000000ull / (tn - clk_t);                       \
                clk_t = tn;                                                                           \
                clk_c = cn;                                                                           \
            }                                                                                         \
        }                                                                                             \
        *vol(&F.v.q->completed) = completed;                                                          \
    } while (0)
    if (lane == 0) {
        F.res = hl_attach(&F.d, base, size) != HL_OK || hl_queue_open(&F.d, qh, &F.v) != HL_OK;
        F.qh = qh;
        for (int i = 0; i < HL_CP_CACHE; i++) F.dir[i].args = 0;
        for (int i = 0; i < HL_CP_QCACHE; i++) QC.handle[i] = 0;
        for (int i = 0; i < HL_CP_HOPS; i++) hop_idx[i] = 0;
        QC.producer = HL_PRODUCER_DEVICE_OF(host_index);
    }
    __syncwarp();
    int ok = !F.res;
    if (ok) {
        r = rd(&F.v.q->read_index);
        completed = rd(&F.v.q->completed);
        if (lane == 0) *vol(&ctl->state) = HL_CP_STATE_RUNNING;
    } else if (lane == 0) {
        *vol(&ctl->state) = HL_CP_STATE_ATTACH_FAILED;
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
                    if (spins == 0) FLUSH_STATS(); /* idle */
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
            if (lane == 0) { /* its hops, if we pushed it into our own queue (else 0) */
                const hl_u32 hs = (hl_u32)(r % HL_CP_HOPS);
                hops = hop_idx[hs] == r + 1 ? hop_n[hs] : 0;
                hop_idx[hs] = 0;
            }
            r++;
            if (got == 0) { /* a SKIP: consumed */
                if (lane == 0) {
                    *vol(&F.v.cells[(r - 1) & mask]) = HL_CELL(r - 1 + F.v.capacity, 0, HL_CELL_FREE);
                    *vol(&F.v.q->read_index) = r;
                }
                continue;
            }
            /* its cell is freed after its signal: a store to host memory now would hold up the
             * system fences before the job */
            pend_free = 1;
            F.ent[cur] = -1;
            handoff_from = 0;
            /* its side reads ride along with its decode (or are read alone) */
            if (lane == 0) side_addrs(&F, P, 0, P->type == HL_PKT_KERNEL ? cache_slot(P->args, -1) : 0);
            __syncwarp();
        }
        have = 0;
        hl_u32 status = HL_STATUS_SUCCESS, reason = R_OK;
        int leave = P->type == HL_PKT_STOP;
        const int kernel_pkt = P->type == HL_PKT_KERNEL || P->type == HL_PKT_ERT;
        int e = F.ent[cur];
        if (kernel_pkt && e < 0) {
            /* decode (also when an input failed: its follow-ups are failed below) */
            int rr = decode_warp(&F, gc, dh_va, P, &e, -1, cur, &nhit, &nmiss);
            if (rr) {
                status = HL_STATUS_ERROR;
                reason = (hl_u32)rr;
            }
        } else if (e < 0) {
            hl_u64 sv = lane >= 24 && F.sda[lane - 24] ? rd(F.sda[lane - 24]) : 0;
            if (lane >= 24) F.side[cur][lane - 24] = sv;
            __syncwarp();
        } /* else decoded by its parent, side reads too */
        /* the rule before anything waits or runs (core/agent.c's check, hostless_ops.h): a known
         * packet type; a signal that is a live fence or timeline (its ctl from the side reads) with
         * a point below 2**62; inputs that are fences, merged fences or timelines with such points.
         * Then the inputs: those the side reads did not show done are waited for. */
        if (lane == 0) {
            int observed = 0; /* an input another producer completed (our own signals need no fence) */
            hl_u32 bad = !kernel_pkt && P->type != HL_PKT_BARRIER && P->type != HL_PKT_STOP ? R_KERNEL : R_OK;
            if (!bad && P->signal &&
                (!hl_signal_kind_ok(P->signal) || !hl_ctl_matches(F.side[cur][4], P->signal) ||
                 !hl_point_ok(P->signal, P->signal_value)))
                bad = R_HANDLE;
            for (int i = 0; i < 2 && !bad; i++)
                if (P->wait[i] && (!hl_wait_kind_ok(P->wait[i]) || !hl_point_ok(P->wait[i], P->wait_value[i])))
                    bad = R_HANDLE;
            if (bad) {
                status = HL_STATUS_ERROR;
                reason = bad;
            }
            for (int i = 0; i < 2 && !bad; i++) {
                hl_u64 h = P->wait[i];
                if (!h) continue;
                if (h == last_sig && (HL_HANDLE_KIND(h) == HL_KIND_FENCE || P->wait_value[i] <= last_val)) continue;
                observed = 1;
                if (input_done(h, P->wait_value[i], F.side[cur][2 * i], F.side[cur][2 * i + 1])) continue;
                if (pend_free) { /* a wait: the packet's cell first, as a CPU agent frees it when it pops */
                    *vol(&F.v.cells[(r - 1) & mask]) = HL_CELL(r - 1 + F.v.capacity, 0, HL_CELL_FREE);
                    *vol(&F.v.q->read_index) = r;
                    pend_free = 0;
                }
                hl_i64 w = cp_wait(&F.d, h, P->wait_value[i], ctl);
                if (w < 0) {
                    status = HL_STATUS_CANCEL;
                    leave = 1;
                    reason = R_INPUT;
                    break;
                }
                if (w) {
                    status = (hl_u32)w;
                    reason = R_INPUT;
                    break;
                }
            }
            if (observed) __threadfence_system(); /* the producers' data before our reads */
            ++npk;
        }
        status = __shfl_sync(HL_CP_FULL, status, 0);
        reason = __shfl_sync(HL_CP_FULL, reason, 0);
        leave = __shfl_sync(HL_CP_FULL, leave, 0);
        const struct cp_dir *Ef = kernel_pkt && e >= 0 ? &F.dir[e] : 0; /* its follow-ups */
        const struct cp_dir *E = status == HL_STATUS_SUCCESS ? Ef : 0;   /* its job */
        const hl_u64 sig_c = F.side[cur][4], sig_w = F.side[cur][5], q0_c = F.side[cur][6];
        hl_u64 t_join = 0;
        const int local = E && (E->local || nworkers == 0);
        if (!local) { /* block 0's other warps pass this packet's barriers with no job */
            if (lane == 0) ljob->run = K_NONE;
            ljob_of = -1;
            __syncwarp();
            bar_a();
            bar_b();
        }
        if (E) {
            hl_u64 t0;
            if (lane == 0 && E->ert) ert_state(E->ert, E->ert_hdr, HL_ERT_STATE_RUNNING);
            if (local) {
                if (ljob_of != e && lane < HL_CP_JOB_WORDS) ((hl_u64 *)ljob)[lane] = ((const hl_u64 *)&gc[e].job)[lane];
                __syncwarp();
                t0 = gtimer();
                bar_a(); /* block 0's other warps take the job */
                cp_run(ljob, 0, 1, As, Bs, red);
                bar_b();
                t_join = gtimer();
                if (lane == 0) ++nlocal;
            } else {
                if (lane < HL_CP_JOB_WORDS) ((volatile hl_u64 *)&sh->job)[lane] = ((const hl_u64 *)&gc[e].job)[lane];
                __threadfence();
                __syncwarp();
                t0 = gtimer();
                gen++;
                if (lane == 0) {
                    atomicAdd(&sh->go, 1u); /* fork */
                    const unsigned int target = gen * nworkers;
                    while ((int)(*(volatile unsigned int *)&sh->done - target) < 0) {
                    } /* join */
                }
                __syncwarp();
                t_join = gtimer();
            }
            if (lane == 0) {
                jobns += t_join - t0;
                if (handoff_from) {
                    handoff += t0 - handoff_from;
                    tailns += t0 - t_round;
                }
            }
        }
        /* One round trip for everything that follows the job: lane 0 signals (a CAS from the word read
         * before), lane 5 looks whether our queue is empty, lane 31 reserves the first other queue's
         * cell, and, when there is a follow-up for our queue, every lane checks its decoded entry and
         * lanes 24..30 make its side reads. */
        const int nxt = cur ^ 1;
        const int fast = status == HL_STATUS_SUCCESS && P->signal && hl_ctl_matches(sig_c, P->signal) &&
                         (HL_HANDLE_KIND(P->signal) == HL_KIND_FENCE ||
                          (HL_HANDLE_KIND(P->signal) == HL_KIND_TIMELINE && sig_w < P->signal_value &&
                           P->signal_value <= HL_TIMELINE_MAX));
        int e2 = -1, cand = 0;
        if (E && E->self && !leave) {
            if (lane < 8) ((hl_u64 *)&F.pk[nxt])[lane] = follow_word(&F, gc, e, cur, E->self - 1, 1 + lane);
            __syncwarp();
            const struct hl_packet *N = &F.pk[nxt];
            e2 = N->type == HL_PKT_KERNEL ? cache_slot(N->args, e) : -1;
            cand = e2 >= 0 && F.dir[e2].args == N->args && N->args && F.dir[e2].kernel == N->kernel;
            if (lane == 0) side_addrs(&F, N, P->signal, e2 >= 0 ? e2 : 0);
            __syncwarp();
        }
        struct hit_loads L;
        hl_u64 t_fence = 0;
        if (lane == 0 && E && E->ert) ert_state(E->ert, E->ert_hdr, HL_ERT_STATE_COMPLETED);
        if (lane == 0) {
            /* warp 1: the job's writes before the signal (device memory is coherent at the GPU's
             * L2, what a copy engine or a peer reads through; host memory needs the system
             * fence), then the CAS.  warp 2: the reserve. */
            SO.sig = fast;
            SO.sys = !(E && !E->out_host);
            SO.gone = 0;
            SO.ctl = sig_c;
            if (fast) {
                SO.word = &hl_fence_slot(&F.d, P->signal, 0)->word;
                SO.expected = HL_HANDLE_KIND(P->signal) == HL_KIND_FENCE ? 0 : sig_w;
                SO.desired = HL_HANDLE_KIND(P->signal) == HL_KIND_FENCE ? (hl_u64)HL_STATUS_SUCCESS : P->signal_value;
            }
            SO.resv = E && E->q0 && q0_c;
            SO.q0 = E ? E->q0 : 0;
            SO.q0_c = q0_c;
            SO.qi = -1;
            SO.qr = HL_E_HANDLE;
            t_fence = gtimer();
        }
        __syncwarp();
        bar_c(); /* warps 1 and 2 go */
        ljob_of = -1;
        hl_u64 jw = 0;
        if (cand) {
            hit_issue(&F.d, &F.dir[e2], &gc[e2], F.pk[nxt].args, lane, &L);
            if (lane < HL_CP_JOB_WORDS) jw = ((const hl_u64 *)&gc[e2].job)[lane]; /* for block 0, if local */
        }
        hl_u64 sv = 0, lw = 0, lc = 0;
        if (E && E->self && !leave) {
            sv = lane >= 24 && F.sda[lane - 24] ? rd(F.sda[lane - 24]) : 0;
            if (lane == 5) {
                lw = rd(&F.v.q->write_index);
                lc = rd(&F.v.cells[r & mask]);
            }
        }
        /* the round's results */
        if (cand) s_hit = hit_settle(&F, &gc[e2], &F.dir[e2], F.pk[nxt].args, nxt, &L, lane);
        if (E && E->self && !leave && lane >= 24) F.side[nxt][lane - 24] = sv;
        if (lane == 5) {
            s_w = lw;
            s_c = lc;
        }
        __syncwarp();
        bar_d(); /* warps 1 and 2 are done */
        if (lane == 0 && pend_free) { /* the packet's cell, now that its signal is on the bus */
            *vol(&F.v.cells[(r - 1) & mask]) = HL_CELL(r - 1 + F.v.capacity, 0, HL_CELL_FREE);
            *vol(&F.v.q->read_index) = r;
            pend_free = 0;
        }
        if (lane == 0 && E) {
            t_round = gtimer();
            fencens += t_fence - t_join;
            roundns += t_round - t_fence;
        }
        if (lane == 0) {
            /* the signal: settled from the CAS, or made here (a failure, a timeline that moved) */
            int known;
            if (fast && SO.gone) /* the slot held another object at the CAS: not ours to signal */
                known = 0;
            else if (fast && SO.old == SO.expected)
                known = 1;
            else if (fast && HL_HANDLE_KIND(P->signal) == HL_KIND_FENCE)
                known = SO.old == HL_STATUS_SUCCESS; /* signaled before us */
            else /* a timeline that moved meanwhile goes on from the word the CAS saw */
                known = cp_signal(&F.d, P->signal, P->signal_value, status, sig_c, fast ? SO.old : sig_w);
            last_sig = known ? P->signal : 0;
            last_val = P->signal_value;
            if (status != HL_STATUS_SUCCESS) {
                *vol(&ctl->failed) = ++nfail;
                *vol(&ctl->last_error) = (npk << HL_CP_LAST_ERROR_SHIFT) | reason;
            }
            int reserved_used = 0, budget = HL_CP_FAIL_BUDGET;
            hl_u64 dl = 0; /* the follow-ups' shared deadline for full queues */
            for (hl_u32 i = 0; Ef && i < Ef->nfollow; i++) {
                struct hl_follow f;
#pragma unroll
                for (hl_u32 k = 0; k < HL_FOLLOW_WORDS; k++) ((hl_u64 *)&f)[k] = follow_word(&F, gc, e, cur, i, k);
                if (status != HL_STATUS_SUCCESS) { /* they will never run: their signals, nested ones too */
                    if (budget <= 0) break;
                    --budget;
                    cp_signal(&F.d, f.packet.signal, f.packet.signal_value, status, 0, 0);
                    cp_fail_nested(&F.d, &f.packet, status, &budget, 1);
                    continue;
                }
                const int own = f.queue == F.qh;
                if (i + 1 == E->self && !leave && hops < HL_CP_HOP_LIMIT && s_w == r &&
                    s_c == HL_CELL(r, 0, HL_CELL_FREE)) {
                    /* in place: our queue is empty (nothing published or reserved at the read index) */
                    have = 1;
                    ++ninplace;
                    continue;
                }
                int qi = -1, pr;
                hl_u64 w = 0;
                if (own && hops >= HL_CP_HOP_LIMIT) {
                    pr = HL_E_HANDLE; /* a chain through our own queue: cut */
                } else if (!reserved_used && f.queue == E->q0 && SO.qi >= 0) {
                    reserved_used = 1;
                    qi = SO.qi;
                    pr = SO.qr;
                    w = SO.qw;
                } else {
                    qi = cp_qview(&F.d, &QC, f.queue, 0);
                    pr = qi >= 0 ? cp_reserve(&QC, qi, &w, &dl, !own) : HL_E_HANDLE;
                }
                if (pr == HL_OK) {
                    hl_queue_publish(&QC.v[qi], w, &f.packet, QC.producer);
                    if (own) {
                        hop_idx[w % HL_CP_HOPS] = w + 1;
                        hop_n[w % HL_CP_HOPS] = (hl_u8)(hops + 1);
                    }
                } else { /* dropped: its signal and its nested follow-ups' fail */
                    cp_signal(&F.d, f.packet.signal, f.packet.signal_value, HL_STATUS_ERROR, 0, 0);
                    cp_fail_nested(&F.d, &f.packet, HL_STATUS_ERROR, &budget, 0);
                }
            }
            if (have) hops++; /* the follow-up run in place is one hop further */
            ++completed;
            if ((npk & 63) == 0) FLUSH_STATS();
            if (E) postns += gtimer() - t_round;
        }
        have = __shfl_sync(HL_CP_FULL, have, 0);
        if (have) {
            F.ent[nxt] = cand && s_hit ? e2 : -1;
            if (cand && s_hit && F.dir[e2].local) { /* its job, read in the round trip */
                if (lane < HL_CP_JOB_WORDS) ((hl_u64 *)ljob)[lane] = jw;
                ljob_of = e2;
            }
            if (cand && s_hit && lane == 0) ++nhit;
            cur = nxt;
            handoff_from = t_join;
        }
        __syncwarp();
        if (leave) break;
    }
    if (lane == 0) {
        if (ok) FLUSH_STATS();
#undef FLUSH_STATS
        sh->job.run = K_STOP;
        ljob->run = K_STOP;
        __threadfence();
        atomicAdd(&sh->go, 1u);
        *vol(&ctl->state) = ok ? HL_CP_STATE_LEFT : HL_CP_STATE_ATTACH_FAILED;
    }
    __syncwarp();
    bar_a(); /* the helpers see the stop */
}

extern "C" __global__ void __launch_bounds__(HL_CP_THREADS, 1)
hl_cp_main(char *base, unsigned long long size, unsigned long long qhandle, unsigned int host_index,
           const unsigned long long *dh_va, struct hl_cp_ctl *ctl, struct cp_share *sh, struct cp_gent *gc) {
    __shared__ struct cp_job job;
    __shared__ float As[HL_CP_TILE * HL_CP_KSTEP], Bs[HL_CP_TILE * HL_CP_KSTEP];
    __shared__ float red[HL_CP_THREADS / 32];
    __shared__ struct cp_front F;
    __shared__ struct cp_qcache QC;
    __shared__ struct cp_sideop SO;
    if (blockIdx.x > 0)
        worker_loop(sh, &job, As, Bs, red);
    else if (threadIdx.x < 32)
        front_end(base, size, qhandle, host_index, (const hl_u64 *)dh_va, ctl, sh, gc, &job, As, Bs, red, F, QC, SO);
    else
        helper_loop(&job, As, Bs, red, &F, &QC, &SO);
}
