/*
 * kernels.c -- the built-in kernels in C (ids of hostless.kernels.CPU_KERNELS,
 * plus int8_gemm, the NPU's CU 0), and the BLAS the GEMM runs through.
 *
 * float32 buffers ("<f4") with the shapes hostless.kernels accepts; copy
 * takes any dtypes; int8_gemm int8 x int8 -> int32 (wrapping as NumPy's int32
 * matmul does).  GEMM is a CBLAS sgemm (dlopen'ed by hle_blas_load, so the
 * engine has no link-time dependency on it) or, without one, the Python
 * kernel: never a hand loop.  What the C kernels do not take (other dtypes, NumPy
 * broadcasting) returns 1 and runs in the Python kernel, which has the same
 * result; arguments wrong for every implementation (buffer counts, shapes,
 * scalars, the work bound) fail with HL_E_VALUE and a message (the words of
 * hostless.kernels).  Buffer convention: inputs first, the output last.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"

#define K_COPY HL_K_COPY /* the ids: hostless_kernels.h */
#define K_ADD HL_K_ADD
#define K_SCALE HL_K_SCALE
#define K_RELU HL_K_RELU
#define K_GEMM HL_K_GEMM
#define K_SUM HL_K_SUM
#define K_SOFTMAX HL_K_SOFTMAX
#define K_CONV2D HL_K_CONV2D
#define K_NORMALIZE HL_K_NORMALIZE
#define K_INT8_GEMM HL_K_INT8_GEMM
#define MAX_WORK HL_K_MAX_WORK

int hle_agent_has_kernel(uint32_t kernel) { return kernel >= HL_K_FIRST && kernel <= HL_K_LAST; }

void hle_agent_npu_cus(struct hle_agent_cfg *cfg) {
    static const uint8_t cus[HL_NPU_CUS] = HL_NPU_CU_KERNELS;
    memset(cfg->kernel_map, 0, sizeof cfg->kernel_map);
    cfg->present = 0;
    for (unsigned i = 0; i < sizeof cus; i++) {
        cfg->kernel_map[i] = cus[i];
        cfg->present |= 1u << i;
    }
}

int hle_blas_load(struct hle_kenv *env, const char *path, int threads, char *why, size_t n) {
    env->sgemm = NULL;
    if (!path || !*path) {
        snprintf(why, n, "no BLAS library given (pip install 'hostless[blas]', or HOSTLESS_BLAS=a CBLAS library)");
        return 0;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *e = dlerror();
        snprintf(why, n, "cannot load %s (%s)", path, e ? e : "?");
        return 0;
    }
    static const char *const names[] = {"scipy_cblas_sgemm", "cblas_sgemm"};
    static const char *const thr[] = {"scipy_openblas_set_num_threads", "openblas_set_num_threads"};
    for (int i = 0; i < 2; i++) {
        void *f = dlsym(lib, names[i]);
        if (!f) continue;
        if (threads > 0) {
            void *t = dlsym(lib, thr[i]);
            if (t) ((void (*)(int))t)(threads);
        }
        memcpy(&env->sgemm, &f, sizeof f);
        snprintf(why, n, "%s from %s", names[i], path);
        return 1;
    }
    snprintf(why, n, "%s has no cblas_sgemm", path);
    dlclose(lib);
    return 0;
}

static int is_f32(const struct hle_kbuf *b) { return strcmp(b->dtype, "<f4") == 0 && b->itemsize == 4; }
static int is_dt(const struct hle_kbuf *b, const char *dt, uint32_t size) {
    return strcmp(b->dtype, dt) == 0 && b->itemsize == size;
}

/* Do the bytes of x and y overlap (an output aliasing an input: NumPy copies, we hand it over)? */
static int overlap(const struct hle_kbuf *x, const struct hle_kbuf *y) {
    return x->nbytes && y->nbytes && x->data < y->data + y->nbytes && y->data < x->data + x->nbytes;
}

static int same_shape(const struct hle_kbuf *x, const struct hle_kbuf *y) {
    if (x->ndim != y->ndim) return 0;
    for (uint32_t i = 0; i < x->ndim; i++)
        if (x->shape[i] != y->shape[i]) return 0;
    return 1;
}

static double f64(uint64_t w) {
    double d;
    memcpy(&d, &w, sizeof d);
    return d;
}

