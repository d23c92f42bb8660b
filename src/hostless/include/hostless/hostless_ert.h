/*
 * hostless_ert.h -- XRT ERT command buffers: the format and its one decoder,
 * used by every command processor (the native loop's core/agent_ert.c, the GPU's
 * agents/gpucp.cu) and by Python through the extension (hostless.ert encodes
 * commands; its decoding calls these functions: _core.ert_decode, ...).
 * Header-only inline functions over plain words: no memory is read past the
 * counts the caller gives.  Valid C11, C++11 and CUDA (nvcc and NVRTC).
 */
#ifndef HOSTLESS_ERT_H
#define HOSTLESS_ERT_H

#include "hostless_layout.h"
#include "hostless_atomic.h" /* HL_INLINE */

/* XRT ERT command buffers (the `args` buffer of an HL_PKT_ERT packet; the
 * emulated NPU's command-submission format, bit-exact with XRT's ert.h).
 * Header word (u32): state[3:0] | custom[11:4] | count[22:12] (payload words)
 * | opcode[27:23] | type[31:28].  START_CU / START_NPU: header, cu_mask, then
 * count - 1 words (START_NPU: instruction address u64, its size u32, property
 * count u32, then the kernel arguments).  hostless's CU arguments: buffer
 * count, u64 buffer handles, u64 scalars (each u64 as two little-endian
 * words).  CMD_CHAIN (ert_cmd_chain_data) has no cu_mask: command count,
 * submit index, error index, 3 reserved words, then u64 command handles.
 * The command processor writes the state back into the header word
 * (NEW -> RUNNING -> COMPLETED / ERROR) and, for a chain, the submit index
 * before each command and the index of the one that failed. */
#define HL_ERT_STATE_SHIFT 0
#define HL_ERT_STATE_MASK 0xfu
#define HL_ERT_CUSTOM_SHIFT 4
#define HL_ERT_CUSTOM_MASK 0xffu
#define HL_ERT_COUNT_SHIFT 12
#define HL_ERT_COUNT_MASK 0x7ffu
#define HL_ERT_OPCODE_SHIFT 23
#define HL_ERT_OPCODE_MASK 0x1fu
#define HL_ERT_TYPE_SHIFT 28
#define HL_ERT_TYPE_MASK 0xfu
#define HL_ERT_MAX_BYTES (4u + 4u * HL_ERT_COUNT_MASK) /* the longest command */
/* opcodes */
#define HL_ERT_START_CU 0u
#define HL_ERT_CONFIGURE 2u
#define HL_ERT_EXIT 3u
#define HL_ERT_ABORT 4u
#define HL_ERT_EXEC_WRITE 5u
#define HL_ERT_CU_STAT 6u
#define HL_ERT_START_COPYBO 7u
#define HL_ERT_START_DPU 18u
#define HL_ERT_CMD_CHAIN 19u
#define HL_ERT_START_NPU 20u
#define HL_ERT_START_NPU_PREEMPT 21u
/* command types */
#define HL_ERT_TYPE_DEFAULT 0u
#define HL_ERT_TYPE_KDS_LOCAL 1u
#define HL_ERT_TYPE_CTRL 2u
#define HL_ERT_TYPE_CU 3u
#define HL_ERT_TYPE_SCU 4u
/* states */
#define HL_ERT_STATE_INVALID 0u
#define HL_ERT_STATE_NEW 1u
#define HL_ERT_STATE_QUEUED 2u
#define HL_ERT_STATE_RUNNING 3u
#define HL_ERT_STATE_COMPLETED 4u
#define HL_ERT_STATE_ERROR 5u
#define HL_ERT_STATE_ABORT 6u
#define HL_ERT_STATE_SUBMITTED 7u
#define HL_ERT_STATE_TIMEOUT 8u
#define HL_ERT_STATE_NORESPONSE 9u
#define HL_ERT_STATE_SKERROR 10u
#define HL_ERT_STATE_SKCRASHED 11u
/* word offsets */
#define HL_ERT_CHAIN_HEADER_WORDS 6u /* chain payload words before its handles */
#define HL_ERT_CHAIN_SUBMIT_WORD 2u  /* word (header = 0) the submit index is written to */
#define HL_ERT_CHAIN_ERROR_WORD 3u   /* word the index of the failed command is written to */
#define HL_ERT_NPU_FIXED_WORDS 4u    /* START_NPU payload words before the kernel arguments */

