/*
 * records.c -- what a participant without Python says about itself in the
 * domain: failure records (the layout of hostless.records: a "|u1" buffer of
 * UTF-8 text published as "!error:<handle in hex>") and named trace records
 * (hostless.trace's HL_EV_USER convention).  Contracts in hostless_engine.h.
 */
#include "engine.h"

#include <stdio.h>
#include <string.h>

int hle_buffer_new(hle_ctx *c, uint64_t nbytes, const char *dtype, uint32_t itemsize, uint32_t ndim,
                   const uint64_t *shape, uint64_t *handle, void **data) {
    int r = hle_need_attached(c);
    if (r) return r;
    struct hl_buffer_meta m;
    memset(&m, 0, sizeof m);
    size_t dl = dtype ? strlen(dtype) : 0;
    if (dl == 0 || dl >= sizeof m.dtype) return hle_fail(HL_E_VALUE, "dtype must be 1..15 characters");
    if (ndim > HL_BUFFER_MAX_DIMS || itemsize == 0)
        return hle_fail(HL_E_VALUE, "ndim %u / itemsize %u out of range", ndim, itemsize);
    uint64_t cnt = 1;
    for (uint32_t i = 0; i < ndim; i++) {
        if (shape[i] && cnt > UINT64_MAX / shape[i]) return hle_fail(HL_E_VALUE, "shape overflows");
        cnt *= shape[i];
        m.shape[i] = shape[i];
    }
    if (cnt > UINT64_MAX / itemsize || cnt * itemsize != nbytes)
        return hle_fail(HL_E_VALUE, "shape, itemsize and size (%llu bytes) disagree", (unsigned long long)nbytes);
    m.nbytes = nbytes;
    m.ndim = ndim;
    m.itemsize = itemsize;
    memcpy(m.dtype, dtype, dl);
    uint64_t off = 0;
    if ((r = hle_block_new(c, HL_KIND_BUFFER, nbytes, &m, 0, handle, &off))) return r;
    *data = c->base + off;
    return HL_OK;
}

int hle_record_write(hle_ctx *c, struct hle_records *rec, uint64_t handle, const char *text) {
    if (!handle) return hle_fail(HL_E_VALUE, "no handle to record a failure for");
    size_t n = text ? strlen(text) : 0;
    if (n == 0) text = "?", n = 1;
    if (n > HLE_RECORD_MAX) n = HLE_RECORD_MAX;
    uint64_t shape[1] = {n}, b = 0;
    void *data = NULL;
    int r = hle_buffer_new(c, n, "|u1", 1, 1, shape, &b, &data);
    if (r) return r;
    memcpy(data, text, n);
    char name[32];
    int len = snprintf(name, sizeof name, "!error:%llx", (unsigned long long)handle);
    if ((r = hle_name_publish(c, name, (size_t)len, b, 1, NULL))) {
        hle_release(c, b);
        return r;
    }
    if (rec->n == HLE_RECORD_KEEP) /* the oldest one goes (its name dies with it) */
        hle_release(c, rec->kept[rec->next]);
    else
        rec->n++;
    rec->kept[rec->next] = b;
    rec->next = (rec->next + 1) % HLE_RECORD_KEEP;
    return HL_OK;
}

void hle_records_close(hle_ctx *c, struct hle_records *rec) {
    for (uint32_t i = 0; i < rec->n && i < HLE_RECORD_KEEP; i++) hle_release(c, rec->kept[(rec->next + i) % HLE_RECORD_KEEP]);
    rec->n = rec->next = 0;
}

void hle_trace_user(hle_ctx *c, uint32_t type, uint64_t key, const char *text) {
    if (!c->trace || c->me < 0) return;
    uint64_t w[HLE_TRACE_TEXT_BYTES / 8] = {0, 0, 0};
    size_t len = text ? strlen(text) : 0, n = len < sizeof w ? len : sizeof w;
    while (n > 0 && n < len && ((unsigned char)text[n] & 0xc0) == 0x80) n--; /* whole UTF-8 characters */
    memcpy(w, text, n);
    hle_trace_emit(c, HL_EV_USER, HLE_TRACE_USER_MAGIC | type, key, w[0], w[1], w[2]);
}
