"""Every problem of a rules file, collected before any is reported.

A loader adds problems as it goes (``Problems.add(line, message)``) and raises
``ConfigProblems`` once at the end, so one run of ``ratekeeper config check`` shows the
whole list instead of the first mistake only. Each problem reads
``FILE:LINE: what is wrong; what is accepted``.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from ratekeeper.errors import ConfigurationError

__all__ = ["ConfigProblems", "Problems", "did_you_mean"]


class ConfigProblems(ConfigurationError):
    """A rules file that cannot be used; ``problems`` holds every problem found, in file order.

    ``str()`` lists them all, one a line, so logging the exception logs every problem.
    """

    def __init__(self, source: str, problems: Iterable[str], warnings: Iterable[str] = ()) -> None:
        self.source = source
        self.problems: tuple[str, ...] = tuple(problems)
        self.warnings: tuple[str, ...] = tuple(warnings)
        n = len(self.problems)
        head = f"{source}: {n} problem{'s' if n != 1 else ''}"
        super().__init__("\n".join([head, *(f"  {p}" for p in self.problems)]))


class Problems:
    """The problems and warnings found in one file, each prefixed with ``FILE:LINE``.

    ``indexed``: the rules were given as Python data, which has no lines; a "line" is then
    the position of the rule (1-based, 0 for the whole) and a message reads
    ``SOURCE[INDEX]: ...`` with the rule's index in its list.
    """

    def __init__(self, source: str, *, indexed: bool = False) -> None:
        self.source = source
        self.indexed = indexed
        self._problems: list[tuple[int, int, str]] = []
        self.warnings: list[str] = []

    def where(self, line: int) -> str:
        """``FILE:LINE``, or ``SOURCE[INDEX]`` for rules given as data."""
        if not self.indexed:
            return f"{self.source}:{line}"
        return f"{self.source}[{line - 1}]" if line > 0 else self.source

    def add(self, line: int, message: str) -> None:
        self._problems.append((line, len(self._problems), f"{self.where(line)}: {message}"))

    def warn(self, line: int, message: str) -> None:
        self.warnings.append(f"{self.where(line)}: warning: {message}")

    def __bool__(self) -> bool:
        return bool(self._problems)

    @property
    def messages(self) -> list[str]:
        """The problems in line order (the order they were found within a line)."""
        return [message for _, _, message in sorted(self._problems)]

    def raise_if_any(self) -> None:
        if self._problems:
            raise ConfigProblems(self.source, self.messages, self.warnings)


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
