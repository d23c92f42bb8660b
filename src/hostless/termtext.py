"""Text from a domain made fit for a terminal (one home for the rule ``hostless info`` and
``hostless top`` apply).

Labels, kinds, names and failure records are chosen by whoever may write the domain:
untrusted.  :func:`safe` shows control and format characters (escape sequences,
bidirectional overrides, surrogates) as Python escapes (``\\x1b``), so nothing read from a
domain can move the cursor, recolour the terminal or reorder what is shown; the result is
plain text, never interpreted as markup by the caller.
"""

from __future__ import annotations

import unicodedata

__all__ = ["safe"]


def safe(text: str, keep_newlines: bool = False) -> str:
    """``text`` with every control (Cc), format (Cf) and surrogate (Cs) character replaced by
    its Python escape (newlines kept when ``keep_newlines``)."""
    out = []
    for ch in text:
        if (keep_newlines and ch == "\n") or unicodedata.category(ch) not in ("Cc", "Cf", "Cs"):
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])
    return "".join(out)
