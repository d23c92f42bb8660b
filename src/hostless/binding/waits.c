/*
 * waits.c -- waits over several objects of one domain: Core.wait_many over
 * (handle, value) pairs, and hostless._core.wait_any / wait_all, which are
 * hl.wait_any / hl.wait_all themselves: a list or tuple of held Fences and
 * Points of one domain is one call (the objects read from their C structs,
 * no Python code runs while they are read; the engine's hle_wait_many, or
 * hle_wait for each in turn); anything else goes to the Python general paths
 * registered with set_completed.  One parser reads the items of all of them;
 * WaitSet (waitset.c) shares wait_all's loop and error.
 */
#include "binding.h"

#include <math.h>

static PyObject *g_completed, *g_any_general, *g_all_general, *g_s_timeout;

/* One (handle, value) from a held Fence / merged fence (value 0) or a Point
 * (its timeline's handle, its value: read from its C base, point.c) of core
 * *c (NULL: the first item's core, stored there): 1; 0 when it is none of
 * those (another domain, released, a bare Timeline, another type). */
/* A Handle (Fence and Timeline subclass it): the type's MRO is short, and no
 * PyTypeObject field is read (the limited API's types are opaque). */
static inline int is_handle(PyObject *o) { return PyObject_TypeCheck(o, HandleType); }

int hlpy_object_pair(Core **c, PyObject *o, uint64_t *h, uint64_t *v) {
    Handle *x;
    uint64_t val = 0;
    if (is_handle(o)) {
        x = (Handle *)o;
        uint32_t k = HL_HANDLE_KIND(x->handle);
        if (k != HL_KIND_FENCE && k != HL_KIND_MERGED) return 0;
    } else if (PyObject_TypeCheck(o, PointType)) {
        HlPoint *p = (HlPoint *)o;
        if (!is_handle(p->timeline)) return 0;
        x = (Handle *)p->timeline;
        if (HL_HANDLE_KIND(x->handle) != HL_KIND_TIMELINE) return 0;
        val = p->v;
    } else {
        return 0;
    }
    if ((*c && x->core != *c) || !x->held) return 0;
    *c = x->core;
    *h = x->handle;
    *v = val;
    return 1;
}

/* A (handle, value) tuple: 1, or -1 with TypeError / OverflowError. */
static int tuple_pair(PyObject *t, uint64_t *h, uint64_t *v) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2) {
        PyErr_SetString(PyExc_TypeError, "wait_many expects (handle, value) pairs");
        return -1;
    }
    *h = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 0));
    if (*h == (uint64_t)-1 && PyErr_Occurred()) return -1;
    *v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 1));
    if (*v == (uint64_t)-1 && PyErr_Occurred()) return -1;
    return 1;
}

/* The one parser of both entry points: the n items of list or tuple `seq`
 * into hs / vs, as pairs (objects = 0) or as Fences / Points of one core
 * (objects = 1; *c NULL: found from the first).  Returns n (1..
 * HLE_WAIT_MANY_MAX); 0 when the objects do not fit the one-call path; -1
 * with an exception (pairs: a bad pair, a bad count). */
static Py_ssize_t wait_items(Core **c, PyObject *seq, int objects, uint64_t *hs, uint64_t *vs) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > HLE_WAIT_MANY_MAX) {
        if (objects) return 0;
        PyErr_Format(PyExc_ValueError, "wait_many takes 1..%d objects, got %zd", HLE_WAIT_MANY_MAX, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *it = PySequence_Fast_GET_ITEM(seq, i);
        int r = objects ? hlpy_object_pair(c, it, &hs[i], &vs[i]) : tuple_pair(it, &hs[i], &vs[i]);
        if (r <= 0) return r;
    }
    return n;
}

/* hle_wait_many with the GIL hooks of the context; the engine code. */
static int wait_on(Core *c, const uint64_t *hs, const uint64_t *vs, Py_ssize_t n, int64_t timeout, int64_t spin,
                   int *idx, uint64_t *w) {
    if (spin < 0) spin = c->ctx.spin_ns;
    return hle_wait_many(&c->ctx, hs, vs, (int)n, timeout, spin, idx, w);
}

/* Core.wait_many([(handle, value), ...], timeout_ns, spin_ns) -> (index, word):
 * the first complete object in list order (a point carries its value, a fence
 * 0); timeout_ns < 0: forever; spin_ns < 0: the domain's spin.  TimeoutError,
 * KeyboardInterrupt, InvalidHandle as the single waits. */
