/* gpucp_front.cu -- part of gpucp.cu's program (read after the parts before it in gpucp.CU_PARTS,
 * never compiled alone): the front end's loop and the kernel. */

__device__ static void front_end(char *base, unsigned long long size, hl_u64 qh, unsigned int host_index,
                                 const hl_u64 *dh_va, struct hl_cp_ctl *ctl, struct cp_share *sh, struct cp_gent *gc,
                                 struct cp_job *ljob, float *As, float *Bs, float *red, struct cp_front &F,
                                 struct cp_qcache &QC, struct cp_sideop &SO, struct hl_cp_outbox *ob) {
    __shared__ hl_u64 s_w, s_c;
    __shared__ int s_hit;
    __shared__ hl_u64 hop_idx[HL_CP_HOPS]; /* 1 + the index of a packet we pushed into our own queue */
    __shared__ hl_u8 hop_n[HL_CP_HOPS];    /* and its hop count */
    hl_u32 hops = 0;                        /* lane 0: the current packet's hops through our own queue */
    struct cp_out_state OS = {0, HL_CP_OUTBOX, 0, 0}; /* lane 0: the outbox (ob: the host pushes) */
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
            hl_u64 hw = 0; /* with the outbox: the host's record of its pushes into our queue */
            if (got == 1 && lane < 8) ((hl_u64 *)P)[lane] = rd((const hl_u64 *)&F.v.packets[r & mask] + lane);
            if (got == 1 && ob && lane == 8) hw = rd(&ob->hop[r % HL_CP_HOPS]);
            __syncwarp(); /* the packet is in shared memory: its loads completed */
            hw = __shfl_sync(HL_CP_FULL, hw, 8);
            if (lane == 0) { /* its hops, if we pushed it into our own queue (else 0) */
                const hl_u32 hs = (hl_u32)(r % HL_CP_HOPS);
                if (ob)
                    hops = (hw & HL_CP_HOP_INDEX_MASK) == r + 1 ? (hl_u32)(hw >> 56) : 0;
                else
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
            SO.resv = !ob && E && E->q0 && q0_c; /* with the outbox the host pushes */
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
            int no_inplace = 0; /* a follow-up of ours for our queue may be in the outbox still */
            if (ob && OS.own_pending) {
                no_inplace = 1; /* this time: our queue was looked at before the outbox */
                if (rd(&ob->taken) > OS.own_pos) OS.own_pending = 0;
            }
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
                if (i + 1 == E->self && !leave && hops < HL_CP_HOP_LIMIT && !no_inplace && s_w == r &&
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
                } else if (ob) { /* the host pushes it (no GPU atomic on host memory) */
                    pr = cp_out_put(ob, &OS, f.queue, own ? hops + 1 : 0, &f.packet, &dl);
                    if (pr == HL_OK && own) {
                        OS.own_pos = OS.pos - 1;
                        OS.own_pending = 1;
                        no_inplace = 1;
                    }
                    if (pr == HL_OK) continue;
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
           const unsigned long long *dh_va, struct hl_cp_ctl *ctl, struct cp_share *sh, struct cp_gent *gc,
           struct hl_cp_outbox *ob) {
    __shared__ struct cp_job job;
    __shared__ float As[HL_CP_TILE * HL_CP_KSTEP], Bs[HL_CP_TILE * HL_CP_KSTEP];
    __shared__ float red[HL_CP_THREADS / 32];
    __shared__ struct cp_front F;
    __shared__ struct cp_qcache QC;
    __shared__ struct cp_sideop SO;
    if (blockIdx.x > 0)
        worker_loop(sh, &job, As, Bs, red);
    else if (threadIdx.x < 32)
        front_end(base, size, qhandle, host_index, (const hl_u64 *)dh_va, ctl, sh, gc, &job, As, Bs, red, F, QC, SO,
                  ob);
    else
        helper_loop(&job, As, Bs, red, &F, &QC, &SO);
}
