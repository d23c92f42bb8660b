/*
 * hostless_gpucp.h -- what the GPU command processor (agents/gpucp.cu) shares
 * with the host process that launches it (hostless.agents.gpucp): the
 * control block in pinned host memory, the job hand-off and the decoded
 * argument-block cache in device memory, their sizes, states and failure
 * reasons.  The host sizes and reads them through the extension's constant
 * table (hostless._core.CP_*), so no offset or word count is written twice.
 * Valid C11, C++11 and CUDA (NVRTC); a host compiler sees the same layout
 * (pointers are 64-bit on both sides).
 */
#ifndef HOSTLESS_GPUCP_H
#define HOSTLESS_GPUCP_H

#include "hostless_layout.h"

#define HL_CP_THREADS 256    /* threads of each block */
#define HL_CP_MAX_BUFS 4     /* buffers of one job */
#define HL_CP_ARGS_WORDS 128 /* an argument block of at most 1 KiB */
#define HL_CP_CACHE 128      /* decoded argument blocks kept (a power of two) */
#define HL_CP_HOPS 256       /* remembered hop counts of pushes into the processor's own queue */
#define HL_CP_PUSH_NS 1000000000ull /* a packet's follow-ups wait for a full queue this long, in all */
#define HL_CP_OUTBOX 64      /* follow-ups handed to the host forwarder, in flight at most */

/* hl_cp_ctl.state */
#define HL_CP_STATE_RUNNING 1u
#define HL_CP_STATE_LEFT 2u          /* a STOP packet, or stop set */
#define HL_CP_STATE_ATTACH_FAILED 3u /* the domain or the queue did not validate */

/* the reason of a failed packet (hl_cp_ctl.last_error & 0xffff) */
#define HL_CP_R_OK 0
#define HL_CP_R_INPUT 1  /* an input failed */
#define HL_CP_R_KERNEL 2 /* unknown kernel or packet type */
#define HL_CP_R_ARGS 3   /* bad argument block */
#define HL_CP_R_BUFFER 4 /* a buffer handle names no live buffer here */
#define HL_CP_R_SHAPE 5  /* shapes do not fit */
#define HL_CP_R_DTYPE 6  /* not float32 */
#define HL_CP_R_HANDLE 7 /* a signal or input handle of the wrong kind, stale, or a point past 2**62 */
#define HL_CP_LAST_ERROR_SHIFT 16 /* last_error = (packets at the time << 16) | reason */

/* pinned host memory, mapped: the host's window on the processor */
struct hl_cp_ctl {
    hl_u64 stop;       /* host: 1 = leave at the next poll */
    hl_u64 state;      /* 0 starting, then HL_CP_STATE_* */
    hl_u64 packets;    /* packets run (taken from the ring or in place) */
    hl_u64 failed;     /* packets failed */
    hl_u64 last_error; /* (packets at the time << 16) | reason of the last failure */
    hl_u64 heartbeat;  /* bumped every HL_CP_STOP_POLL idle polls */
    hl_u64 inplace;    /* follow-ups run in place (own queue, empty) */
    hl_u64 handoff_ns; /* summed %globaltimer from a stage's end to the next in-place stage's start */
    hl_u64 hits;       /* argument blocks found decoded */
    hl_u64 misses;     /* argument blocks decoded */
    hl_u64 local;      /* jobs block 0 ran itself */
    hl_u64 job_ns;     /* summed %globaltimer from a job's start to its end */
    hl_u64 fence_ns;   /* summed: a job's end to the start of the round trip after it (preparing it) */
    hl_u64 round_ns;   /* summed: that round trip (the signal's fence and CAS, the next stage's reads) */
    hl_u64 tail_ns;    /* summed: the round trip's end to the next in-place job's start */
    hl_u64 post_ns;    /* summed: of it, the signal's settling and the follow-ups (lane 0) */
    hl_u64 sm_khz;     /* the front end's SM clock (clock64 against %globaltimer) since the last write */
    hl_u64 pad[7];
};

/* The outbox: on a GPU whose atomics on host memory are not atomic against the host's
 * (cudaDevAttrHostNativeAtomicSupported = 0: PCIe), the processor pushes no follow-up itself;
 * it hands each to a host thread of its process (core/cpfwd.c) through this ring in private
 * pinned memory, where every word has one writer at a time (no atomic read-modify-write
 * crosses the bus).  Position p lies in slot p % HL_CP_OUTBOX; the GPU writes it when
 * p < taken + HL_CP_OUTBOX (taken: the positions the host has forwarded, which only the host
 * writes): queue, hops and the packet, a system fence, then seq = p + 1 (only the GPU writes
 * seq); the host waits for that seq, pushes, then taken = p + 1.  hop[] is the host's record of its pushes into
 * the processor's own queue, HL_CP_HOP_WORD(index, hops), which the front end reads with the
 * packet at that index (the chain limit through its own queue). */
struct hl_cp_out {
    hl_u64 seq;
    hl_u64 queue; /* the follow-up's queue handle (untrusted: the forwarder checks it) */
    hl_u64 hops;  /* into the processor's own queue: the hop count the packet will carry */
    hl_u64 pad;
    struct hl_packet packet;
};
struct hl_cp_outbox {
    hl_u64 taken; /* host: positions forwarded (pushed, or failed) */
    hl_u64 pad[7];
    struct hl_cp_out slot[HL_CP_OUTBOX];
    hl_u64 hop[HL_CP_HOPS];
};
#define HL_CP_HOP_WORD(w, n) ((((hl_u64)(n)) << 56) | ((hl_u64)(w) + 1))
#define HL_CP_HOP_INDEX_MASK ((((hl_u64)1) << 56) - 1)

/* What the blocks that run a job need: plain values, no handles. */
struct cp_job {
    int run;  /* HL_K_* (gpucp.cu: -1 stop, 0 none) */
    int nbuf;
    char *data[HL_CP_MAX_BUFS];
    hl_u64 nbytes[HL_CP_MAX_BUFS];
    hl_u64 count[HL_CP_MAX_BUFS];
    double s0, s1;
    hl_u64 m, k, n; /* gemm (m,k)x(k,n); softmax: m rows of n */
};
#define HL_CP_JOB_WORDS (sizeof(struct cp_job) / 8)

/* device memory: the front end's hand-off to the worker blocks */
struct cp_share {
    unsigned int go;   /* bumped once per job (the job is written before) */
    unsigned int done; /* worker blocks finished, cumulative */
    unsigned int pad[14];
    struct cp_job job;
};

/* device memory: a cache entry's words and decoded job */
struct cp_gent {
    struct cp_job job;
    hl_u64 aw[HL_CP_ARGS_WORDS];
};

#endif /* HOSTLESS_GPUCP_H */
