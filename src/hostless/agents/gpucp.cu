/*
 * gpucp.cu -- the GPU command processor: a resident kernel that consumes a
 * hostless queue with no host in the loop (compiled with NVRTC by
 * hostless.agents.gpucp, from this file and hostless.h).  One program in four
 * files, concatenated in this order (gpucp.CU_PARTS): gpucp.cu (this comment,
 * the constants, the workers), gpucp_decode.cu (the front end's reads: slots,
 * buffers, argument blocks, ERT commands), gpucp_sync.cu (waits, signals,
 * failure passing, queue pushes) and gpucp_front.cu (the front end's loop and
 * the kernel).
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

/* The CPU agents' limits, hostless_engine.h's (which NVRTC cannot include), passed by
 * hostless.agents.gpucp as -D options from hostless._abi.C: HL_CP_HOP_LIMIT (HLE_AGENT_HOP_LIMIT:
 * own-queue chains cut after it), HL_CP_FAIL_DEPTH (HLE_AGENT_FAIL_DEPTH: nested follow-ups failed
 * this deep) and HL_CP_FAIL_BUDGET (HLE_AGENT_FAIL_BUDGET: and this many signals a packet). */
#if !defined(HL_CP_HOP_LIMIT) || !defined(HL_CP_FAIL_DEPTH) || !defined(HL_CP_FAIL_BUDGET)
#error "HL_CP_HOP_LIMIT, HL_CP_FAIL_DEPTH and HL_CP_FAIL_BUDGET are hostless_engine.h's HLE_AGENT_*: compile through hostless.agents.gpucp.compile_cubin, which passes them"
#endif

#define HL_CP_FW 36          /* follow-up words kept in shared memory (4 follow-ups) */
#define HL_CP_STOP_POLL 4096
#define HL_CP_FULL 0xffffffffu
#define HL_CP_TILE 64        /* gemm: 64x64 output tiles, */
#define HL_CP_KSTEP 32       /* 32-deep k steps */
#define HL_CP_UNROLL 8       /* elementwise: loads in flight a thread */
#define HL_CP_QCACHE 4       /* queues pushed into, kept validated */
#define HL_FOLLOW_WORDS 9    /* sizeof(struct hl_follow) / 8 */
#define HL_CP_ERT_WORDS 32   /* an ERT command of at most 256 bytes */

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

