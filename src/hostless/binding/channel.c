/*
 * channel.c -- the C fast path of channels (hostless.channel, hostless.subscriber):
 * hostless._core.ChannelRing, the C base of their _Ring (both sides' hot state),
 * and hostless._core.ChannelFrame, the C base of hostless.Frame.
 *
 * The common case of `with pub.loan() as f:` and `with sub.receive() as f:`
 * runs here without a Python frame: loan / receive are C methods of the ring
 * (channel_method(0) / (1): Channel.loan and Subscriber.receive), and the
 * frame's __enter__ / __exit__ are C.  The state the Python code reads and
 * writes (_frame, _closed, _next, _claimed, _seen, _fast) lives in the ring's
 * struct as members, so both paths see one state.  Anything unusual goes to
 * the Python code of before, which decides and raises as it always did:
 *
 * - loan: a frame still loaned, closed, a new name-table entry since the last
 *   look, a subscriber failed (dead, closed) or, blocking, behind, an engine
 *   error -> Channel._loan (the general path: adoption, grace, the wait).
 * - receive: a frame still loaned, closed, a timeout that is not a plain
 *   number >= 0, the published timeline failed (closed, dead publisher), the
 *   slot claimed for a later frame (skipping), an engine error -> Subscriber._receive.
 *   The wait for the frame is the engine's hle_wait (the one Timeline.wait
 *   makes: its spin, its sleep with the GIL released, Ctrl-C through the
 *   binding's interrupt hook); its timeout raises Subscriber._timeout's error.
 * - a frame's exit: a failed signal, closed, a frame overwritten (skip policy),
 *   an engine error -> the owner's _finish(frame, ok) (FrameOverwritten, ChannelError, ...).
 *
 * Everything read from shared memory goes through the engine (hle_word checks
 * the handle: kind, generation, held by us), the handles having been imported
 * and validated when the ring was set up; the ring holds the Core (no pointer
 * into the mapping) and the Timeline objects (a released one is not used: the
 * general path then raises InvalidHandle as before).  A closed domain fails
 * hle_need_attached: the general path raises what it did.  The GIL is held
 * throughout except inside hle_wait (its hooks).
 */
#include "binding.h"

#include <structmember.h>

#define CH_FAST_MAX 16 /* hostless.channel.MAX_SUBSCRIBERS: more go the general path */

enum { ROLE_NONE = 0, ROLE_PUB = 1, ROLE_SUB = 2 };

typedef struct {
    PyObject_HEAD
    PyObject *frame;            /* _frame: the Frame loaned out (NULL or None: none) */
    char closed;                /* _closed */
    char role;                  /* ROLE_*: set by _bind */
    unsigned long long next;    /* _next: publisher, the frame to loan; subscriber, the frame to receive */
    unsigned long long claimed; /* _claimed: the publisher's last value of `claimed` */
    long long seen;             /* _seen: the name table's change counter at the publisher's last look */
    Core *core;
    Handle *pub, *claim, *ack; /* the published / claimed timelines; the subscriber's acknowledgement one */
    unsigned long long depth;
    PyObject *views, *slots; /* tuples: each slot's view (NumPy, or the Buffer of a device slot), its Buffer */
    PyObject *fast;          /* _fast: ((ack handle, blocks), ...) of the publisher's subscribers */
    int nfast;               /* how many in fast_h; -1: more than CH_FAST_MAX (the general path) */
    uint64_t fast_h[CH_FAST_MAX];
    unsigned char fast_block[CH_FAST_MAX];
    unsigned long long hits[2]; /* fast loans / receives; fast exits (_fast_hits, for tests) */
} Ring;

typedef struct {
    PyObject_HEAD
    Ring *owner;
    PyObject *data, *buffer, *lost;
    unsigned long long seq;
    char open;
} ChFrame;

PyTypeObject *ChannelRingType, *ChannelFrameType;
static PyTypeObject *g_frame_cls; /* hostless.Frame (channel_frame_type) */
static PyObject *s_loan, *s_receive, *s_finish, *s_timeout, *g_minus_one;

/* ------------------------------------------------------------------ frames */

static PyObject *frame_make(PyTypeObject *cls, Ring *owner, unsigned long long seq, PyObject *data,
                            PyObject *buffer, PyObject *lost) {
    ChFrame *f = (ChFrame *)hlpy_alloc(cls, 0);
    if (!f) return NULL;
    f->owner = (Ring *)Py_NewRef((PyObject *)owner);
    f->data = Py_NewRef(data);
    f->buffer = Py_NewRef(buffer);
    f->lost = Py_NewRef(lost);
    f->seq = seq;
    f->open = 1;
    return (PyObject *)f;
}

