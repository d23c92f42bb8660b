/*
 * codecs.c -- the formats the engine writes or decodes, offered to Python so
 * that each has one implementation: the ERT decoder of hostless_ert.h
 * (hostless.ert's decoding), failure records (hle_record_write: hostless.records)
 * and named trace records (hle_trace_user: hostless.trace).
 */
#include "binding.h"

#include <string.h>

static PyObject *ert_error(int e) {
    PyErr_SetString(PyExc_ValueError, hl_ert_why(e));
    return NULL;
}

/* u32 words of a sequence of ints (each taken mod 2**32 is refused: out of range raises). */
static int words_arg(PyObject *o, uint32_t *w, uint32_t cap, uint32_t *n) {
    PyObject *seq = PySequence_Fast(o, "a sequence of u32 words");
    if (!seq) return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if ((size_t)len > cap) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "more than %u ERT words", cap);
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        unsigned long v = PyLong_AsUnsignedLong(PySequence_Fast_GET_ITEM(seq, i));
        if ((v == (unsigned long)-1 && PyErr_Occurred()) || v > UINT32_MAX) {
            Py_DECREF(seq);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "an ERT word is a u32");
            return -1;
        }
        w[i] = (uint32_t)v;
    }
    *n = (uint32_t)len;
    Py_DECREF(seq);
    return 0;
}

static PyObject *u64_list(const uint32_t *w, uint32_t n) {
    PyObject *l = PyList_New(n);
    for (uint32_t i = 0; l && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(hl_ert_u64(w + 2 * i));
        if (!v) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, i, v);
    }
    return l;
}

/* ert_header(word) -> (state, custom, count, opcode, type) */
static PyObject *py_ert_header(PyObject *m, PyObject *arg) {
    unsigned long w = PyLong_AsUnsignedLong(arg);
    if (PyErr_Occurred()) return NULL;
    uint32_t h = (uint32_t)w;
    return Py_BuildValue("(IIIII)", hl_ert_state(h), hl_ert_custom(h), hl_ert_count(h), hl_ert_opcode(h),
                         hl_ert_type(h));
}

/* ert_with_state(word, state) -> word */
static PyObject *py_ert_with_state(PyObject *m, PyObject *args) {
    unsigned int w, st;
    if (!PyArg_ParseTuple(args, "II", &w, &st)) return NULL;
    return PyLong_FromUnsignedLong(hl_ert_with_state(w, st));
}

/* ert_decode(raw) -> (state, custom, opcode, type, cu_mask, payload): ValueError when the
 * header's count does not fit the buffer (hl_ert_check) */
static PyObject *py_ert_decode(PyObject *m, PyObject *arg) {
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t hdr = 0;
    if (b.len >= 4) memcpy(&hdr, b.buf, 4);
    int e = hl_ert_check(hdr, (uint64_t)b.len);
    if (e) {
        Py_ssize_t len = b.len;
        PyBuffer_Release(&b);
        if (e == HL_ERT_E_COUNT)
            return PyErr_Format(PyExc_ValueError, "ERT command count %u does not fit a %zd-byte buffer",
                                hl_ert_count(hdr), len);
        return ert_error(e);
    }
    uint32_t count = hl_ert_count(hdr), masks = hl_ert_has_cu_mask(hl_ert_opcode(hdr));
    const char *p = (const char *)b.buf + 4;
    uint32_t mask = 0;
    if (masks) memcpy(&mask, p, 4);
    PyObject *pl = PyList_New(count - masks);
    for (uint32_t i = masks; pl && i < count; i++) {
        uint32_t w;
        memcpy(&w, p + 4 * (size_t)i, 4);
        PyObject *v = PyLong_FromUnsignedLong(w);
        if (!v) {
            Py_CLEAR(pl);
            break;
        }
        PyList_SET_ITEM(pl, i - masks, v);
    }
    PyBuffer_Release(&b);
    if (!pl) return NULL;
    return Py_BuildValue("(IIIIIN)", hl_ert_state(hdr), hl_ert_custom(hdr), hl_ert_opcode(hdr), hl_ert_type(hdr),
                         mask, pl);
}

