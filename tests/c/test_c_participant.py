"""A "firmware" participant: a C program that includes only hostless.h.

It maps /dev/shm/<name>, validates the domain, checks the error paths of the
inline operations, waits (by polling) for a fence that Python signals, then
signals a fence, a child of a merged fence and a timeline that Python waits
on.  The header must also be valid C++.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import hostless as hl
from conftest import kill_child, read_line

S = hl.Status
GCC = shutil.which("gcc")
GXX = shutil.which("g++")
HEADER_DIR = os.path.dirname(hl.abi_header_path())
INCLUDE = hl.get_include()  # C programs: #include <hostless/hostless.h>, <hostless/hostless_engine.h>
PKG = Path(hl.__file__).parent

# Valid C11 and C++11 (no implicit void* conversions), so the same program is
# built both ways.
PROGRAM = r"""
#define _POSIX_C_SOURCE 200809L
#include "hostless.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static hl_u64 arg(const char *s) { return (hl_u64)strtoull(s, NULL, 0); }

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: %s path fence timeline value go child\n", argv[0]);
        return 2;
    }
    hl_u64 fh = arg(argv[2]), th = arg(argv[3]), v = arg(argv[4]), go = arg(argv[5]), ch = arg(argv[6]);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("open"); return 3; }
    struct stat sb;
    if (fstat(fd, &sb) != 0) { perror("fstat"); return 3; }
    void *base = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 4; }
    hl_u64 size = (hl_u64)sb.st_size;

    struct hl_dom dd, *d = &dd, other;
    printf("validate %d\n", hl_attach(d, base, size)); /* once: then only the private view is used */
    printf("validate_short %d\n", hl_attach(&other, base, size - HL_PAGE));
    printf("validate_tiny %d\n", hl_attach(&other, base, 100));
    printf("bad_status %d %d %d\n", hl_fence_signal(d, fh, 0), hl_fence_signal(d, fh, 5),
           hl_fence_signal(d, fh, 63));
    printf("timeline_as_fence %d\n", hl_fence_signal(d, th, HL_STATUS_SUCCESS));
    printf("fence_as_timeline %d\n", hl_timeline_signal(d, fh, v));
    printf("stale %d\n", hl_fence_signal(d, fh ^ (1ull << 24), HL_STATUS_SUCCESS));
    printf("foreign %d\n", hl_fence_signal(d, fh ^ (1ull << 57), HL_STATUS_SUCCESS));
    printf("out_of_table %d\n", hl_fence_signal(d, (fh & ~0xffffffull) | 0xffffffull, HL_STATUS_SUCCESS));
    printf("word_ok %d\n", hl_word(d, fh) != 0 && hl_word(d, fh ^ (1ull << 57)) == 0);
    hl_u32 st = 0;
    int rc = hl_fence_poll(d, fh, &st);
    printf("poll %d %u\n", rc, st);
    fflush(stdout);

    /* wait for Python's go fence like a device would: poll word >= 1 */
    struct timespec nap = {0, 200000};
    for (int i = 0; i < 100000; i++) {
        if (hl_fence_poll(d, go, &st) != HL_OK || st != HL_STATUS_ACTIVE) break;
        nanosleep(&nap, NULL);
    }
    printf("go %u\n", st);

    printf("signal %d\n", hl_fence_signal(d, fh, 100));
    printf("again %d\n", hl_fence_signal(d, fh, HL_STATUS_SUCCESS));
    printf("child %d\n", hl_fence_signal(d, ch, HL_STATUS_ERROR));
    printf("tl %d\n", hl_timeline_signal(d, th, v));
    printf("tl_same %d\n", hl_timeline_signal(d, th, v));
    printf("tl_too_big %d\n", hl_timeline_signal(d, th, HL_TIMELINE_MAX + 1));
    hl_u64 w = 0;
    rc = hl_timeline_poll(d, th, &w);
    printf("tl_poll %d %llu\n", rc, (unsigned long long)w);
    fflush(stdout);
    munmap(base, (size_t)size);
    close(fd);
    return 0;
}
"""


def build(tmp_path: Path, compiler: str, std: str, lang: str) -> Path:
    src = tmp_path / "participant.c"
    src.write_text(PROGRAM)
    exe = tmp_path / f"participant-{lang}"
    cmd = [compiler, f"-std={std}", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{HEADER_DIR}"]
    if lang == "cxx":
        cmd += ["-x", "c++"]
    r = subprocess.run([*cmd, str(src), "-o", str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{compiler} failed:\n{r.stderr}"
    return exe


@pytest.mark.parametrize("lang", ["c", "cxx"])
def test_c_participant_signals(domain_name: str, tmp_path: Path, lang: str) -> None:
    compiler, std = (GCC, "c11") if lang == "c" else (GXX, "c++11")
    if compiler is None:
        pytest.skip(f"{'gcc' if lang == 'c' else 'g++'} is not installed: cannot build the C participant")
    exe = build(tmp_path, compiler, std, lang)
    with hl.Domain.create(domain_name, poll_interval=0.005) as d:
        f, go, child, other = d.fence(), d.fence(), d.fence(), d.fence()
        m = d.merge([child, other])
        t = d.timeline(3)
        value = 2**40 + 5
        proc = subprocess.Popen(
            [str(exe), f"/dev/shm/{domain_name}", str(f.handle), str(t.handle), str(value), str(go.handle),
             str(child.handle)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        try:
            lines = dict(read_line(proc).split(" ", 1) for _ in range(11))
            assert lines == {
                "validate": "0",
                "validate_short": "-1",
                "validate_tiny": "-1",
                "bad_status": "-5 -5 -5",
                "timeline_as_fence": "-2",
                "fence_as_timeline": "-2",
                "stale": "-2",
                "foreign": "-2",
                "out_of_table": "-2",
                "word_ok": "1",
                "poll": f"0 {int(S.ACTIVE)}",
            }
            assert f.status is S.ACTIVE and t.value == 3  # the error paths changed nothing
            got: dict[str, object] = {}
            ths = [
                threading.Thread(target=lambda: got.__setitem__("f", f.wait(10, spin=0))),
                threading.Thread(target=lambda: got.__setitem__("t", t.wait(value, 10, spin=0))),
                threading.Thread(target=lambda: got.__setitem__("m", m.wait(10, spin=0))),
            ]
            for th in ths:
                th.start()
            other.signal()
            go.signal()
            rest = dict(read_line(proc).split(" ", 1) for _ in range(8))
            assert rest == {
                "go": str(int(S.SUCCESS)),
                "signal": "0",
                "again": "-3",
                "child": "0",
                "tl": "0",
                "tl_same": "-5",
                "tl_too_big": "-5",
                "tl_poll": f"0 {value}",
            }
            for th in ths:
                th.join(10)
            # the merged parent completes although the C side did not propagate
            assert got == {"f": S(100), "t": S.SUCCESS, "m": S.ERROR}
            assert proc.wait(10) == 0
            assert t.value == value
            assert d.check() == []
        finally:
            kill_child(proc)


@pytest.mark.parametrize(
    "compiler,flags",
    [
        ("gcc", ["-std=c11", "-pedantic"]),
        ("gcc", ["-std=c99", "-DHL_NO_SYSCALLS"]),
        ("gcc", ["-std=gnu11", "-O2"]),
        ("g++", ["-std=c++11", "-x", "c++", "-pedantic"]),
        ("g++", ["-std=c++17", "-x", "c++", "-O2"]),
    ],
    ids=["c11", "c99-nosyscalls", "gnu11", "cxx11", "cxx17"],
)
def test_header_compiles(tmp_path: Path, compiler: str, flags: list[str]) -> None:
    exe = shutil.which(compiler)
    if exe is None:
        pytest.skip(f"{compiler} is not installed: cannot compile hostless.h")
    src = tmp_path / "only_header.c"
    src.write_text(
        '#include "hostless.h"\n'
        "int main(void) {\n"
        "    static unsigned char page[HL_HEADER_SIZE];\n"
        "    hl_u32 st = 0; hl_u64 w = 0;\n"
        "    struct hl_dom d;\n"
        "    int rc = hl_attach(&d, page, sizeof page);\n"
        "    rc += hl_fence_poll(&d, 1, &st) + hl_timeline_poll(&d, 1, &w);\n"
        "    return rc == HL_E_CORRUPT + 2 * HL_E_HANDLE ? 0 : 1;\n"
        "}\n"
    )
    out = tmp_path / "only_header"
    r = subprocess.run(
        [exe, *flags, "-Wall", "-Wextra", "-Werror", f"-I{HEADER_DIR}", str(src), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert subprocess.run([str(out)]).returncode == 0


# ---------------------------------------------------------------------------
# A C program linked only against the engine library (libhostless.a, built
# here from src/hostless/core/*.c with gcc) joins a Python-created domain,
# creates a fence that Python waits on and signals it, waits on a fence that
# Python signals, and recovers a dead Python participant.

ENGINE_PROGRAM = r"""
#include <hostless/hostless_engine.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void expect(const char *word) {
    char line[64];
    if (!fgets(line, sizeof line, stdin) || strncmp(line, word, strlen(word)) != 0) {
        fprintf(stderr, "expected %s\n", word);
        exit(5);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    unsigned long long pyfence = strtoull(argv[2], NULL, 0);
    hle_ctx *c = hle_ctx_new();
    int fd = open(argv[1], O_RDWR | O_CLOEXEC);
    if (!c || fd < 0) return 3;
    int rc = hle_attach(c, fd, NULL, "c-engine", "c", 0);
    printf("attach %d %d %s\n", rc, hle_me(c), rc ? hle_errmsg() : "-");
    uint64_t h = 0, w = 0;
    rc = hle_create(c, HL_KIND_FENCE, 0, &h);
    printf("fence %d 0x%llx\n", rc, (unsigned long long)h);
    fflush(stdout);
    expect("signal");
    printf("signal %d\n", hle_signal(c, h, HL_STATUS_SUCCESS));
    printf("again %d\n", hle_signal(c, h, HL_STATUS_SUCCESS));
    printf("import %d\n", hle_import(c, pyfence, HL_KIND_FENCE));
    fflush(stdout);
    rc = hle_wait(c, pyfence, 1, 10000000000LL, 0, &w);
    printf("waited %d %llu\n", rc, (unsigned long long)w);
    rc = hle_wait(c, h ^ (1ull << 57), 1, 0, 0, &w);
    printf("foreign %d\n", rc);
    fflush(stdout);
    expect("reap");
    uint64_t ids[64];
    int n = hle_reap(c, ids, 64);
    printf("reaped %d\n", n);
    printf("release %d %d\n", hle_release(c, h), hle_release(c, pyfence));
    printf("leave %d\n", hle_leave(c));
    fflush(stdout);
    hle_ctx_free(c);
    return 0;
}
"""

DEAD_CHILD = """
import sys, time
import hostless as hl
d = hl.Domain.open(sys.argv[1], label="doomed", watchdog_interval=0)
f = d.fence()
print(f.handle, flush=True)
time.sleep(120)
"""


def build_engine_program(tmp_path: Path) -> Path:
    """libhostless.a from the engine sources alone, then the program linked against it (+ pthread)."""
    core = PKG / "core"
    sources = sorted(core.glob("*.c"))
    assert sources, f"no engine sources in {core}"
    objs = []
    flags = ["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
             "-Wno-missing-field-initializers", f"-I{INCLUDE}"]  # fmt: skip
    for src in sources:
        obj = tmp_path / (src.stem + ".o")
        cmd = [GCC, *flags, "-DHOSTLESS_INTERNAL", "-c", str(src), "-o", str(obj)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"gcc {src.name} failed:\n{r.stderr}"
        objs.append(str(obj))
    lib = tmp_path / "libhostless.a"
    r = subprocess.run(["ar", "rcs", str(lib), *objs], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    prog = tmp_path / "engine_participant.c"
    prog.write_text(ENGINE_PROGRAM)
    exe = tmp_path / "engine_participant"
    r = subprocess.run(
        [GCC, *flags, str(prog), "-o", str(exe), f"-L{tmp_path}", "-lhostless", "-lpthread"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, f"linking against libhostless.a failed:\n{r.stderr}"
    return exe


def test_c_engine_participant(domain_name: str, tmp_path: Path) -> None:
    if GCC is None or shutil.which("ar") is None:
        pytest.skip("gcc and ar are needed to build libhostless.a")
    exe = build_engine_program(tmp_path)
    with hl.Domain.create(domain_name, poll_interval=0.005, watchdog_interval=0) as d:
        pyf = d.fence()
        proc = subprocess.Popen(
            [str(exe), f"/dev/shm/{domain_name}", str(pyf.handle)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        doomed = None
        try:
            rc, me, msg = read_line(proc).split(" ", 3)[1:]
            assert (rc, msg) == ("0", "-")
            rc, handle = read_line(proc).split(" ")[1:]
            assert rc == "0"
            cf = d.import_fence(int(handle, 16))  # a fence the C participant created
            got: dict[str, object] = {}
            th = threading.Thread(target=lambda: got.__setitem__("c", cf.wait(10, spin=0)))
            th.start()
            assert proc.stdin is not None
            proc.stdin.write("signal\n")
            proc.stdin.flush()
            th.join(10)
            assert got == {"c": S.SUCCESS}
            assert read_line(proc) == "signal 0"
            assert read_line(proc) == "again -3"  # HL_E_ALREADY
            assert read_line(proc) == "import 0"
            pyf.signal(S.ERROR)
            assert read_line(proc) == f"waited 0 {int(S.ERROR)}"
            assert read_line(proc) == "foreign -2"
            # a Python participant holding a fence dies; the C participant recovers it
            doomed = subprocess.Popen(
                [sys.executable, "-c", DEAD_CHILD, domain_name],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            df = d.import_fence(int(read_line(doomed)))
            kill_child(doomed)
            assert df.status is S.ACTIVE  # nobody recovered it yet (no watchdog here)
            proc.stdin.write("reap\n")
            proc.stdin.flush()
            assert read_line(proc) == "reaped 1"
            assert df.wait(10) is S.OWNER_DIED
            assert read_line(proc) == "release 0 0"
            assert read_line(proc) == "leave 0"
            assert proc.wait(10) == 0
            df.release()
            cf.release()
            assert d.check() == []
            assert int(me) not in [p.index for p in d.participants]
        finally:
            kill_child(proc)
            if doomed is not None:
                kill_child(doomed)


# ---------------------------------------------------------------------------
# The installed C API: hostless.get_include() is the folder C users pass to -I.

TINY = r"""
#include <hostless/hostless.h>
#include <hostless/hostless_engine.h>