static int need(const char *name, int n, int want) {
    if (n != want) return hle_fail(HL_E_VALUE, "ValueError: %s takes %d buffers, got %d", name, want, n);
    return HL_OK;
}

static int work(const char *name, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
    uint64_t w = a;
    const uint64_t more[3] = {b, c, d};
    for (int i = 0; i < 3; i++) {
        if (more[i] && w > MAX_WORK / more[i]) w = MAX_WORK + 1;
        else w *= more[i];
    }
    if (w > MAX_WORK)
        return hle_fail(HL_E_VALUE, "ValueError: %s: more multiply-adds than MAX_WORK (%llu)", name,
                        (unsigned long long)MAX_WORK);
    return HL_OK;
}

/* The elementwise kernels: all f32 and every shape the output's, else Python. */
static int unary_ok(const struct hle_kbuf *b) { return is_f32(&b[0]) && is_f32(&b[1]) && same_shape(&b[0], &b[1]); }

static int k_copy(struct hle_kbuf *b, int n) {
    int r = need("copy", n, 2);
    if (r) return r;
    if (b[0].nbytes != b[1].nbytes)
        return hle_fail(HL_E_VALUE, "ValueError: copy: %llu bytes into %llu", (unsigned long long)b[0].nbytes,
                        (unsigned long long)b[1].nbytes);
    memmove(b[1].data, b[0].data, b[0].nbytes);
    return HL_OK;
}

static int k_add(struct hle_kbuf *b, int n) {
    int r = need("add", n, 3);
    if (r) return r;
    if (!is_f32(&b[0]) || !is_f32(&b[1]) || !is_f32(&b[2])) return 1;
    const float *x = (const float *)b[0].data, *y = (const float *)b[1].data;
    float *o = (float *)b[2].data;
    uint64_t cnt = b[2].count;
    if (same_shape(&b[0], &b[2]) && same_shape(&b[1], &b[2])) {
        for (uint64_t i = 0; i < cnt; i++) o[i] = x[i] + y[i];
    } else if (same_shape(&b[0], &b[2]) && b[1].count == 1 && b[1].ndim <= b[2].ndim) {
        float v = y[0];
        for (uint64_t i = 0; i < cnt; i++) o[i] = x[i] + v;
    } else if (same_shape(&b[1], &b[2]) && b[0].count == 1 && b[0].ndim <= b[2].ndim) {
        float v = x[0];
        for (uint64_t i = 0; i < cnt; i++) o[i] = v + y[i];
    } else {
        return 1; /* broadcasting (or its error): NumPy's rules, in Python */
    }
    return HL_OK;
}

static int k_scale(struct hle_kbuf *b, int n, const uint64_t *s, int ns) {
    int r = need("scale", n, 2);
    if (r) return r;
    if (ns != 1) return hle_fail(HL_E_VALUE, "ValueError: scale takes one scalar (f64)");
    if (!unary_ok(b)) return 1;
    float f = (float)f64(s[0]);
    const float *x = (const float *)b[0].data;
    float *o = (float *)b[1].data;
    for (uint64_t i = 0; i < b[1].count; i++) o[i] = x[i] * f;
    return HL_OK;
}

/* relu on float32 bits, NumPy's maximum(x, 0): x where x > 0 or x is a NaN (kept as it
 * is), else +0.  Without a branch: on random signs a compare-and-branch loop mispredicts
 * half its elements (242 us for 64k floats on the 2-core VM, 9 us this way), so the test
 * is integer arithmetic on four lanes at a time (GCC/Clang vector extensions: SSE2 or
 * NEON where there is one, scalar code elsewhere).  x may alias o. */
typedef uint32_t hle_v4u __attribute__((vector_size(16)));
typedef int32_t hle_v4i __attribute__((vector_size(16)));

static uint32_t relu_bits(uint32_t u) {
    uint32_t keep = ((int32_t)u > 0) | ((u & 0x7fffffffu) > 0x7f800000u); /* > +0, or a NaN */
    return u & (0u - keep);
}

static void relu_f32(const uint8_t *x, uint8_t *o, uint64_t count) {
    uint64_t i = 0;
    for (; count - i >= 4; i += 4) {
        hle_v4u u;
        memcpy(&u, x + 4 * i, sizeof u);
        hle_v4i s = (hle_v4i)u;
        hle_v4u keep = (hle_v4u)((s > 0) | ((hle_v4i)(u & 0x7fffffffu) > 0x7f800000));
        u &= keep;
        memcpy(o + 4 * i, &u, sizeof u);
    }
    for (; i < count; i++) {
        uint32_t u;
        memcpy(&u, x + 4 * i, sizeof u);
        u = relu_bits(u);
        memcpy(o + 4 * i, &u, sizeof u);
    }
}

