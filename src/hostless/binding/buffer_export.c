/*
 * buffer_export.c -- the buffer protocol of Handle: a window of the domain's
 * mmap object, typed and shaped (C-contiguous) when its layout is known;
 * each export pins the mmap, so the mapping cannot be closed under a view.
 * A device buffer (bb_device) has no host window: its export raises
 * DeviceBufferError.
 */
#include "binding.h"

struct export {
    Py_buffer inner;                    /* pins the mmap */
    Py_ssize_t shape[HL_BUFFER_MAX_DIMS];
    Py_ssize_t strides[HL_BUFFER_MAX_DIMS];
};

int hlpy_handle_getbuffer(PyObject *o, Py_buffer *view, int flags) {
    Handle *b = (Handle *)o;
    if (b->bb_device && b->held) {
        uint32_t i = (uint32_t)b->bb_device - 1;
        const struct hl_dom *d = b->core ? &b->core->ctx.dv : NULL;
        unsigned ord = d && i < d->devheap_count ? d->devheap_ordinal[i] : i;
        char msg[200];
        snprintf(msg, sizeof msg,
                 "buffer 0x%llx lives in GPU memory (cuda:%u): the host cannot view it; "
                 "copy it with to_host(), or hand it to a GPU library through DLPack",
                 (unsigned long long)b->handle, ord);
        PyErr_SetString(hlpy_device_buffer_error(), msg);
        return -1;
    }
    if (!b->bb_map) {
        PyErr_SetString(PyExc_BufferError, b->held ? "this object has no memory" : "buffer was released");
        return -1;
    }
    if ((flags & PyBUF_WRITABLE) && b->bb_readonly) {
        PyErr_SetString(PyExc_BufferError, "buffer is read-only");
        return -1;
    }
    struct export *ex = PyMem_Malloc(sizeof(struct export));
    if (!ex) {
        PyErr_NoMemory();
        return -1;
    }
    Py_buffer *inner = &ex->inner;
    if (PyObject_GetBuffer(b->bb_map, inner, PyBUF_SIMPLE) < 0) {
        PyMem_Free(ex);
        return -1;
    }
    if (b->bb_off < 0 || b->bb_len < 0 || b->bb_off > inner->len || b->bb_len > inner->len - b->bb_off) {
        PyBuffer_Release(inner);
        PyMem_Free(ex);
        PyErr_SetString(PyExc_BufferError, "buffer window lies outside the mapping");
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)b, (char *)inner->buf + b->bb_off, b->bb_len, b->bb_readonly, flags) < 0) {
        PyBuffer_Release(inner);
        PyMem_Free(ex);
        return -1;
    }
    /* typed, shaped export (C-contiguous) when the layout is known and asked for */
    if (b->bb_ndim > 0 && (flags & PyBUF_ND) == PyBUF_ND) {
        Py_ssize_t st = b->bb_itemsize;
        for (int i = b->bb_ndim - 1; i >= 0; i--) {
            ex->shape[i] = b->bb_shape[i];
            ex->strides[i] = st;
            st *= b->bb_shape[i];
        }
        view->itemsize = b->bb_itemsize;
        view->format = (flags & PyBUF_FORMAT) ? b->bb_fmt : NULL;
        view->ndim = b->bb_ndim;
        view->shape = ex->shape;
        view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? ex->strides : NULL;
    }
    view->internal = ex;
    return 0;
}

void hlpy_handle_releasebuffer(PyObject *o, Py_buffer *view) {
    struct export *ex = (struct export *)view->internal;
    if (ex) {
        PyBuffer_Release(&ex->inner);
        PyMem_Free(ex);
    }
}

/* Set the typed layout of a window (0 dims: plain bytes). */
int hlpy_set_layout(Handle *b, const char *fmt, Py_ssize_t itemsize, PyObject *shape, Py_ssize_t len) {
    b->bb_ndim = 0;
    if (fmt && shape && shape != Py_None) {
        PyObject *seq = PySequence_Fast(shape, "shape must be a sequence");
        if (!seq) return -1;
        Py_ssize_t nd = PySequence_Fast_GET_SIZE(seq);
        Py_ssize_t total = itemsize;
        if (nd == 0) { /* a 0-d buffer exports plain bytes */
            Py_DECREF(seq);
            return 0;
        }
        if (nd < 1 || nd > HL_BUFFER_MAX_DIMS || strlen(fmt) >= sizeof b->bb_fmt || itemsize <= 0) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bad window layout");
            return -1;
        }
        for (Py_ssize_t i = 0; i < nd; i++) {
            b->bb_shape[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
            total *= b->bb_shape[i];
        }
        Py_DECREF(seq);
        if (PyErr_Occurred()) return -1;
        if (total != len) {
            PyErr_SetString(PyExc_ValueError, "window layout does not match its length");
            return -1;
        }
        strcpy(b->bb_fmt, fmt);
        b->bb_itemsize = itemsize;
        b->bb_ndim = (int)nd;
    }
    return 0;
}

PyObject *hlpy_handle_set_window(Handle *b, PyObject *args) {
    PyObject *map, *shape = NULL;
    Py_ssize_t off, len;
    int ro;
    const char *fmt = NULL;
    Py_ssize_t itemsize = 0;
    if (!PyArg_ParseTuple(args, "Onnp|snO", &map, &off, &len, &ro, &fmt, &itemsize, &shape)) return NULL;
    if (hlpy_set_layout(b, fmt, itemsize, shape, len) < 0) return NULL;
    if (map == Py_None)
        Py_CLEAR(b->bb_map);
    else
        Py_XSETREF(b->bb_map, Py_NewRef(map));
    b->bb_off = off;
    b->bb_len = len;
    b->bb_readonly = ro;
    Py_RETURN_NONE;
}

