/*
 * core_type.c -- hostless._core.Core: one domain's engine context as a Python
 * object.  Each method parses its arguments, calls the engine (which releases
 * the GIL around its blocking sections through the hooks) and maps a failing
 * code to its exception (errors.c).
 */
#include "binding.h"

static void Core_dealloc(Core *c) {
    hle_ctx_destroy(&c->ctx);
    hlpy_free((PyObject *)c);
}

static PyObject *Core_tp_new(PyTypeObject *t, PyObject *a, PyObject *k) {
    Core *c = (Core *)hlpy_alloc(t, 0);
    if (!c) return NULL;
    hle_ctx_init(&c->ctx);
    hlpy_set_hooks(&c->ctx);
    return (PyObject *)c;
}

/* attach(fd, init: tuple|None, label, kind, watchdog_ns) -- map the domain
 * (initialising it when init is given), validate, join. */
static PyObject *Core_attach(Core *c, PyObject *args) {
    int fd;
    PyObject *init;
    const char *label, *kind;
    unsigned long long wd_ns;
    if (!PyArg_ParseTuple(args, "iOssK", &fd, &init, &label, &kind, &wd_ns)) return NULL;
    struct hle_init in, *inp = NULL;
    if (init != Py_None) {
        unsigned long long f, p, q, t, hs, tag, poll;
        PyObject *devs = NULL;
        if (!PyArg_ParseTuple(init, "KKKKKKK|O", &f, &p, &q, &t, &hs, &tag, &poll, &devs)) return NULL;
        in = (struct hle_init){f, p, q, t, hs, tag, poll, 0, {0}, {0}};
        if (hlpy_parse_devheaps(devs, &in) < 0) return NULL;
        inp = &in;
    }
    int r = hle_attach(&c->ctx, fd, inp, label, kind, wd_ns);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* leave: recover ourselves (drops every reference, owned ACTIVE fences become
 * OWNER_DIED), free our slot, unlock, unmap. */
static PyObject *Core_leave(Core *c, PyObject *noargs) {
    hle_leave(&c->ctx);
    Py_RETURN_NONE;
}

/* forget the mapping without touching shared state (after fork, in the child) */
static PyObject *Core_abandon(Core *c, PyObject *noargs) {
    hle_abandon(&c->ctx);
    Py_RETURN_NONE;
}

/* create(kind, owner) -> handle */
static PyObject *Core_create(Core *c, PyObject *args) {
    unsigned int kind, owner;
    NEED_ATTACHED(c);
    if (!PyArg_ParseTuple(args, "II", &kind, &owner)) return NULL;
    uint64_t h;
    int r = hle_create(&c->ctx, kind, owner, &h);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(h);
}

/* merge([handles]) -> handle of a new merged fence */
static PyObject *Core_merge(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    PyObject *seq = PySequence_Fast(arg, "merge expects a sequence of handles");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t hs[HL_MERGE_MAX_CHILDREN];
    if (n >= 1 && n <= HL_MERGE_MAX_CHILDREN) {
        for (Py_ssize_t i = 0; i < n; i++) {
            hs[i] = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
        }
    }
    Py_DECREF(seq);
    uint64_t ph;
    int r = hle_merge(&c->ctx, hs, n > 1000000 ? 1000000 : (int)n, &ph);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(ph);
}

/* merge_points([(handle, value)]) -> (handle of a new merged fence, [watch node handles]);
 * value is a timeline child's point, ignored for fences */
static PyObject *Core_merge_points(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    PyObject *seq = PySequence_Fast(arg, "merge_points expects a sequence of (handle, value)");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint64_t hs[HL_MERGE_MAX_CHILDREN], vs[HL_MERGE_MAX_CHILDREN];
    if (n >= 1 && n <= HL_MERGE_MAX_CHILDREN) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &hs[i], &vs[i])) {
                Py_DECREF(seq);
                return NULL;
            }
        }
    }
    Py_DECREF(seq);
    uint64_t ph, ws[HL_MERGE_MAX_CHILDREN];
    int nw = 0;
    int r = hle_merge_points(&c->ctx, hs, vs, n > 1000000 ? 1000000 : (int)n, &ph, ws, &nw);
    if (r) return hlpy_raise(r);
    PyObject *lst = PyList_New(nw);
    if (!lst) return NULL;
    for (int i = 0; i < nw; i++) PyList_SET_ITEM(lst, i, PyLong_FromUnsignedLongLong(ws[i]));
    return Py_BuildValue("(KN)", (unsigned long long)ph, lst);
}

