"""Values as literal text inside the Markdown that Streamlit renders (captions, banners, labels).

A value from the control plane (a run's error, a policy field such as `disk_dir`, a refusal that
echoes its input) may hold Markdown: a link, an image the browser would fetch, a `:red[...]`
directive, `$...$` maths. `text(v)` escapes every ASCII punctuation character, which CommonMark
then shows as itself; `code(v)` puts the value in a code span whose fence no run of backticks in
it can close. Line breaks become spaces, so a value cannot start a block of its own.
"""

from __future__ import annotations

import re
from typing import Any

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029]+")


def text(value: Any) -> str:
    """`value` as plain text in Markdown."""
    return _PUNCTUATION.sub(r"\\\1", _LINE_BREAKS.sub(" ", str(value)))


def code(value: Any) -> str:
    """`value` as an inline code span (literal by CommonMark's rules, whatever it holds)."""
    shown = _LINE_BREAKS.sub(" ", str(value))
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith(("`", " ")) or shown.endswith(("`", " ")) else ""
    return f"{fence}{pad}{shown}{pad}{fence}" if shown else "empty"