static int k_relu(struct hle_kbuf *b, int n) {
    int r = need("relu", n, 2);
    if (r) return r;
    if (!unary_ok(b)) return 1;
    relu_f32((const uint8_t *)b[0].data, (uint8_t *)b[1].data, b[1].count);
    return HL_OK;
}

static int k_sum(struct hle_kbuf *b, int n) {
    int r = need("sum", n, 2);
    if (r) return r;
    if (!is_f32(&b[0]) || !is_f32(&b[1])) return 1;
    if (b[1].count < 1) return 1; /* NumPy's IndexError, in Python */
    const float *x = (const float *)b[0].data;
    double acc = 0.0;
    for (uint64_t i = 0; i < b[0].count; i++) acc += x[i];
    ((float *)b[1].data)[0] = (float)acc;
    return HL_OK;
}

static int k_softmax(struct hle_kbuf *b, int n) {
    int r = need("softmax", n, 2);
    if (r) return r;
    if (!unary_ok(b) || b[0].ndim < 1) return 1;
    uint64_t last = b[0].shape[b[0].ndim - 1];
    if (last == 0 || b[0].count == 0) return 1;
    uint64_t rows = b[0].count / last;
    const float *x = (const float *)b[0].data;
    float *o = (float *)b[1].data;
    for (uint64_t i = 0; i < rows; i++) {
        const float *xr = x + i * last;
        float *orow = o + i * last;
        float m = xr[0];
        for (uint64_t j = 1; j < last; j++)
            if (xr[j] > m) m = xr[j];
        float s = 0.0f;
        for (uint64_t j = 0; j < last; j++) s += (orow[j] = expf(xr[j] - m));
        for (uint64_t j = 0; j < last; j++) orow[j] /= s;
    }
    return HL_OK;
}

static int k_normalize(struct hle_kbuf *b, int n, const uint64_t *s, int ns) {
    int r = need("normalize", n, 2);
    if (r) return r;
    double mean = ns > 0 ? f64(s[0]) : 0.0, std = ns > 1 ? f64(s[1]) : 1.0;
    if (std == 0.0) return hle_fail(HL_E_VALUE, "ValueError: normalize: std is zero");
    if (!unary_ok(b)) return 1;
    float fm = (float)mean, fs = (float)std;
    const float *x = (const float *)b[0].data;
    float *o = (float *)b[1].data;
    for (uint64_t i = 0; i < b[1].count; i++) o[i] = (x[i] - fm) / fs;
    return HL_OK;
}

/* The shape checks of hostless.kernels.k_gemm / k_int8_gemm (every dtype). */
static int gemm_shapes(const char *name, struct hle_kbuf *b, int n, uint64_t *m, uint64_t *kk, uint64_t *nn) {
    int r = need(name, n, 3);
    if (r) return r;
    if (b[0].ndim != 2 || b[1].ndim != 2 || b[2].ndim != 2 || b[0].shape[1] != b[1].shape[0] ||
        b[2].shape[0] != b[0].shape[0] || b[2].shape[1] != b[1].shape[1])
        return hle_fail(HL_E_VALUE, "ValueError: %s: shapes do not match", name);
    *m = b[0].shape[0], *kk = b[0].shape[1], *nn = b[1].shape[1];
    return work(name, *m, *kk, *nn, 1);
}

static int k_gemm(const struct hle_kenv *env, struct hle_kbuf *b, int n) {
    uint64_t m, kk, nn;
    int r = gemm_shapes("gemm", b, n, &m, &kk, &nn);
    if (r) return r;
    if (!is_f32(&b[0]) || !is_f32(&b[1]) || !is_f32(&b[2])) return 1;
    if (!env || !env->sgemm) return 1; /* no BLAS: the Python kernel (NumPy's BLAS), never a hand loop */
    if (m > INT_MAX || kk > INT_MAX || nn > INT_MAX) return 1;
    if (overlap(&b[2], &b[0]) || overlap(&b[2], &b[1])) return 1; /* NumPy copies an aliased operand */
    if (m == 0 || nn == 0) return HL_OK;
    if (kk == 0) {
        memset(b[2].data, 0, b[2].nbytes);
        return HL_OK;
    }
    env->sgemm(101, 111, 111, (int)m, (int)nn, (int)kk, 1.0f, (const float *)b[0].data, (int)kk,
               (const float *)b[1].data, (int)nn, 0.0f, (float *)b[2].data, (int)nn);
    return HL_OK;
}