static PyObject *Core_release(Core *c, PyObject *arg) {
    uint64_t h;
    NEED_ATTACHED(c);
    if (hlpy_handle_arg(arg, &h) < 0) return NULL;
    int r = hle_release(&c->ctx, h);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

static PyObject *Core_signal(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "signal(handle, status)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long s = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    int r = hle_signal(&c->ctx, h, s);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* word(handle) -> current completion word (any kind, must be held) */
static PyObject *Core_word(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg), w;
    if (PyErr_Occurred()) return NULL;
    int r = hle_word(&c->ctx, h, &w);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(w);
}

/* aux(handle) -> aux word (timeline: value before failure) */
static PyObject *Core_aux(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg), w;
    if (PyErr_Occurred()) return NULL;
    int r = hle_aux(&c->ctx, h, &w);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLongLong(w);
}

/* point_status(handle, value, word) -> int: hle_point_status (a timeline we hold) */
static PyObject *Core_point_status(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "point_status(handle, value, word)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]), v = PyLong_AsUnsignedLongLong(args[1]),
             w = PyLong_AsUnsignedLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    uint32_t s;
    int r = hle_point_status(&c->ctx, h, v, w, &s);
    if (r) return hlpy_raise(r);
    return PyLong_FromUnsignedLong(s);
}

static PyObject *Core_tl_fail(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "tl_fail(handle, status)");
        return NULL;
    }
    uint64_t h = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    unsigned long long s = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "a failure status is an int: ERROR, CANCEL, OWNER_DIED or 64..2^32-1");
        return NULL;
    }
    int r = hle_timeline_fail(&c->ctx, h, s);
    if (r) return hlpy_raise(r);
    Py_RETURN_NONE;
}

/* wait_any([(handle, threshold), ...], timeout_ns, kick_seen) -> list of ready
 * positions.  Sleeps with futex_waitv on all words plus the private kick word. */