/* Frame(owner, seq, data, buffer, lost): the general paths' frames (Channel._start, Subscriber._hand_out) */
static PyObject *Frame_new(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    static char *names[] = {"owner", "seq", "data", "buffer", "lost", NULL};
    PyObject *owner, *seq, *data, *buffer, *lost;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOOO:Frame", names, &owner, &seq, &data, &buffer, &lost))
        return NULL;
    if (!PyObject_TypeCheck(owner, ChannelRingType)) {
        PyErr_SetString(PyExc_TypeError, "a Frame's owner is a Channel or a Subscriber");
        return NULL;
    }
    unsigned long long n = PyLong_AsUnsignedLongLong(seq);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return frame_make(cls, (Ring *)owner, n, data, buffer, lost);
}

static int Frame_traverse(ChFrame *f, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)f));
    Py_VISIT((PyObject *)f->owner);
    Py_VISIT(f->data);
    Py_VISIT(f->buffer);
    Py_VISIT(f->lost);
    return 0;
}

static int Frame_clear(ChFrame *f) {
    Py_CLEAR(f->owner);
    Py_CLEAR(f->data);
    Py_CLEAR(f->buffer);
    Py_CLEAR(f->lost);
    return 0;
}

static void Frame_dealloc(ChFrame *f) {
    PyObject_GC_UnTrack(f);
    Frame_clear(f);
    hlpy_free((PyObject *)f);
}

static PyObject *Frame_enter(PyObject *f, PyObject *noargs) { return Py_NewRef(f); }

/* The Python _finish(frame, ok) of the frame's owner: the general path of an exit. */
static PyObject *finish_general(Ring *r, PyObject *f, int ok) {
    return PyObject_CallMethodObjArgs((PyObject *)r, s_finish, f, ok ? Py_True : Py_False, NULL);
}

static inline int no_frame(Ring *r) { return !r->frame || r->frame == Py_None; }

/* The engine context when the ring is bound, its domain attached and its timelines held; else NULL
 * (the general path decides).  No exception is set either way. */
static inline hle_ctx *live_ctx(Ring *r) {
    if (!r->core || !r->pub || !r->claim || !r->pub->held || !r->claim->held) return NULL;
    hle_ctx *c = &r->core->ctx;
    if (!c->base || c->me < 0 || TRUNCATED(c)) return NULL;
    return c;
}

static void set_frame_none(Ring *r) { Py_XSETREF(r->frame, Py_NewRef(Py_None)); }

/* __exit__(et, e, tb): publish (publisher; not when the block raised) or acknowledge (subscriber) */
static PyObject *Frame_exit(ChFrame *f, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "__exit__(et, e, tb)");
        return NULL;
    }
    if (!f->open) Py_RETURN_NONE;
    f->open = 0;
    Ring *r = f->owner;
    if (!r) Py_RETURN_NONE;
    int ok = nargs == 0 || args[0] == Py_None;
    Py_INCREF((PyObject *)r);
    PyObject *out = NULL;
    hle_ctx *c = live_ctx(r);
    uint64_t n = f->seq;
    if (r->role == ROLE_PUB && (!ok || r->closed)) {
        set_frame_none(r); /* nothing published (Channel._finish) */
        out = Py_NewRef(Py_None);
    } else if (r->role == ROLE_PUB && c && hle_timeline_signal(c, r->pub->handle, n) == HL_OK) {
        set_frame_none(r);
        r->next = n + 1;
        r->hits[1]++;
        out = Py_NewRef(Py_None);
    } else if (r->role == ROLE_SUB && c && !r->closed && r->ack && r->ack->held) {
        /* intact (read before the acknowledgement: after it the slot may be reused); a failed
         * claimed word is larger than any frame number: the general path */
        uint64_t w = 0;
        if (hle_word(c, r->claim->handle, &w) == HL_OK && w < n + r->depth &&
            hle_timeline_signal(c, r->ack->handle, n) == HL_OK) {
            set_frame_none(r);
            r->next = n + 1;
            r->hits[1]++;
            out = Py_NewRef(Py_None);
        }
    }
    if (!out) out = finish_general(r, (PyObject *)f, ok);
    Py_DECREF((PyObject *)r);
    return out;
}

static PyObject *Frame_get_open(ChFrame *f, void *closure) { return PyBool_FromLong(f->open); }