/* ert_cu_args(opcode, payload) -> (buffer handles, scalars): payload without the cu_mask */
static PyObject *py_ert_cu_args(PyObject *m, PyObject *args) {
    unsigned int op;
    PyObject *o;
    if (!PyArg_ParseTuple(args, "IO", &op, &o)) return NULL;
    static uint32_t w[HL_ERT_COUNT_MASK + 1]; /* the GIL is held */
    uint32_t n = 0;
    if (words_arg(o, w + 1, HL_ERT_COUNT_MASK, &n) < 0) return NULL;
    w[0] = 0; /* the cu_mask's place */
    struct hl_ert_args ea;
    int e = hl_ert_cu_args(w, n + 1, op, &ea);
    if (e) return ert_error(e);
    return Py_BuildValue("(NN)", u64_list(ea.bufs, ea.nbuf), u64_list(ea.scalars, ea.ns));
}

/* ert_chain(payload) -> [command handles] */
static PyObject *py_ert_chain(PyObject *m, PyObject *arg) {
    static uint32_t w[HL_ERT_COUNT_MASK]; /* the GIL is held */
    uint32_t n = 0, k = 0;
    const uint32_t *hw = NULL;
    if (words_arg(arg, w, HL_ERT_COUNT_MASK, &n) < 0) return NULL;
    int e = hl_ert_chain(w, n, &k, &hw);
    if (e) return ert_error(e);
    return u64_list(hw, k);
}

static Core *core_of(PyObject *o) {
    if (!PyObject_TypeCheck(o, CoreType)) {
        PyErr_SetString(PyExc_TypeError, "the first argument is a hostless._core.Core (dom._core)");
        return NULL;
    }
    return (Core *)o;
}

/* record_write(core, handle, text) -> bool: hle_record_write with the core's records (never raises
 * for the domain's reasons: False when the record could not be kept) */
static PyObject *py_record_write(PyObject *m, PyObject *args) {
    PyObject *co;
    unsigned long long h;
    const char *s;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OKs#", &co, &h, &s, &n)) return NULL;
    Core *c = core_of(co);
    if (!c) return NULL;
    char text[HLE_RECORD_MAX + 1];
    size_t k = (size_t)n < HLE_RECORD_MAX ? (size_t)n : HLE_RECORD_MAX;
    memcpy(text, s, k);
    for (size_t i = 0; i < k; i++)
        if (!text[i]) text[i] = '?'; /* a NUL would end the record early */
    text[k] = 0;
    if (!h || hle_usable(&c->ctx) != HL_OK) Py_RETURN_FALSE;
    int r = hle_record_write(&c->ctx, &c->records, h, text);
    if (r == HL_E_INTR && PyErr_Occurred()) return NULL;
    PyErr_Clear();
    return PyBool_FromLong(r == HL_OK);
}

/* records_close(core): release every record the core wrote */
static PyObject *py_records_close(PyObject *m, PyObject *co) {
    Core *c = core_of(co);
    if (!c) return NULL;
    if (hle_usable(&c->ctx) == HL_OK) hle_records_close(&c->ctx, &c->records);
    Py_RETURN_NONE;
}

/* trace_user(core, type, key, text): hle_trace_user (nothing without a trace ring) */
static PyObject *py_trace_user(PyObject *m, PyObject *args) {
    PyObject *co;
    unsigned int type;
    unsigned long long key;
    const char *s;
    if (!PyArg_ParseTuple(args, "OIKs", &co, &type, &key, &s)) return NULL;
    Core *c = core_of(co);
    if (!c) return NULL;
    if (hle_usable(&c->ctx) == HL_OK) hle_trace_user(&c->ctx, type, key, s);
    Py_RETURN_NONE;
}

PyMethodDef hlpy_codec_methods[] = {
    {"ert_header", py_ert_header, METH_O, "ert_header(word) -> (state, custom, count, opcode, type)"},
    {"ert_with_state", py_ert_with_state, METH_VARARGS, "ert_with_state(word, state) -> word"},
    {"ert_decode", py_ert_decode, METH_O, "ert_decode(raw) -> (state, custom, opcode, type, cu_mask, payload)"},
    {"ert_cu_args", py_ert_cu_args, METH_VARARGS, "ert_cu_args(opcode, payload) -> (buffers, scalars)"},
    {"ert_chain", py_ert_chain, METH_O, "ert_chain(payload) -> [command handles]"},
    {"record_write", py_record_write, METH_VARARGS, "record_write(core, handle, text) -> bool"},
    {"records_close", py_records_close, METH_O, "records_close(core)"},
    {"trace_user", py_trace_user, METH_VARARGS, "trace_user(core, type, key, text)"},
    {NULL, NULL, 0, NULL},
};
