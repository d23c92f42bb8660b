/* gpucp_decode.cu -- part of gpucp.cu's program (read after the parts before it in gpucp.CU_PARTS,
 * never compiled alone): the front end's reads: slots, buffers, argument blocks, ERT commands. */

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