PyObject *Core_wait_many(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    NEED_ATTACHED(c);
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait_many(pairs, timeout_ns, spin_ns)");
        return NULL;
    }
    long long timeout = PyLong_AsLongLong(args[1]);
    if (timeout == -1 && PyErr_Occurred()) return NULL;
    long long spin = PyLong_AsLongLong(args[2]);
    if (spin == -1 && PyErr_Occurred()) return NULL;
    PyObject *seq = PySequence_Fast(args[0], "wait_many expects a sequence of (handle, value)");
    if (!seq) return NULL;
    uint64_t hs[HLE_WAIT_MANY_MAX], vs[HLE_WAIT_MANY_MAX];
    Py_ssize_t n = wait_items(&c, seq, 0, hs, vs);
    Py_DECREF(seq);
    if (n < 0) return NULL;
    int idx = -1;
    uint64_t w = 0;
    int r = wait_on(c, hs, vs, n, timeout, spin, &idx, &w);
    if (r) return hlpy_raise(r);
    return Py_BuildValue("(iK)", idx, (unsigned long long)w);
}

/* set_completed(cls, wait_any_general, wait_all_general): the tuple subclass
 * wait_any / wait_all return (hostless.Completed), and the Python functions
 * that take what the one-call paths do not (several domains, more than
 * HLE_WAIT_MANY_MAX objects, an iterable that is not a list or tuple, bad
 * input: they say what is wrong). */
static PyObject *py_set_completed(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyType_Check(args[0]) || !PyType_IsSubtype((PyTypeObject *)args[0], &PyTuple_Type) ||
        !PyCallable_Check(args[1]) || !PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "set_completed(cls, wait_any_general, wait_all_general): a tuple subclass "
                        "(hostless.Completed) and two functions");
        return NULL;
    }
    Py_XSETREF(g_completed, Py_NewRef(args[0]));
    Py_XSETREF(g_any_general, Py_NewRef(args[1]));
    Py_XSETREF(g_all_general, Py_NewRef(args[2]));
    Py_RETURN_NONE;
}

/* The timeout argument of hl.wait_any in ns: None -> -1 (forever); a
 * negative or NaN number is ValueError, another type TypeError. */
int hlpy_timeout_ns(PyObject *t, int64_t *out) {
    if (t == Py_None) {
        *out = -1;
        return 0;
    }
    double d = PyFloat_AsDouble(t);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (!(d >= 0)) {
        PyErr_SetString(PyExc_ValueError, "timeout must be >= 0 or None");
        return -1;
    }
    *out = d * 1e9 >= 9.2e18 ? INT64_MAX : (int64_t)(d * 1e9);
    return 0;
}

/* The final status of object (h, v) that read word w >= its threshold: a
 * fence's status; a timeline's failure or SUCCESS (as Timeline.wait). */
PyObject *hlpy_pair_status(Core *c, uint64_t h, uint64_t v, uint64_t w) {
    return HL_HANDLE_KIND(h) == HL_KIND_TIMELINE ? hlpy_timeline_status(&c->ctx, h, v, w) : hlpy_status_obj(w);
}

/* Every (hs[i], vs[i]) in turn, within tmo ns in all (< 0: no limit): HL_OK,
 * or the engine's code (HL_E_TIMEOUT, HL_E_INTR, ...) with *at the index it
 * stopped at.  The GIL is released while each wait sleeps. */
int hlpy_wait_all_pairs(Core *c, const uint64_t *hs, const uint64_t *vs, Py_ssize_t n, int64_t tmo,
                        Py_ssize_t *at) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t t0 = (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t left = tmo;
        if (tmo >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &ts);
            int64_t el = (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec - t0;
            left = el >= tmo ? 0 : tmo - el;
        }
        uint64_t w = 0;
        uint64_t thr = HL_HANDLE_KIND(hs[i]) == HL_KIND_TIMELINE ? vs[i] : 1;
        int r = hle_wait(&c->ctx, hs[i], thr, left, c->ctx.spin_ns, &w);
        if (r) {
            *at = i;
            return r;
        }
    }
    return HL_OK;
}

/* NULL with the error of a wait_all over the n pairs that ended with code r at
 * index at: TimeoutError saying how many completed (t: the timeout given),
 * else the engine's error. */
