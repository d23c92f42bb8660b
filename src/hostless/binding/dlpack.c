/*
 * dlpack.c -- DLPack capsules over memory hostless does not own per export:
 * device-resident heap buffers (kDLCUDA) and host buffers registered with a
 * GPU (kDLCUDAHost).  NumPy's own producer only speaks kDLCPU.
 *
 * A capsule holds a strong reference to `owner` (the hostless Buffer, which
 * holds the buffer's reference in the domain), so the memory stays allocated
 * while any consumer tensor lives.  The deleter may run on any thread, with or
 * without the GIL: it takes it.  Layout: DLPack 1.x (dlpack.h); the structs are
 * written out here because the ABI is fixed by the DLPack specification.
 */
#include "binding.h"

#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;
#define DLPACK_FLAG_BITMASK_READ_ONLY (1ull << 0)

/* One allocation: the managed tensor, then shape and strides. */
struct export {
    union {
        DLManagedTensor legacy;
        DLManagedTensorVersioned versioned;
    } m;
    PyObject *owner;
    int64_t dims[2 * HL_BUFFER_MAX_DIMS];
};

static void drop_owner(struct export *e) {
    PyGILState_STATE st = PyGILState_Ensure();
    Py_XDECREF(e->owner);
    PyGILState_Release(st);
    free(e);
}
static void deleter_legacy(DLManagedTensor *t) { drop_owner((struct export *)t->manager_ctx); }
static void deleter_versioned(DLManagedTensorVersioned *t) { drop_owner((struct export *)t->manager_ctx); }

/* A capsule never consumed still owns its tensor. */
static void capsule_legacy(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "used_dltensor")) return;
    DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
    if (!t) {
        PyErr_WriteUnraisable(cap);
        return;
    }
    t->deleter(t);
}
static void capsule_versioned(PyObject *cap) {
    if (PyCapsule_IsValid(cap, "used_dltensor_versioned")) return;
    DLManagedTensorVersioned *t = PyCapsule_GetPointer(cap, "dltensor_versioned");
    if (!t) {
        PyErr_WriteUnraisable(cap);
        return;
    }
    t->deleter(t);
}

/* dlpack_capsule(owner, data, shape, code, bits, device_type, device_id, versioned, readonly)
 *   -> a "dltensor" (versioned false) or "dltensor_versioned" capsule over
 *   `data` (an address), C-contiguous `shape`, element type (code, bits, 1
 *   lane).  Strides are always given (in elements).  The caller vouches for
 *   the memory: it lives while `owner` does. */
PyObject *hlpy_dlpack_capsule(PyObject *m, PyObject *args) {
    PyObject *owner, *shape;
    unsigned long long data;
    int code, bits, dev_type, dev_id, versioned, readonly;
    if (!PyArg_ParseTuple(args, "OKO!iiiipp", &owner, &data, &PyTuple_Type, &shape, &code, &bits, &dev_type,
                          &dev_id, &versioned, &readonly))
        return NULL;
    Py_ssize_t nd = PyTuple_GET_SIZE(shape);
    if (nd > HL_BUFFER_MAX_DIMS) return PyErr_Format(PyExc_ValueError, "at most %d dimensions", HL_BUFFER_MAX_DIMS);
    if (code < 0 || code > 255 || bits <= 0 || bits > 255)
        return PyErr_Format(PyExc_ValueError, "bad DLPack dtype (code %d, bits %d)", code, bits);
    struct export *e = calloc(1, sizeof *e);
    if (!e) return PyErr_NoMemory();
    int64_t *shp = e->dims, *str = e->dims + HL_BUFFER_MAX_DIMS;
    for (Py_ssize_t i = 0; i < nd; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if (v < 0) {
            free(e);
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "negative dimension");
            return NULL;
        }
        shp[i] = v;
    }
    int64_t step = 1;
    for (Py_ssize_t i = nd - 1; i >= 0; i--) {
        str[i] = step;
        step *= shp[i] > 0 ? shp[i] : 1;
    }
    DLTensor *t = versioned ? &e->m.versioned.dl_tensor : &e->m.legacy.dl_tensor;
    t->data = (void *)(uintptr_t)data;
    t->device.device_type = dev_type;
    t->device.device_id = dev_id;
    t->ndim = (int32_t)nd;
    t->dtype.code = (uint8_t)code;
    t->dtype.bits = (uint8_t)bits;
    t->dtype.lanes = 1;
    t->shape = shp;
    t->strides = str;
    t->byte_offset = 0;
    Py_INCREF(owner);
    e->owner = owner;
    PyObject *cap;
    if (versioned) {
        e->m.versioned.version.major = 1;
        e->m.versioned.version.minor = 0;
        e->m.versioned.manager_ctx = e;
        e->m.versioned.deleter = deleter_versioned;
        e->m.versioned.flags = readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
        cap = PyCapsule_New(&e->m.versioned, "dltensor_versioned", capsule_versioned);
    } else {
        e->m.legacy.manager_ctx = e;
        e->m.legacy.deleter = deleter_legacy;
        cap = PyCapsule_New(&e->m.legacy, "dltensor", capsule_legacy);
    }
    if (!cap) {
        Py_DECREF(owner);
        free(e);
    }
    return cap;
}
