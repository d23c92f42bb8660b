/*
 * hostless_kernels.h -- the built-in kernels' ids, in one place: the id a
 * KERNEL packet names (hostless.kernels.CPU_KERNELS, core/kernels.c's C
 * kernels, the GPU command processor agents/gpucp.cu), the emulated NPU's
 * "xclbin" (the CU index an ERT command's cu_mask names -> the kernel it
 * runs: hostless.kernels.NPU_CUS, hle_agent_npu_cus), and the id ranges of
 * user kernels and stage functions.  Python reads these through the
 * extension's constant table (hostless._core.K_*, NPU_CU_*).  Constants only;
 * valid C11, C++11 and CUDA (NVRTC).
 */
#ifndef HOSTLESS_KERNELS_H
#define HOSTLESS_KERNELS_H

/* Built-in kernel ids (a cpu agent's KERNEL packet; the C kernel table).
 * Buffers: inputs first, the output last; scalars are u64 words (f64 bits). */
#define HL_K_COPY 1u      /* copy(src) -> dst: the bytes, same byte size */
#define HL_K_ADD 2u       /* add(a, b) -> out */
#define HL_K_SCALE 3u     /* scale(x) -> out, one f64 scalar: the factor */
#define HL_K_RELU 4u      /* relu(x) -> out */
#define HL_K_GEMM 5u      /* gemm(a (m,k), w (k,n)) -> out (m,n) */
#define HL_K_SUM 6u       /* sum(x) -> out[0] */
#define HL_K_SOFTMAX 7u   /* softmax over the last axis */
#define HL_K_CONV2D 8u    /* valid 2-D correlation of an image with a kernel */
#define HL_K_NORMALIZE 9u /* (x - mean) / std, scalars mean (0.0), std (1.0) */
#define HL_K_INT8_GEMM 10u /* int8 x int8 -> int32 gemm: the NPU's CU 0 only (no cpu kernel id) */
#define HL_K_FIRST HL_K_COPY
#define HL_K_LAST HL_K_INT8_GEMM
#define HL_K_CPU_LAST HL_K_NORMALIZE /* cpu kernel ids are HL_K_FIRST..HL_K_CPU_LAST */

/* The emulated NPU's xclbin: CU index -> kernel (HL_NPU_CUS CUs, 0..5). */
#define HL_NPU_CU_INT8_GEMM 0u
#define HL_NPU_CU_GEMM 1u
#define HL_NPU_CU_RELU 2u
#define HL_NPU_CU_SOFTMAX 3u
#define HL_NPU_CU_CONV2D 4u
#define HL_NPU_CU_COPY 5u
#define HL_NPU_CUS 6u
/* HL_NPU_CU_KERNELS: the kernel of each CU, in CU order (an array initializer) */
#define HL_NPU_CU_KERNELS {HL_K_INT8_GEMM, HL_K_GEMM, HL_K_RELU, HL_K_SOFTMAX, HL_K_CONV2D, HL_K_COPY}

/* Id ranges past the built-in kernels. */
#define HL_K_LOAD 999u              /* retired: once "import a stage function"; refused by every agent */
#define HL_K_USER_BASE 1000u        /* user kernels registered at spawn */
#define HL_K_FUNCTION_BASE 0x100000u /* 1 << 20: stage functions loaded after spawn */

/* Multiply-adds one gemm / conv2d call may do (a 2048^3 GEMM is 2^33): a
 * hostile shape cannot hold an agent for hours. */
#define HL_K_MAX_WORK (1ull << 34)

#endif /* HOSTLESS_KERNELS_H */