static int Frame_set_open(ChFrame *f, PyObject *v, void *closure) {
    int t = v ? PyObject_IsTrue(v) : 0;
    if (t < 0) return -1;
    f->open = (char)t;
    return 0;
}

static PyObject *Frame_get_owner(ChFrame *f, void *closure) {
    return Py_NewRef(f->owner ? (PyObject *)f->owner : Py_None);
}

static PyMethodDef Frame_methods[] = {
    {"__enter__", (PyCFunction)Frame_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Frame_exit, METH_FASTCALL,
     "Publish the frame (a loan; not when the block raised) or acknowledge it (a receive)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Frame_members[] = {
    {"seq", T_ULONGLONG, offsetof(ChFrame, seq), READONLY, "the frame's number (1, 2, ...)"},
    {"data", T_OBJECT, offsetof(ChFrame, data), 0, "the slot's view (a device slot: its Buffer)"},
    {"buffer", T_OBJECT, offsetof(ChFrame, buffer), 0, "the slot's Buffer"},
    {"lost", T_OBJECT, offsetof(ChFrame, lost), 0, "frames a subscriber skipped just before this one"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Frame_getset[] = {
    {"_open", (getter)Frame_get_open, (setter)Frame_set_open, "inside its with block (not released yet)", NULL},
    {"_owner", (getter)Frame_get_owner, NULL, "the Channel or Subscriber that loaned it", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Frame_slots[] = {
    {Py_tp_doc, (void *)"The C base of hostless.Frame (a loaned slot of a channel)."},
    {Py_tp_new, (void *)Frame_new},
    {Py_tp_dealloc, (void *)Frame_dealloc},
    {Py_tp_traverse, (void *)Frame_traverse},
    {Py_tp_clear, (void *)Frame_clear},
    {Py_tp_methods, Frame_methods},
    {Py_tp_members, Frame_members},
    {Py_tp_getset, Frame_getset},
    {0, NULL},
};

PyType_Spec hlpy_channel_frame_spec = {
    "hostless._core.ChannelFrame", sizeof(ChFrame), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, Frame_slots};

/* -------------------------------------------------------------------- ring */

static int Ring_traverse(Ring *r, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE((PyObject *)r));
    Py_VISIT(r->frame);
    Py_VISIT((PyObject *)r->core);
    Py_VISIT((PyObject *)r->pub);
    Py_VISIT((PyObject *)r->claim);
    Py_VISIT((PyObject *)r->ack);
    Py_VISIT(r->views);
    Py_VISIT(r->slots);
    Py_VISIT(r->fast);
    return 0;
}

static int Ring_clear(Ring *r) {
    Py_CLEAR(r->frame);
    Py_CLEAR(r->core);
    Py_CLEAR(r->pub);
    Py_CLEAR(r->claim);
    Py_CLEAR(r->ack);
    Py_CLEAR(r->views);
    Py_CLEAR(r->slots);
    Py_CLEAR(r->fast);
    r->role = ROLE_NONE;
    r->nfast = 0;
    return 0;
}

static void Ring_dealloc(Ring *r) {
    PyObject_GC_UnTrack(r);
    Ring_clear(r);
    hlpy_free((PyObject *)r);
}

static PyObject *Ring_new(PyTypeObject *cls, PyObject *args, PyObject *kw) {
    Ring *r = (Ring *)hlpy_alloc(cls, 0);
    if (!r) return NULL;
    r->seen = -1;
    return (PyObject *)r;
}

static int is_timeline(PyObject *o) {
    return PyObject_TypeCheck(o, HandleType) && HL_HANDLE_KIND(((Handle *)o)->handle) == HL_KIND_TIMELINE;
}

/* _bind(core, pub, claim, views, slots, subscriber): the ring's objects, once (_Ring._init_ring) */
static PyObject *Ring_bind(Ring *r, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyObject_TypeCheck(args[0], CoreType) || !is_timeline(args[1]) || !is_timeline(args[2]) ||
        !PyTuple_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "_bind(core, pub: Timeline, claim: Timeline, views: tuple, slots: tuple, subscriber: bool)");
        return NULL;
    }
    Py_ssize_t d = PyTuple_GET_SIZE(args[3]);
    if (d < 1 || PyTuple_GET_SIZE(args[4]) != d) {
        PyErr_SetString(PyExc_ValueError, "_bind: one view per slot, at least one slot");
        return NULL;
    }
    int sub = PyObject_IsTrue(args[5]);
    if (sub < 0) return NULL;
    Py_XSETREF(r->core, (Core *)Py_NewRef(args[0]));
    Py_XSETREF(r->pub, (Handle *)Py_NewRef(args[1]));
    Py_XSETREF(r->claim, (Handle *)Py_NewRef(args[2]));
    Py_XSETREF(r->views, Py_NewRef(args[3]));
    Py_XSETREF(r->slots, Py_NewRef(args[4]));
    r->depth = (unsigned long long)d;
    r->role = sub ? ROLE_SUB : ROLE_PUB;
    Py_RETURN_NONE;
}

/* _bind_ack(ack): the subscriber's acknowledgement timeline (Subscriber._publish) */
static PyObject *Ring_bind_ack(Ring *r, PyObject *ack) {
    if (!is_timeline(ack)) {
        PyErr_SetString(PyExc_TypeError, "_bind_ack(ack: Timeline)");
        return NULL;
    }
    Py_XSETREF(r->ack, (Handle *)Py_NewRef(ack));
    Py_RETURN_NONE;
}

static PyObject *Ring_get_fast(Ring *r, void *closure) { return Py_NewRef(r->fast ? r->fast : Py_None); }

/* _fast = ((ack handle, blocks), ...): the publisher's copy of its subscribers (Channel._reindex) */
static int Ring_set_fast(Ring *r, PyObject *v, void *closure) {
    if (!v || !PyTuple_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "_fast is a tuple of (handle, blocks) pairs");
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    uint64_t hs[CH_FAST_MAX];
    unsigned char bs[CH_FAST_MAX];
    for (Py_ssize_t i = 0; i < n && i < CH_FAST_MAX; i++) {
        PyObject *p = PyTuple_GET_ITEM(v, i);
        if (!PyTuple_Check(p) || PyTuple_GET_SIZE(p) != 2) {
            PyErr_SetString(PyExc_TypeError, "_fast is a tuple of (handle, blocks) pairs");
            return -1;
        }
        hs[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(p, 0));
        if (hs[i] == (uint64_t)-1 && PyErr_Occurred()) return -1;
        int b = PyObject_IsTrue(PyTuple_GET_ITEM(p, 1));
        if (b < 0) return -1;
        bs[i] = (unsigned char)b;
    }
    if (n > CH_FAST_MAX) {
        r->nfast = -1;
    } else {
        memcpy(r->fast_h, hs, (size_t)n * sizeof hs[0]);
        memcpy(r->fast_block, bs, (size_t)n);
        r->nfast = (int)n;
    }
    Py_XSETREF(r->fast, Py_NewRef(v));
    return 0;
}

static PyObject *Ring_get_hits(Ring *r, void *closure) { return Py_BuildValue("(KK)", r->hits[0], r->hits[1]); }

/* The one optional argument (positional or keyword `timeout`) of loan / receive; *t stays the
 * default.  The errors are those of the Python methods before (fn: "Channel.loan", ...). */
static int timeout_arg(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **t) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError, "%s() takes from 1 to 2 positional arguments but %zd were given", fn, nargs + 1);
        return -1;
    }
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, "timeout") != 0) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fn, name);
            return -1;
        }
        if (nargs || k) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument 'timeout'", fn);
            return -1;
        }
    }
    if (nargs + nkw == 1) *t = args[0];
    return 0;
}

