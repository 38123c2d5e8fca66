# backports.strenum: enum.StrEnum of Python 3.11 (the package's own strenum.pyi).
from enum import Enum

from typing_extensions import Self

# An enum base with no members of its own, which mypy flags in any stub but its enum module.
class StrEnum(str, Enum):  # type: ignore[misc]
    def __new__(cls, value: str) -> Self: ...
    @property
    def value(self) -> str: ...
    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list[str]) -> str: ...