#include <stdio.h>

int main(void) {
    /* an ERT START_CU for CU 2 with one buffer and one scalar, decoded by hostless_ert.h */
    hl_u32 cmd[8] = {0, 1u << 2, 1, 0x11, 0x22, 7, 0};
    cmd[0] = (HL_ERT_STATE_NEW << HL_ERT_STATE_SHIFT) | (6u << HL_ERT_COUNT_SHIFT) |
             (HL_ERT_START_CU << HL_ERT_OPCODE_SHIFT) | (HL_ERT_TYPE_CU << HL_ERT_TYPE_SHIFT);
    hl_u32 cu = 0;
    struct hl_ert_args a;
    int r = hl_ert_check(cmd[0], sizeof cmd);
    r |= hl_ert_cu_index(cmd[1], &cu);
    r |= hl_ert_cu_args(cmd + 1, hl_ert_count(cmd[0]), hl_ert_opcode(cmd[0]), &a);
    printf("%d %u %u %u %llx %llu %d %d\n", r, cu, a.nbuf, a.ns, (unsigned long long)hl_ert_u64(a.bufs),
           (unsigned long long)hl_ert_u64(a.scalars), hl_ert_check(cmd[0], 12) == HL_ERT_E_COUNT,
           HL_E_DEVICE_FULL < HL_E_CLOSED && HL_K_GEMM == 5u && HL_NPU_CU_GEMM == 1u);
    return 0;
}
"""


def test_get_include_tiny_participant(tmp_path: Path) -> None:
    """A tiny C program built against ``hostless.get_include()`` alone: the ABI (the ERT decoder,
    kernel ids) and the engine API's declarations, as an installed package ships them."""
    if GCC is None:
        pytest.skip("gcc is needed")
    inc = Path(INCLUDE)
    assert (inc / "hostless" / "hostless.h").is_file() and (inc / "hostless" / "hostless_engine.h").is_file()
    src = tmp_path / "tiny.c"
    src.write_text(TINY)
    exe = tmp_path / "tiny"
    r = subprocess.run([GCC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{inc}", str(src), "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=20).stdout.split()
    assert out == ["0", "2", "1", "1", "2200000011", "7", "1", "1"]


def test_internal_headers_refuse_to_compile(tmp_path: Path) -> None:
    """core/engine.h is internal: a program that includes it without HOSTLESS_INTERNAL fails with
    a message naming the public header."""
    if GCC is None:
        pytest.skip("gcc is needed")
    src = tmp_path / "internal.c"
    src.write_text(f'#include "{PKG / "core" / "engine.h"}"\nint main(void) {{ return 0; }}\n')
    r = subprocess.run([GCC, "-std=gnu11", f"-I{INCLUDE}", "-c", str(src), "-o", str(tmp_path / "i.o")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode != 0 and "hostless/hostless_engine.h" in r.stderr