static PyObject *Core_wait_any(Core *c, PyObject *args) {
    PyObject *lst;
    long long timeout;
    unsigned int kick_seen;
    NEED_ATTACHED(c);
    if (!PyArg_ParseTuple(args, "OLI", &lst, &timeout, &kick_seen)) return NULL;
    PyObject *seq = PySequence_Fast(lst, "wait_any expects a list");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > 127) n = 127;
    uint64_t hs[128], thr[128];
    char ready[128];
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long h, th;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "KK", &h, &th)) {
            Py_DECREF(seq);
            return NULL;
        }
        hs[i] = h;
        thr[i] = th;
    }
    Py_DECREF(seq);
    int r = hle_wait_any(&c->ctx, hs, thr, (int)n, timeout, kick_seen, ready);
    if (r) return hlpy_raise(r);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!ready[i]) continue;
        PyObject *v = PyLong_FromSsize_t(i);
        if (!v || PyList_Append(out, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    return out;
}

static PyObject *Core_kick(Core *c, PyObject *noargs) {
    hle_kick(&c->ctx);
    Py_RETURN_NONE;
}

static PyObject *Core_kick_value(Core *c, PyObject *noargs) {
    return PyLong_FromUnsignedLong(__atomic_load_n(&c->ctx.kick, __ATOMIC_SEQ_CST));
}

static PyObject *Core_reap(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    uint64_t ids[HL_MAX_PARTICIPANTS];
    int n = hle_reap(&c->ctx, ids, HL_MAX_PARTICIPANTS);
    if (n < 0) return hlpy_raise(n);
    PyObject *out = PyList_New(n);
    if (!out) return NULL;
    for (int i = 0; i < n; i++) PyList_SET_ITEM(out, i, PyLong_FromUnsignedLongLong(ids[i]));
    return out;
}

/* participants() -> [(index, incarnation, state, recoverer, pid, start_time, joined_ns, label, kind, lock_held)] */
static PyObject *Core_participants(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    hle_ctx *x = &c->ctx;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    for (uint32_t i = 0; i < x->pcap; i++) {
        struct hl_participant *p = &x->parts[i];
        uint64_t pc = ld(&p->ctl);
        if (HL_PCTL_STATE(pc) == HL_PART_FREE) continue;
        char label[33], kind[17];
        memcpy(label, p->label, 32);
        label[32] = 0;
        memcpy(kind, p->kind, 16);
        kind[16] = 0;
        PyObject *t = Py_BuildValue("(IIIIIKKyyi)", i, HL_PCTL_INC(pc), HL_PCTL_STATE(pc), HL_PCTL_RECOVERER(pc),
                                    p->pid, (unsigned long long)p->start_time, (unsigned long long)p->joined_ns,
                                    label, kind, hle_lock_held(x, (int)i));
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_Append(out, t);
        Py_DECREF(t);
    }
    return out;
}

static PyObject *Core_lock_held(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    long i = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (i < 0 || (unsigned long)i >= c->ctx.pcap) {
        PyErr_SetString(PyExc_IndexError, "participant index out of range");
        return NULL;
    }
    return PyBool_FromLong(hle_lock_held(&c->ctx, (int)i));
}

static PyObject *Core_info(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    hle_ctx *x = &c->ctx;
    return Py_BuildValue("{s:i,s:I,s:K,s:I,s:I,s:I,s:K,s:O}", "me", x->me, "incarnation", x->inc, "size",
                         (unsigned long long)x->size, "fences", x->cap, "participants", x->pcap, "tag", x->tag,
                         "poll_ns", (unsigned long long)x->poll_ns, "meta_heap", x->meta_heap ? Py_True : Py_False);
}

/* view() -> the private layout of this domain (struct hl_dom), validated at
 * attach: offsets from the start of the mapping (0 = absent) and capacities.
 * Tools use it instead of re-reading the shared header. */
static PyObject *Core_view(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    const struct hl_dom *d = &c->ctx.dv;
    return Py_BuildValue("{s:K,s:K,s:I,s:K,s:I,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "size", (unsigned long long)d->size,
                         "participants_offset", (unsigned long long)((char *)d->parts - d->base),
                         "participant_capacity", d->participant_capacity, "fences_offset",
                         (unsigned long long)((char *)d->fences - d->base), "fence_capacity", d->fence_capacity,
                         "poll_ns", (unsigned long long)d->poll_ns, "heap_offset",
                         (unsigned long long)(d->heap ? (char *)d->heap - d->base : 0), "heap_data_offset",
                         (unsigned long long)(d->heap ? d->heap_data - d->base : 0), "heap_granules",
                         (unsigned long long)d->heap_granules, "heap_data_size", (unsigned long long)d->heap_data_size,
                         "trace_offset", (unsigned long long)(d->trace ? (char *)d->trace - d->base : 0),
                         "trace_capacity", (unsigned long long)d->trace_capacity);
}

/* guard_map(obj): put the memory of a buffer-protocol object (another
 * mapping of this domain's file, e.g. Domain.raw()) under the SIGBUS guard:
 * a truncation seen through it marks this domain truncated too. */
static PyObject *Core_guard_map(Core *c, PyObject *obj) {
    NEED_ATTACHED(c);
    Py_buffer v;
    if (PyObject_GetBuffer(obj, &v, PyBUF_SIMPLE) < 0) return NULL;
    hle_guard_add_region(&c->ctx, (uintptr_t)v.buf, (uintptr_t)v.buf + (uintptr_t)v.len);
    PyBuffer_Release(&v);
    Py_RETURN_NONE;
}

static PyObject *Core_address(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    return PyLong_FromVoidPtr(c->ctx.base);
}

/* buffer_info(handle) -> (absolute data offset in the mapping (0 for a device
 * buffer), nbytes, meta bytes, device heap index (-1: host), device offset) */
static PyObject *Core_buffer_info(Core *c, PyObject *arg) {
    NEED_ATTACHED(c);
    uint64_t h = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    int64_t idx = hle_check_handle(&c->ctx, h, HL_KIND_BUFFER, 1);
    if (idx < 0) return hlpy_raise((int)idx);
    const struct hl_dom *d = &c->ctx.dv;
    uint64_t nbytes = 0, doff = 0;
    uint32_t dev = 0;
    int r = hl_buffer_device(d, h, &dev, &doff, &nbytes);
    if (r == HL_OK) {
        /* its metadata: the start of its heap block (checked against the view) */
        struct hl_fence *f = slot(&c->ctx, (uint32_t)idx);
        uint64_t g = ld(&f->parents[0]), n = ld(&f->parents[1]);
        if (!d->heap || g > d->heap_granules || n > d->heap_granules - g || n * HL_GRANULE < HL_BUFFER_META_SIZE) {
            hle_fail(HL_E_CORRUPT, "device buffer 0x%llx has a metadata block outside the heap", (unsigned long long)h);
            return hlpy_raise(HL_E_CORRUPT);
        }
        return Py_BuildValue("(KKy#iK)", 0ull, (unsigned long long)nbytes, d->heap_data + g * HL_GRANULE,
                             (Py_ssize_t)HL_BUFFER_META_SIZE, (int)dev, (unsigned long long)doff);
    }
    if (r != HL_E_VALUE) {
        hle_fail(HL_E_CORRUPT, "buffer 0x%llx has a device placement outside its device heap", (unsigned long long)h);
        return hlpy_raise(HL_E_CORRUPT);
    }
    char *base = c->ctx.base;
    char *p = (char *)hl_buffer_data(d, h, &nbytes);
    if (!p || (uint64_t)(p - base) < HL_BUFFER_META_SIZE) {
        hle_fail(HL_E_CORRUPT, "buffer 0x%llx has an extent outside the heap", (unsigned long long)h);
        return hlpy_raise(HL_E_CORRUPT);
    }
    return Py_BuildValue("(KKy#iK)", (unsigned long long)(p - base), (unsigned long long)nbytes,
                         p - HL_BUFFER_META_SIZE, (Py_ssize_t)HL_BUFFER_META_SIZE, -1, 0ull);
}

/* heap_stats([pool]) -> dict (pool 0: the heap; i + 1: device heap i) */
static PyObject *Core_heap_stats(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    long pi = nargs >= 1 ? PyLong_AsLong(args[0]) : 0;
    if (PyErr_Occurred()) return NULL;
    struct hle_heap_stats s;
    struct hle_pool pool;
    if (pi < 0 || pi >= HLE_POOLS || !hle_pool(&c->ctx, (int)pi, &pool)) return Py_BuildValue("{s:K}", "size", 0ull);
    int r = hle_pool_stats(&c->ctx, (int)pi, &s);
    if (r) return hlpy_raise(r);
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}", "size", (unsigned long long)s.size, "used",
                         (unsigned long long)s.used, "free", (unsigned long long)s.free, "largest_free",
                         (unsigned long long)s.largest_free, "free_runs", (unsigned long long)s.free_runs, "repairs",
                         (unsigned long long)s.repairs, "allocs", (unsigned long long)s.allocs, "data_offset",
                         (unsigned long long)s.data_offset, "granule", (unsigned long long)s.granule);
}

