#!/bin/sh
# find_pythons.sh [VERSION...]: the interpreters `make wheel` builds wheels for by default.
#
# For each CPython version (default 3.10 3.11 3.12 3.13) prints the first interpreter that works:
# `pythonX.Y` on PATH, then ${PYENV_ROOT:-$HOME/.pyenv}/versions/X.Y.*/bin/pythonX.Y (newest
# first; pyenv's shims refuse versions that are not selected, so the shim on PATH often fails;
# a shim that works is replaced by its target, sys.executable),
# then /usr/local/bin and /usr/bin.  "Works" means: it runs, is CPython X.Y, has its C headers
# (Python.h) and can make a venv with pip (ensurepip).  The paths go to stdout on one line; what
# was found and what is missing go to stderr.  A missing version is a warning (exit 0); the exit
# status is 1 only when none is found.
versions=${*:-3.10 3.11 3.12 3.13}
root=${PYENV_ROOT:-$HOME/.pyenv}
found=""
missing=""
for v in $versions; do
    pick=""
    # the pyenv folders, newest patch release first (3.12.10 after 3.12.9: sort -V)
    pyenvs=$(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -rV)
    for c in $(command -v "python$v" 2>/dev/null) $pyenvs /usr/local/bin/python"$v" /usr/bin/python"$v"; do
        [ -x "$c" ] || continue
        # the interpreter's own path (a shim's target), when it works
        real=$("$c" -c "
import ensurepip, os, sys, sysconfig, venv
ok = (sys.implementation.name == 'cpython' and '%d.%d' % sys.version_info[:2] == '$v'
      and os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))
print(sys.executable if ok else '')" 2>/dev/null)
        if [ -n "$real" ] && [ -x "$real" ]; then
            pick=$real
            break
        fi
    done
    if [ -n "$pick" ]; then
        found="$found $pick"
        echo "find_pythons: CPython $v: $pick" >&2
    else
        missing="$missing $v"
    fi
done
if [ -n "$missing" ]; then
    echo "find_pythons: warning: no working CPython for$missing (looked for pythonX.Y on PATH," \
        "$root/versions/X.Y.*/bin, /usr/local/bin, /usr/bin; needs Python.h and ensurepip):" \
        "no wheel for it; set WHEEL_PYTHONS to name one" >&2
fi
[ -n "$found" ] || exit 1
echo $found
