"""What the lowest supported Python (3.10) lacks, from the standard backports.

`enum.StrEnum` and `tomllib` arrived in 3.11; on 3.10 their backports (`backports.strenum`,
`tomli`, installed only there by pyproject's markers) stand in with the same API.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin: 3.11 and later only

    import tomllib  # novermin: 3.11 and later only
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib
    from backports.strenum import StrEnum

__all__ = ["StrEnum", "tomllib"]