/* heap_snapshot([pool]) -> (bitmap bytes, fence table bytes, used granules, granules) under
 * the pool's lock, for check(); None when the domain has no such pool */
static PyObject *Core_heap_snapshot(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    hle_ctx *x = &c->ctx;
    long pi = nargs >= 1 ? PyLong_AsLong(args[0]) : 0;
    if (PyErr_Occurred()) return NULL;
    struct hle_pool pool;
    if (pi < 0 || pi >= HLE_POOLS || !hle_pool(x, (int)pi, &pool)) Py_RETURN_NONE;
    PyObject *bits = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)hle_pool_bitmap_bytes(x, (int)pi));
    if (!bits) return NULL;
    PyObject *slots = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)((uint64_t)x->cap * HL_FENCE_SIZE));
    if (!slots) {
        Py_DECREF(bits);
        return NULL;
    }
    uint64_t used = 0;
    int r = hle_pool_snapshot(x, (int)pi, PyBytes_AS_STRING(bits), PyBytes_AS_STRING(slots), &used);
    if (r) {
        Py_DECREF(bits);
        Py_DECREF(slots);
        return hlpy_raise(r);
    }
    return Py_BuildValue("(NNKK)", bits, slots, (unsigned long long)used, (unsigned long long)pool.granules);
}

