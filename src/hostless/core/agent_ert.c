/*
 * agent_ert.c -- the native agent loop's ERT command processor (the emulated
 * NPU's): an HL_PKT_ERT packet's command buffer, decoded by hostless_ert.h
 * (the one decoder, shared with gpucp.cu), run on the agent's C kernels or
 * its Python CU.  The loop itself is agent.c; agent_loop.h is their shared
 * state.  Every buffer it names is held for the command's duration; a bad
 * command fails its packet alone with ERROR, its state word set to ERROR.
 */
#include <stdio.h>
#include <string.h>

#include "agent_loop.h"

static uint32_t ld32(const char *p, uint64_t w) {
    uint32_t v;
    memcpy(&v, p + 4 * w, 4);
    return v;
}

static void st32(char *p, uint64_t w, uint32_t v) { memcpy(p + 4 * w, &v, 4); }

static void ert_state(char *p, uint32_t state) { st32(p, 0, hl_ert_with_state(ld32(p, 0), state)); }

/* START_CU / START_NPU: pl[0..count) is the payload (pl[0] the cu_mask), decoded by hostless_ert.h.
 * HL_OK; < 0 with a message; ERT_RECORDED (the Python CU failed, recorded). */
static int ert_cu(struct agent *a, const uint32_t *pl, uint32_t count, uint32_t opcode, uint64_t sig) {
    uint32_t cu = 0;
    if (hl_ert_cu_index(pl[0], &cu))
        return hle_fail(HL_E_VALUE, "BadPacket: cu_mask 0x%x must name exactly one CU", pl[0]);
    if (!(a->present >> cu & 1)) return hle_fail(HL_E_VALUE, "BadPacket: no CU %u in the loaded xclbin", cu);
    struct hl_ert_args ea;
    int e = hl_ert_cu_args(pl, count, opcode, &ea); /* count >= 1: checked by the caller */
    if (e) return hle_fail(HL_E_VALUE, "ValueError: %s", hl_ert_why(e));
    uint32_t nbuf = ea.nbuf, ns = ea.ns;
    uint64_t hs[HL_ERT_COUNT_MASK / 2], sc[HL_ERT_COUNT_MASK / 2];
    for (uint32_t i = 0; i < nbuf; i++) hs[i] = hl_ert_u64(ea.bufs + 2 * i);
    for (uint32_t i = 0; i < ns; i++) sc[i] = hl_ert_u64(ea.scalars + 2 * i);
    uint32_t ck = a->map[cu];
    if (ck && nbuf <= AGENT_MAX_KBUFS && ns <= AGENT_MAX_KSCALARS) {
        struct hle_kbuf b[AGENT_MAX_KBUFS];
        int r = HL_OK;
        for (uint32_t i = 0; i < nbuf && r == HL_OK; i++) r = agent_kbuf(a, hs[i], &b[i]);
        if (r == HL_OK) r = hle_kernel_run(&a->kenv, ck, b, (int)nbuf, sc, (int)ns);
        if (r <= 0) return r;
        /* 1: the Python CU */
    }
    if (!a->cfg->python_cu)
        return hle_fail(HL_E_VALUE, "BadPacket: CU %u needs the Python kernel for these arguments and this agent has none",
                        cu);
    uint64_t st = a->cfg->python_cu(a->cfg->ud, cu, hs, nbuf, sc, ns, sig);
    if (st == HL_STATUS_SUCCESS) return HL_OK;
    a->py_status = st;
    return ERT_RECORDED;
}

static int ert_run(struct agent *a, uint64_t h, int chained, uint64_t sig);

/* CMD_CHAIN: pl[0..count) its payload, p its buffer (at least 4 * (1 + count) bytes). */
static int ert_chain(struct agent *a, char *p, const uint32_t *pl, uint32_t count, uint64_t sig) {
    uint32_t n = 0;
    const uint32_t *hw = NULL;
    int e = hl_ert_chain(pl, count, &n, &hw);
    if (e) return hle_fail(HL_E_VALUE, "ValueError: %s", hl_ert_why(e));
    for (uint32_t i = 0; i < n; i++) {
        st32(p, HL_ERT_CHAIN_SUBMIT_WORD, i);
        int r = ert_run(a, hl_ert_u64(hw + 2 * i), 1, sig);
        if (r) {
            st32(p, HL_ERT_CHAIN_ERROR_WORD, i);
            return r;
        }
    }
    return HL_OK;
}

/* Run the ERT command in buffer h (held for the call).  HL_OK; < 0 with a
 * message; ERT_RECORDED. */
static int ert_run(struct agent *a, uint64_t h, int chained, uint64_t sig) {
    int mark = a->nheld;
    int r = agent_hold(a, h, HL_KIND_BUFFER);
    if (r) return r;
    uint64_t n = 0;
    char *p = hl_buffer_data(&a->c->dv, h, &n);
    if (!p) {
        r = hle_fail(HL_E_HANDLE, "BadPacket: command buffer 0x%llx is not a live buffer", (unsigned long long)h);
        goto out;
    }
    uint32_t hdr = n < 4 ? 0 : ld32(p, 0);
    uint32_t count = hl_ert_count(hdr), opcode = hl_ert_opcode(hdr);
    int e = hl_ert_check(hdr, n);
    if (e == HL_ERT_E_SHORT) {
        r = hle_fail(HL_E_VALUE, "ValueError: %s", hl_ert_why(e));
        goto out;
    }
    if (e) {
        ert_state(p, HL_ERT_STATE_ERROR);
        r = hle_fail(HL_E_VALUE, "ValueError: ERT command count %u does not fit a %llu-byte buffer", count,
                     (unsigned long long)(n < HL_ERT_MAX_BYTES ? n : HL_ERT_MAX_BYTES));
        goto out;
    }
    uint32_t pl[HL_ERT_COUNT_MASK];
    memcpy(pl, p + 4, 4 * (size_t)count);
    ert_state(p, HL_ERT_STATE_RUNNING);
    if (opcode == HL_ERT_CMD_CHAIN) {
        if (chained)
            r = hle_fail(HL_E_VALUE, "BadPacket: a chained command cannot be a CMD_CHAIN");
        else
            r = ert_chain(a, p, pl, count, sig);
    } else if (opcode == HL_ERT_START_CU || opcode == HL_ERT_START_NPU) {
        r = ert_cu(a, pl, count, opcode, sig);
    } else {
        r = hle_fail(HL_E_VALUE, "BadPacket: unsupported ERT opcode %u", opcode);
    }
    ert_state(p, r == HL_OK ? HL_ERT_STATE_COMPLETED : HL_ERT_STATE_ERROR);
out:
    agent_keep(a, mark); /* the command and its buffers, as a packet's own */
    while (a->nheld > mark) hle_release(a->c, a->held[--a->nheld]);
    return r;
}

/* An ERT packet whose block is decoded: its first buffer is the command. */
uint64_t agent_run_ert(struct agent *a, const struct hl_packet *p, const struct kargs *k) {
    if (k->nbuffers == 0) {
        record(a, p->signal, "BadPacket: ERT packet without a command buffer");
        return HL_STATUS_ERROR;
    }
    int r = ert_run(a, karg_u64(k, k->buf_off, 0), 0, p->signal);
    if (r == HL_OK) return HL_STATUS_SUCCESS;
    if (r == ERT_RECORDED) return a->py_status;
    record(a, p->signal, hle_errmsg());
    return HL_STATUS_ERROR;
}