PyObject *hlpy_wait_all_error(Core *c, const uint64_t *hs, const uint64_t *vs, Py_ssize_t n, int r,
                              Py_ssize_t at, PyObject *t) {
    if (r != HL_E_TIMEOUT) return hlpy_raise(r);
    Py_ssize_t done = 0;
    for (Py_ssize_t k = 0; k < n; k++) {
        uint64_t w = 0;
        uint64_t thr = HL_HANDLE_KIND(hs[k]) == HL_KIND_TIMELINE ? vs[k] : 1;
        if (hle_word(&c->ctx, hs[k], &w) == HL_OK && w >= thr) done++;
    }
    return PyErr_Format(PyExc_TimeoutError, "%zd of %zd objects completed within %S s (the first pending: index %zd)",
                        done, n, t, at);
}

/* Completed(i, obj, status) (a new reference; steals nothing) */
static PyObject *completed(Py_ssize_t i, PyObject *obj, PyObject *st) {
    PyTypeObject *ct = (PyTypeObject *)g_completed;
    PyObject *idx = PyLong_FromSsize_t(i);
    PyObject *out = idx ? hlpy_alloc(ct, 3) : NULL;
    if (!out) {
        Py_XDECREF(idx);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, idx);
    PyTuple_SET_ITEM(out, 1, Py_NewRef(obj));
    PyTuple_SET_ITEM(out, 2, Py_NewRef(st));
    return out;
}

/* The arguments (objs, timeout=None) of wait_any / wait_all; the objects'
 * pairs when objs is a list or tuple of 1..HLE_WAIT_MANY_MAX held Fences and
 * Points of one domain, with a strong reference to each object (the list may
 * change while the GIL is released): n; 0 for the general path; -1 with an
 * exception (a bad argument list). */
struct objs_call {
    PyObject *objs, *timeout;
    Core *c;
    Py_ssize_t n;
    uint64_t hs[HLE_WAIT_MANY_MAX], vs[HLE_WAIT_MANY_MAX];
    PyObject *held[HLE_WAIT_MANY_MAX];
};

static Py_ssize_t objs_args(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            struct objs_call *oc) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    oc->objs = NULL;
    oc->timeout = Py_None;
    oc->c = NULL;
    oc->n = 0;
    if (nargs > 2 || nargs + nkw > 2) {
        PyErr_Format(PyExc_TypeError, "%s(objs, timeout=None) takes at most 2 arguments", fn);
        return -1;
    }
    if (nargs >= 1) oc->objs = args[0];
    if (nargs == 2) oc->timeout = args[1];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k), *val = args[nargs + k];
        if (!g_s_timeout && !(g_s_timeout = PyUnicode_InternFromString("timeout"))) return -1;
        if ((name == g_s_timeout || (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "timeout") == 0)) &&
            nargs < 2) {
            oc->timeout = val;
        } else if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "objs") == 0 && nargs < 1) {
            oc->objs = val;
        } else {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected or repeated keyword argument %R", fn, name);
            return -1;
        }
    }
    if (!oc->objs) {
        PyErr_Format(PyExc_TypeError, "%s() missing the argument objs", fn);
        return -1;
    }
    if (!g_completed || !(PyList_Check(oc->objs) || PyTuple_Check(oc->objs))) return 0;
    Py_ssize_t n = wait_items(&oc->c, oc->objs, 1, oc->hs, oc->vs);
    if (n <= 0) return n;
    for (Py_ssize_t k = 0; k < n; k++) oc->held[k] = Py_NewRef(PySequence_Fast_GET_ITEM(oc->objs, k));
    Py_INCREF((PyObject *)oc->c);
    oc->n = n;
    return n;
}

static void objs_done(struct objs_call *oc) {
    for (Py_ssize_t k = 0; k < oc->n; k++) Py_DECREF(oc->held[k]);
    if (oc->n) Py_DECREF((PyObject *)oc->c);
    oc->n = 0;
}

static PyObject *general(PyObject *fn, struct objs_call *oc) {
    if (!fn) {
        PyErr_SetString(PyExc_RuntimeError, "hostless.waits is not imported (import hostless)");
        return NULL;
    }
    /* not PyObject_Vectorcall: the limited API of 3.11 lacks it (the general path is not the fast one) */
    return PyObject_CallFunctionObjArgs(fn, oc->objs, oc->timeout, NULL);
}