/* device_heaps() -> [(kind, ordinal), ...]: the device heaps validated at attach (private view) */
static PyObject *Core_device_heaps(Core *c, PyObject *noargs) {
    NEED_ATTACHED(c);
    const struct hl_dom *d = &c->ctx.dv;
    PyObject *out = PyList_New((Py_ssize_t)d->devheap_count);
    if (!out) return NULL;
    for (uint32_t i = 0; i < d->devheap_count; i++) {
        PyObject *t = Py_BuildValue("(II)", d->devheap_kind[i], d->devheap_ordinal[i]);
        if (!t) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static PyObject *Core_set_spin(Core *c, PyObject *arg) {
    long long v = PyLong_AsLongLong(arg);
    if (PyErr_Occurred()) return NULL;
    c->ctx.spin_ns = v < 0 ? 0 : v;
    Py_RETURN_NONE;
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL
static PyMethodDef Core_methods[] = {
    {"set_spin", (PyCFunction)Core_set_spin, METH_O, NULL},
    {"queue_new", (PyCFunction)Core_queue_new, METH_O, NULL},
    {"queue_bind", (PyCFunction)Core_queue_bind, METH_O, NULL},
    {"queue_push", FAST(Core_queue_push), NULL},
    {"queue_pop", FAST(Core_queue_pop), NULL},
    {"queue_info", (PyCFunction)Core_queue_info, METH_O, NULL},
    {"queue_completed", (PyCFunction)Core_queue_completed, METH_O, NULL},
    {"queue_doorbell_addr", (PyCFunction)Core_queue_doorbell_addr, METH_O, NULL},
    {"queue_view", (PyCFunction)Core_queue_view, METH_O, NULL},
    {"trace", FAST(Core_trace), NULL},
    {"trace_enabled", (PyCFunction)Core_trace_enabled, METH_NOARGS, NULL},
    {"new", FAST(Core_new_obj), NULL},
    {"adopt", FAST(Core_adopt), NULL},
    {"wrap", FAST(Core_wrap), NULL},
    {"new_buffer", FAST(Core_new_buffer), NULL},
    {"buffer_info", (PyCFunction)Core_buffer_info, METH_O, NULL},
    {"heap_stats", FAST(Core_heap_stats), NULL},
    {"heap_snapshot", FAST(Core_heap_snapshot), NULL},
    {"device_heaps", (PyCFunction)Core_device_heaps, METH_NOARGS, NULL},
    {"attach", (PyCFunction)Core_attach, METH_VARARGS, NULL},
    {"leave", (PyCFunction)Core_leave, METH_NOARGS, NULL},
    {"abandon", (PyCFunction)Core_abandon, METH_NOARGS, NULL},
    {"create", (PyCFunction)Core_create, METH_VARARGS, NULL},
    {"merge", (PyCFunction)Core_merge, METH_O, NULL},
    {"merge_points", (PyCFunction)Core_merge_points, METH_O, NULL},
    {"release", (PyCFunction)Core_release, METH_O, NULL},
    {"signal", FAST(Core_signal), NULL},
    {"word", (PyCFunction)Core_word, METH_O, NULL},
    {"aux", (PyCFunction)Core_aux, METH_O, NULL},
    {"point_status", FAST(Core_point_status), NULL},
    {"tl_fail", FAST(Core_tl_fail), NULL},
    {"wait_any", (PyCFunction)Core_wait_any, METH_VARARGS, NULL},
    {"kick", (PyCFunction)Core_kick, METH_NOARGS, NULL},
    {"kick_value", (PyCFunction)Core_kick_value, METH_NOARGS, NULL},
    {"wait_many", (PyCFunction)(void (*)(void))Core_wait_many, METH_FASTCALL, NULL},
    {"reap", (PyCFunction)Core_reap, METH_NOARGS, NULL},
    {"participants", (PyCFunction)Core_participants, METH_NOARGS, NULL},
    {"lock_held", (PyCFunction)Core_lock_held, METH_O, NULL},
    {"info", (PyCFunction)Core_info, METH_NOARGS, NULL},
    {"address", (PyCFunction)Core_address, METH_NOARGS, NULL},
    {"view", (PyCFunction)Core_view, METH_NOARGS, "the private layout validated at attach"},
    {"guard_map", (PyCFunction)Core_guard_map, METH_O, "put another mapping of the domain under the SIGBUS guard"},
    {"name_publish", FAST(Core_name_publish), NULL},
    {"name_remove", FAST(Core_name_remove), NULL},
    {"name_lookup", (PyCFunction)Core_name_lookup, METH_O, NULL},
    {"name_list", (PyCFunction)Core_name_list, METH_NOARGS, NULL},
    {"name_seq", (PyCFunction)Core_name_seq, METH_NOARGS, NULL},
    {"agent_run", (PyCFunction)Core_agent_run, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot Core_slots[] = {
    {Py_tp_new, (void *)Core_tp_new},
    {Py_tp_dealloc, (void *)Core_dealloc},
    {Py_tp_methods, Core_methods},
    {0, NULL},
};

PyType_Spec hlpy_core_spec = {"hostless._core.Core", sizeof(Core), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
                              Core_slots};