/* The next frame's Frame (lost 0), stored as the ring's _frame; a new reference. */
static PyObject *hand_out(Ring *r, uint64_t n) {
    Py_ssize_t i = (Py_ssize_t)((n - 1) % r->depth);
    PyObject *zero = PyLong_FromLong(0);
    if (!zero) return NULL;
    PyObject *f = frame_make(g_frame_cls, r, n, PyTuple_GET_ITEM(r->views, i), PyTuple_GET_ITEM(r->slots, i), zero);
    Py_DECREF(zero);
    if (!f) return NULL;
    Py_XSETREF(r->frame, Py_NewRef(f));
    r->hits[0]++;
    return f;
}

/* Channel.loan(timeout=-1.0) */
static PyObject *Ring_loan(Ring *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *t = g_minus_one;
    if (timeout_arg("Channel.loan", args, nargs, kwnames, &t) < 0) return NULL;
    hle_ctx *c = live_ctx(r);
    /* the fast path: no new record, and every subscriber alive and, if it blocks, past frame
     * next - depth (else Channel._loan looks at them one by one: adoption, the dead, the wait) */
    if (c && r->role == ROLE_PUB && g_frame_cls && no_frame(r) && !r->closed && r->nfast >= 0 &&
        (long long)hle_name_seq(c) == r->seen) {
        long long need = (long long)r->next - (long long)r->depth;
        int i;
        for (i = 0; i < r->nfast; i++) {
            uint64_t w;
            if (hle_word(c, r->fast_h[i], &w) != HL_OK || w >= HL_TIMELINE_FAILED ||
                (r->fast_block[i] && (long long)w < need))
                break;
        }
        uint64_t n = r->next;
        if (i == r->nfast) {
            /* claimed equal to n: a loan whose block raised; its slot is ours.  A signal that
             * fails (claimed moved ahead by another participant, ...): the general path decides */
            if (r->claimed < n) {
                if (hle_timeline_signal(c, r->claim->handle, n) == HL_OK) {
                    r->claimed = n;
                    return hand_out(r, n);
                }
            } else {
                return hand_out(r, n);
            }
        }
    }
    return PyObject_CallMethodObjArgs((PyObject *)r, s_loan, t, NULL);
}