/* wait_any(objs, timeout=None) -> Completed: hl.wait_any.  One call when objs
 * is a list or tuple of held Fences and Points of one domain (the engine's
 * hle_wait_many over every word); else the Python general path. */
static PyObject *py_wait_any(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    struct objs_call oc;
    Py_ssize_t n = objs_args("wait_any", args, nargs, kwnames, &oc);
    if (n < 0) return NULL;
    if (n == 0) return general(g_any_general, &oc);
    int64_t timeout;
    PyObject *out = NULL;
    if (hlpy_timeout_ns(oc.timeout, &timeout) == 0) {
        int idx = -1;
        uint64_t w = 0;
        int r = wait_on(oc.c, oc.hs, oc.vs, n, timeout, -1, &idx, &w);
        if (r == HL_E_TIMEOUT) {
            PyErr_Format(PyExc_TimeoutError, "none of %zd objects completed within %S s", n, oc.timeout);
        } else if (r) {
            hlpy_raise(r);
        } else {
            PyObject *st = hlpy_pair_status(oc.c, oc.hs[idx], oc.vs[idx], w);
            if (st) {
                out = completed(idx, oc.held[idx], st);
                Py_DECREF(st);
            }
        }
    }
    objs_done(&oc);
    return out;
}

/* wait_all(objs, timeout=None) -> list[Completed]: hl.wait_all.  One call
 * when objs is a list or tuple of held Fences and Points of one domain (each
 * waited for in turn, then every status read); else the Python general path. */
static PyObject *py_wait_all(PyObject *m, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    struct objs_call oc;
    Py_ssize_t n = objs_args("wait_all", args, nargs, kwnames, &oc);
    if (n < 0) return NULL;
    if (n == 0) return general(g_all_general, &oc);
    int64_t timeout;
    PyObject *out = NULL;
    if (hlpy_timeout_ns(oc.timeout, &timeout) == 0) {
        Py_ssize_t at = 0;
        int r = hlpy_wait_all_pairs(oc.c, oc.hs, oc.vs, n, timeout, &at);
        if (r) {
            hlpy_wait_all_error(oc.c, oc.hs, oc.vs, n, r, at, oc.timeout);
        } else if ((out = PyList_New(n))) {
            for (Py_ssize_t i = 0; i < n; i++) {
                uint64_t w = 0;
                int e = hle_word(&oc.c->ctx, oc.hs[i], &w);
                PyObject *st = e ? hlpy_raise(e) : hlpy_pair_status(oc.c, oc.hs[i], oc.vs[i], w);
                PyObject *one = st ? completed(i, oc.held[i], st) : NULL;
                Py_XDECREF(st);
                if (!one) {
                    Py_CLEAR(out);
                    break;
                }
                PyList_SET_ITEM(out, i, one);
            }
        }
    }
    objs_done(&oc);
    return out;
}

#define KW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
PyMethodDef hlpy_wait_methods[] = {
    {"wait_any", KW(py_wait_any),
     "wait_any(objs, timeout=None)\n--\n\n"
     "Block until one of ``objs`` (Fences, merged ones included, and timeline\n"
     "Points: timeline.point(v); any mix, any domains this process joined) has\n"
     "completed; returns it as Completed(index, obj, status), the first in the\n"
     "list's order among those complete.  A failure completes an object too (its\n"
     "status says so).  Raises TimeoutError after ``timeout`` seconds (None: no\n"
     "limit), KeyboardInterrupt on Ctrl-C (within a few ms), TypeError for what is\n"
     "not a Fence or Point, InvalidHandle for a released one, ValueError for an\n"
     "empty list.  A list or tuple of objects of one domain is one engine call."},
    {"wait_all", KW(py_wait_all),
     "wait_all(objs, timeout=None)\n--\n\n"
     "Block until every one of ``objs`` has completed; returns them all as\n"
     "Completed(index, obj, status), in the list's order (a failure completes an\n"
     "object too: check ``ok``).  Raises TimeoutError after ``timeout`` seconds\n"
     "(None: no limit) saying how many completed, KeyboardInterrupt on Ctrl-C, and\n"
     "the errors of wait_any for bad input."},
    {"set_completed", (PyCFunction)(void (*)(void))py_set_completed, METH_FASTCALL,
     "set_completed(cls, wait_any_general, wait_all_general): the type the waits return, their general paths"},
    {NULL, NULL, 0, NULL},
};
