/*
 * frame_program.h -- the FrameProgram object of the binding, shared by
 * frame.c (the type: construction, run) and frame_io.c (bind_io, frame).
 * Internal to the extension; include binding.h first.
 */
#ifndef HOSTLESS_BINDING_FRAME_PROGRAM_H
#define HOSTLESS_BINDING_FRAME_PROGRAM_H

#ifndef HOSTLESS_INTERNAL
#error "binding/frame_program.h is internal to the hostless extension"
#endif

#define FIO_MAX_NDIM 32

struct fio_in {
    PyObject *name;   /* interned str */
    char format[32];  /* the buffer protocol's format of the input's dtype */
    Py_ssize_t itemsize, nbytes;
    int ndim;
    Py_ssize_t shape[FIO_MAX_NDIM];
    uint32_t ndst;
    uint64_t *dst;     /* buffer handles */
    uint64_t *dst_off; /* their data's offset in the mapping */
};

struct fio_out {
    PyObject *name;
    PyObject *view;   /* the buffer's ndarray view (its copy() where no array was made ahead) */
    uint64_t buf;     /* the buffer's handle */
    uint64_t off;     /* its data's offset in the mapping */
    Py_ssize_t nbytes;
};

struct fio_ident {
    uint64_t ctl_off, ctl_mask, ctl_want, cons_off;
    uint32_t cons_want;
};

typedef struct {
    PyObject_HEAD
    Core *core;
    struct hle_frame f;
    uint64_t *watch;
    /* bind_io */
    int io;
    Py_ssize_t nin, nout, nid;
    struct fio_in *ins;
    struct fio_out *outs;
    struct fio_ident *ids;
    PyObject *ndarray;
    PyObject *empty_like;
} FrameProgram;

/* frame_io.c */
void hlpy_fio_clear(FrameProgram *p);
PyObject *hlpy_fp_bind_io(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs);
PyObject *hlpy_fp_frame(FrameProgram *p, PyObject *const *args, Py_ssize_t nargs);
/* frame.c: what a run that stopped returns (None, a stop tuple) or raises */
PyObject *hlpy_frame_stop_result(int r, const struct hle_frame_stop *s);

#endif