/* Subscriber.receive(timeout=None) */
static PyObject *Ring_receive(Ring *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *t = Py_None;
    if (timeout_arg("Subscriber.receive", args, nargs, kwnames, &t) < 0) return NULL;
    hle_ctx *c = live_ctx(r);
    int64_t tmo = -1;
    int fast = c && r->role == ROLE_SUB && g_frame_cls && no_frame(r) && !r->closed && r->ack && r->ack->held;
    if (fast && t != Py_None) {
        /* a plain number >= 0 (Timeline.wait's conversion); anything else: the general path's errors */
        if ((PyFloat_Check(t) || PyLong_Check(t)) && !PyBool_Check(t)) {
            double d = PyFloat_AsDouble(t);
            if (d == -1.0 && PyErr_Occurred()) {
                PyErr_Clear();
                fast = 0;
            } else if (d >= 0) {
                tmo = d > 9e9 ? (int64_t)9e18 : (int64_t)(d * 1e9);
            } else {
                fast = 0;
            }
        } else {
            fast = 0;
        }
    }
    if (!fast) return PyObject_CallMethodObjArgs((PyObject *)r, s_receive, t, NULL);
    uint64_t n = r->next, w = 0;
    uint64_t ph = r->pub->handle, ch = r->claim->handle;
    Core *core = (Core *)Py_NewRef((PyObject *)r->core); /* (the GIL is released while the wait sleeps) */
    int rc = hle_wait(&core->ctx, ph, n, tmo, core->ctx.spin_ns, &w);
    if (rc == HL_E_TIMEOUT) {
        Py_DECREF((PyObject *)core);
        PyObject *e = PyObject_CallMethodObjArgs((PyObject *)r, s_timeout, t, NULL);
        if (e && PyExceptionInstance_Check(e)) { /* raise self._timeout(timeout) from None */
            PyException_SetCause(e, NULL);
            PyErr_SetObject((PyObject *)Py_TYPE(e), e);
        } else if (e) {
            PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
        }
        Py_XDECREF(e);
        return NULL;
    }
    if (rc) {
        Py_DECREF((PyObject *)core);
        return hlpy_raise(rc); /* KeyboardInterrupt (the interrupt hook), DomainClosed, ...: as Timeline.wait */
    }
    /* published (not failed: a failed or invalid word is above HL_TIMELINE_MAX) and its slot not
     * claimed for a later frame (a failed claimed word is larger than any frame number): hand it
     * out; anything else, the general path (its wait returns at once: the word only grows) */
    uint64_t wc = 0;
    int ready = w <= HL_TIMELINE_MAX && hle_word(&core->ctx, ch, &wc) == HL_OK && wc < n + r->depth;
    Py_DECREF((PyObject *)core);
    if (ready && r->next == n && no_frame(r) && !r->closed) return hand_out(r, n);
    return PyObject_CallMethodObjArgs((PyObject *)r, s_receive, t, NULL);
}

/* The methods Channel and Subscriber expose as loan() / receive(): named and documented as such
 * (channel_method(i) makes the descriptor of entry i). */
