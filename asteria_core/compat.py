"""What the lowest supported Python (3.10) lacks, from the standard backports.

`enum.StrEnum` and `tomllib` arrived in 3.11; on 3.10 their backports (`backports.strenum`,
`tomli`, installed only there by pyproject's markers) stand in with the same API.

Asteria's choices subclass `Choice`: a StrEnum whose repr is its plain string, so a message
that quotes a setting (`got 'adamw'; allowed: ...`) reads the same for a member and a string.
"""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin: 3.11 and later only

    import tomllib  # novermin: 3.11 and later only
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib
    from backports.strenum import StrEnum


class Choice(StrEnum):
    """A StrEnum that reads as its value: `repr(OptimizerName.SOAP)` is `'soap'`."""

    def __repr__(self) -> str:
        return repr(self.value)


__all__ = ["Choice", "StrEnum", "tomllib"]