/* ---- the decoder ----
 * Results: HL_ERT_OK (0) or one of the HL_ERT_E_* reasons below (> 0);
 * hl_ert_why(r) is its message (the text after "ValueError: " / "BadPacket: "
 * that the agents record, and Python's ValueError). */
#define HL_ERT_OK 0
#define HL_ERT_E_SHORT 1       /* the buffer is shorter than the header word */
#define HL_ERT_E_COUNT 2       /* the header's count runs past the buffer (or misses the cu_mask) */
#define HL_ERT_E_MASK 3        /* a cu_mask naming no CU or several */
#define HL_ERT_E_NPU_SHORT 4   /* START_NPU payload shorter than its fixed words */
#define HL_ERT_E_NO_ARGS 5     /* START_CU / START_NPU without argument words */
#define HL_ERT_E_ARGS 6        /* argument words that do not match the buffer count */
#define HL_ERT_E_CHAIN_SHORT 7 /* CMD_CHAIN payload shorter than its fixed words */
#define HL_ERT_E_CHAIN_COUNT 8 /* CMD_CHAIN payload shorter than its command count */

HL_INLINE const char *hl_ert_why(int r) {
    switch (r) {
    case HL_ERT_OK: return "ok";
    case HL_ERT_E_SHORT: return "ERT command shorter than its header";
    case HL_ERT_E_COUNT: return "ERT command count does not fit its buffer";
    case HL_ERT_E_MASK: return "cu_mask must name exactly one CU";
    case HL_ERT_E_NPU_SHORT: return "START_NPU payload shorter than its fixed words";
    case HL_ERT_E_NO_ARGS: return "ERT command without arguments";
    case HL_ERT_E_ARGS: return "ERT argument words do not match the buffer count";
    case HL_ERT_E_CHAIN_SHORT: return "CMD_CHAIN payload shorter than its fixed words";
    case HL_ERT_E_CHAIN_COUNT: return "CMD_CHAIN payload shorter than its command count";
    default: return "bad ERT command";
    }
}

/* The fields of a header word. */
HL_INLINE hl_u32 hl_ert_state(hl_u32 hdr) { return (hdr >> HL_ERT_STATE_SHIFT) & HL_ERT_STATE_MASK; }
HL_INLINE hl_u32 hl_ert_custom(hl_u32 hdr) { return (hdr >> HL_ERT_CUSTOM_SHIFT) & HL_ERT_CUSTOM_MASK; }
HL_INLINE hl_u32 hl_ert_count(hl_u32 hdr) { return (hdr >> HL_ERT_COUNT_SHIFT) & HL_ERT_COUNT_MASK; }
HL_INLINE hl_u32 hl_ert_opcode(hl_u32 hdr) { return (hdr >> HL_ERT_OPCODE_SHIFT) & HL_ERT_OPCODE_MASK; }
HL_INLINE hl_u32 hl_ert_type(hl_u32 hdr) { return (hdr >> HL_ERT_TYPE_SHIFT) & HL_ERT_TYPE_MASK; }

/* The header word with its state replaced (a command processor reporting progress). */
HL_INLINE hl_u32 hl_ert_with_state(hl_u32 hdr, hl_u32 state) {
    return (hdr & ~(HL_ERT_STATE_MASK << HL_ERT_STATE_SHIFT)) | ((state & HL_ERT_STATE_MASK) << HL_ERT_STATE_SHIFT);
}

/* 1 when a command of this opcode has a cu_mask word after its header (all but CMD_CHAIN). */
HL_INLINE hl_u32 hl_ert_has_cu_mask(hl_u32 opcode) { return opcode != HL_ERT_CMD_CHAIN; }

/* A u64 carried as two little-endian words. */
HL_INLINE hl_u64 hl_ert_u64(const hl_u32 *w) { return (hl_u64)w[0] | (hl_u64)w[1] << 32; }

/* hl_ert_check(hdr, nbytes)
 *   Whether the command whose header word is hdr fits a buffer of nbytes
 *   (only the first HL_ERT_MAX_BYTES count): HL_ERT_OK, then its payload is
 *   hl_ert_count(hdr) words after the header, at least the cu_mask when it
 *   has one; HL_ERT_E_SHORT (nbytes < 4); HL_ERT_E_COUNT.  By subtraction:
 *   no overflow. */