/* int8 (m, k) x int8 (k, n) -> int32 (m, n), wrapping modulo 2**32 as NumPy's int32 matmul. */
static int k_int8_gemm(struct hle_kbuf *b, int n) {
    int r = need("int8_gemm", n, 3);
    if (r) return r;
    if (!is_dt(&b[0], "|i1", 1) || !is_dt(&b[1], "|i1", 1) || !is_dt(&b[2], "<i4", 4))
        return hle_fail(HL_E_VALUE, "ValueError: int8_gemm takes int8 inputs and an int32 output");
    uint64_t m, kk, nn;
    if ((r = gemm_shapes("int8_gemm", b, n, &m, &kk, &nn))) return r;
    if (overlap(&b[2], &b[0]) || overlap(&b[2], &b[1])) return 1;
    const int8_t *A = (const int8_t *)b[0].data, *W = (const int8_t *)b[1].data;
    uint32_t *O = (uint32_t *)b[2].data;
    for (uint64_t i = 0; i < m; i++) {
        uint32_t *orow = O + i * nn;
        for (uint64_t j = 0; j < nn; j++) orow[j] = 0;
        for (uint64_t p = 0; p < kk; p++) {
            uint32_t av = (uint32_t)(int32_t)A[i * kk + p];
            const int8_t *wr = W + p * nn;
            for (uint64_t j = 0; j < nn; j++) orow[j] += av * (uint32_t)(int32_t)wr[j];
        }
    }
    return HL_OK;
}

static int k_conv2d(struct hle_kbuf *b, int n) {
    int r = need("conv2d", n, 3);
    if (r) return r;
    if (b[0].ndim != 2 || b[1].ndim != 2) return hle_fail(HL_E_VALUE, "ValueError: conv2d takes 2-D image and kernel");
    uint64_t H = b[0].shape[0], W = b[0].shape[1], kh = b[1].shape[0], kw = b[1].shape[1];
    if (kh > H || kw > W || b[2].ndim != 2 || b[2].shape[0] != H - kh + 1 || b[2].shape[1] != W - kw + 1)
        return hle_fail(HL_E_VALUE, "ValueError: conv2d: the output shape does not match");
    uint64_t oh = H - kh + 1, ow = W - kw + 1;
    if ((r = work("conv2d", oh, ow, kh, kw))) return r;
    if (!is_f32(&b[0]) || !is_f32(&b[1]) || !is_f32(&b[2])) return 1;
    if (kh == 0 || kw == 0 || overlap(&b[2], &b[0]) || overlap(&b[2], &b[1])) return 1; /* NumPy's edge rules */
    const float *img = (const float *)b[0].data, *ker = (const float *)b[1].data;
    float *o = (float *)b[2].data;
    for (uint64_t i = 0; i < oh; i++)
        for (uint64_t j = 0; j < ow; j++) {
            float acc = 0.0f;
            for (uint64_t u = 0; u < kh; u++)
                for (uint64_t v = 0; v < kw; v++) acc += img[(i + u) * W + j + v] * ker[u * kw + v];
            o[i * ow + j] = acc;
        }
    return HL_OK;
}

int hle_kernel_run(const struct hle_kenv *env, uint32_t kernel, struct hle_kbuf *b, int n, const uint64_t *s, int ns) {
    switch (kernel) {
    case K_COPY: return k_copy(b, n);
    case K_ADD: return k_add(b, n);
    case K_SCALE: return k_scale(b, n, s, ns);
    case K_RELU: return k_relu(b, n);
    case K_GEMM: return k_gemm(env, b, n);
    case K_INT8_GEMM: return k_int8_gemm(b, n);
    case K_SUM: return k_sum(b, n);
    case K_SOFTMAX: return k_softmax(b, n);
    case K_CONV2D: return k_conv2d(b, n);
    case K_NORMALIZE: return k_normalize(b, n, s, ns);
    default: return 1;
    }
}