#define KW(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef named_methods[] = {
    {"loan", KW(Ring_loan),
     "loan($self, /, timeout=-1.0)\n--\n\n"
     "The next slot as a writable :class:`Frame`, published when its ``with`` block exits\n"
     "(not when it raises: the next loan reuses the slot and the frame number).  Waits up to\n"
     "``timeout`` seconds (default: the channel's) for ``\"block\"`` subscribers to release it:\n"
     ":class:`~hostless.SlowSubscriber` then.  Ctrl-C ends the wait."},
    {"receive", KW(Ring_receive),
     "receive($self, /, timeout=None)\n--\n\n"
     "The next frame as a read-only :class:`Frame`, acknowledged when its ``with`` block exits\n"
     "(also when the block raises).  Waits up to ``timeout`` seconds (None: no limit; Ctrl-C ends\n"
     "the wait): TimeoutError then.  ChannelClosed once the publisher closed or died and every\n"
     "frame it published was received.  With the ``\"skip\"`` policy the block's exit raises\n"
     "FrameOverwritten when the publisher overwrote the frame meanwhile."},
};

static PyObject *channel_method(PyObject *m, PyObject *arg) {
    long i = PyLong_AsLong(arg);
    if (i == -1 && PyErr_Occurred()) return NULL;
    if (i < 0 || i >= (long)(sizeof named_methods / sizeof named_methods[0]))
        return PyErr_Format(PyExc_IndexError, "no channel method %ld", i);
    return PyDescr_NewMethod(ChannelRingType, &named_methods[i]);
}

/* channel_frame_type(cls): the class the fast paths make frames of (hostless.Frame) */
static PyObject *channel_frame_type(PyObject *m, PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, ChannelFrameType)) {
        PyErr_SetString(PyExc_TypeError, "channel_frame_type(cls): a subclass of hostless._core.ChannelFrame");
        return NULL;
    }
    Py_XSETREF(g_frame_cls, (PyTypeObject *)Py_NewRef(cls));
    Py_RETURN_NONE;
}

static PyMethodDef Ring_methods[] = {
    {"_bind", (PyCFunction)(void (*)(void))Ring_bind, METH_FASTCALL,
     "_bind(core, pub, claim, views, slots, subscriber): the ring's objects (_Ring._init_ring)"},
    {"_bind_ack", (PyCFunction)Ring_bind_ack, METH_O, "_bind_ack(ack): the subscriber's acknowledgement timeline"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Ring_members[] = {
    {"_frame", T_OBJECT, offsetof(Ring, frame), 0, "the Frame loaned out, or None"},
    {"_closed", T_BOOL, offsetof(Ring, closed), 0, NULL},
    {"_next", T_ULONGLONG, offsetof(Ring, next), 0, NULL},
    {"_claimed", T_ULONGLONG, offsetof(Ring, claimed), 0, NULL},
    {"_seen", T_LONGLONG, offsetof(Ring, seen), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef Ring_getset[] = {
    {"_fast", (getter)Ring_get_fast, (setter)Ring_set_fast, "((ack handle, blocks), ...) of the subscribers", NULL},
    {"_fast_hits", (getter)Ring_get_hits, NULL, "(fast loans or receives, fast exits): for tests", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Ring_slots[] = {
    {Py_tp_doc, (void *)"The C base of a channel's publisher and subscribers (their hot state)."},
    {Py_tp_new, (void *)Ring_new},
    {Py_tp_dealloc, (void *)Ring_dealloc},
    {Py_tp_traverse, (void *)Ring_traverse},
    {Py_tp_clear, (void *)Ring_clear},
    {Py_tp_methods, Ring_methods},
    {Py_tp_members, Ring_members},
    {Py_tp_getset, Ring_getset},
    {0, NULL},
};

PyType_Spec hlpy_channel_ring_spec = {
    "hostless._core.ChannelRing", sizeof(Ring), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, Ring_slots};

PyMethodDef hlpy_channel_methods[] = {
    {"channel_method", channel_method, METH_O, "channel_method(i): Channel.loan, Subscriber.receive (0, 1)"},
    {"channel_frame_type", channel_frame_type, METH_O, "channel_frame_type(cls): the class of the fast paths' frames"},
    {NULL, NULL, 0, NULL},
};

/* The names and constants the fast paths use, once (module.c). */
int hlpy_channel_init(void) {
    if (!s_loan && !(s_loan = PyUnicode_InternFromString("_loan"))) return -1;
    if (!s_receive && !(s_receive = PyUnicode_InternFromString("_receive"))) return -1;
    if (!s_finish && !(s_finish = PyUnicode_InternFromString("_finish"))) return -1;
    if (!s_timeout && !(s_timeout = PyUnicode_InternFromString("_timeout"))) return -1;
    if (!g_minus_one && !(g_minus_one = PyFloat_FromDouble(-1.0))) return -1;
    return 0;
}