HL_INLINE int hl_ert_check(hl_u32 hdr, hl_u64 nbytes) {
    if (nbytes < 4) return HL_ERT_E_SHORT;
    const hl_u64 lim = nbytes < HL_ERT_MAX_BYTES ? nbytes : HL_ERT_MAX_BYTES;
    const hl_u32 count = hl_ert_count(hdr);
    if (count < hl_ert_has_cu_mask(hl_ert_opcode(hdr)) || count > (lim - 4) / 4) return HL_ERT_E_COUNT;
    return HL_ERT_OK;
}

/* hl_ert_cu_index(mask, *cu)
 *   The CU a START_CU / START_NPU cu_mask names: exactly one bit.
 *   HL_ERT_OK with *cu; HL_ERT_E_MASK. */
HL_INLINE int hl_ert_cu_index(hl_u32 mask, hl_u32 *cu) {
    if (mask == 0 || (mask & (mask - 1))) return HL_ERT_E_MASK;
#if defined(__CUDA_ARCH__)
    *cu = (hl_u32)(__ffs((int)mask) - 1);
#else
    hl_u32 i = 0;
    while (!(mask >> i & 1u)) i++;
    *cu = i;
#endif
    return HL_ERT_OK;
}

/* The arguments of a START_CU / START_NPU command as hostless kernels take
 * them: the buffer count, nbuf u64 buffer handles, then ns u64 scalars; each
 * u64 two words (read them with hl_ert_u64(bufs + 2 * i)). */
struct hl_ert_args {
    hl_u32 nbuf, ns;
    const hl_u32 *bufs;    /* 2 * nbuf words */
    const hl_u32 *scalars; /* 2 * ns words */
};

/* hl_ert_cu_args(pl, count, opcode, *out)
 *   pl[0..count): a checked START_CU / START_NPU payload (pl[0] the cu_mask,
 *   count >= 1).  HL_ERT_OK with *out; HL_ERT_E_NPU_SHORT; HL_ERT_E_NO_ARGS;
 *   HL_ERT_E_ARGS. */
HL_INLINE int hl_ert_cu_args(const hl_u32 *pl, hl_u32 count, hl_u32 opcode, struct hl_ert_args *out) {
    const hl_u32 *args = pl + 1;
    hl_u32 nargs = count - 1;
    if (opcode == HL_ERT_START_NPU) {
        if (nargs < HL_ERT_NPU_FIXED_WORDS) return HL_ERT_E_NPU_SHORT;
        args += HL_ERT_NPU_FIXED_WORDS;
        nargs -= HL_ERT_NPU_FIXED_WORDS;
    }
    if (nargs == 0) return HL_ERT_E_NO_ARGS;
    const hl_u32 nb = args[0];
    if (nb > (nargs - 1) / 2 || (nargs - 1 - 2 * nb) % 2) return HL_ERT_E_ARGS;
    out->nbuf = nb;
    out->ns = (nargs - 1 - 2 * nb) / 2;
    out->bufs = args + 1;
    out->scalars = args + 1 + 2 * nb;
    return HL_ERT_OK;
}

/* hl_ert_chain(pl, count, *n, *handles)
 *   pl[0..count): a checked CMD_CHAIN payload.  HL_ERT_OK with *n commands
 *   whose u64 handles are hl_ert_u64(*handles + 2 * i); HL_ERT_E_CHAIN_SHORT;
 *   HL_ERT_E_CHAIN_COUNT.  The processor writes the index of the command it
 *   submits into word HL_ERT_CHAIN_SUBMIT_WORD of the command (header = 0),
 *   and that of the one that failed into HL_ERT_CHAIN_ERROR_WORD. */
HL_INLINE int hl_ert_chain(const hl_u32 *pl, hl_u32 count, hl_u32 *n, const hl_u32 **handles) {
    if (count < HL_ERT_CHAIN_HEADER_WORDS) return HL_ERT_E_CHAIN_SHORT;
    if (pl[0] > (count - HL_ERT_CHAIN_HEADER_WORDS) / 2) return HL_ERT_E_CHAIN_COUNT;
    *n = pl[0];
    *handles = pl + HL_ERT_CHAIN_HEADER_WORDS;
    return HL_ERT_OK;
}

#endif /* HOSTLESS_ERT_H */
