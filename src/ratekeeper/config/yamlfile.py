"""YAML read with ``yaml.safe_load``'s semantics, keeping the line of every value.

``read_yaml`` composes the document into nodes (so syntax errors keep their mark) and
builds plain values from them: mappings become ``YamlMap`` (a ``dict`` that also knows
its own line and the line of each key), sequences ``YamlList`` (a ``list`` that knows
the line of each item), scalars what the safe constructor makes of them. Nothing else is
ever constructed (no arbitrary objects), and a key given twice in one mapping is a
problem instead of the last one silently winning.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import yaml
from yaml.constructor import SafeConstructor

from ratekeeper.config.problems import Problems

__all__ = ["YamlList", "YamlMap", "line_of", "load_file", "read_text", "read_yaml"]

T = TypeVar("T")


class YamlMap(dict[str, Any]):
    """A mapping from the file: ``line`` is where it starts, ``key_lines[k]`` where key ``k`` is."""

    line: int
    key_lines: dict[str, int]

    def line_at(self, key: str) -> int:
        """The line of ``key`` if present, else the mapping's own line."""
        return self.key_lines.get(key, self.line)


class YamlList(list[Any]):
    """A sequence from the file: ``line`` is where it starts, ``item_lines[i]`` where item ``i`` is."""

    line: int
    item_lines: list[int]


def line_of(value: object, default: int) -> int:
    """The line a mapping or sequence starts on; ``default`` for scalars (they do not carry one)."""
    return getattr(value, "line", default)


def read_yaml(text: str, problems: Problems) -> Any:
    """The document's value, or None after adding the syntax error (with its line) to ``problems``.

    An empty document is None too (without a problem: the caller says what it expected).
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        what = exc.problem or "not valid YAML"
        context = f" ({exc.context})" if exc.context else ""
        problems.add(line, f"YAML syntax error: {what}{context}; the file must be valid YAML")
        return None
    except yaml.YAMLError as exc:
        problems.add(1, f"YAML error: {exc}; the file must be valid YAML")
        return None
    if node is None:
        return None
    return _Builder(problems).build(node)


class _Builder:
    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self.constructor = SafeConstructor()

    def build(self, node: yaml.Node) -> Any:
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            # Keys merged in with '<<' give way to the mapping's own keys (as in safe_load);
            # only an own key given twice is a problem.
            own = {id(k) for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge"}
            self.constructor.flatten_mapping(node)
            out = YamlMap()
            out.line = line
            out.key_lines = {}
            own_keys: set[str] = set()
            for key_node, value_node in node.value:
                key_line = key_node.start_mark.line + 1
                key = self.scalar(key_node)
                if not isinstance(key, str):
                    self.problems.add(key_line, f"a key must be a text, got {key!r}; write a field name")
                    continue
                if id(key_node) in own:
                    if key in own_keys:
                        self.problems.add(
                            key_line,
                            f"key {key!r} appears twice in one mapping (first on line {out.key_lines[key]}); "
                            "give each key once",
                        )
                        continue
                    own_keys.add(key)
                out[key] = self.build(value_node)
                out.key_lines[key] = key_line
            return out
        if isinstance(node, yaml.SequenceNode):
            items = YamlList()
            items.line = line
            items.item_lines = []
            for item in node.value:
                items.append(self.build(item))
                items.item_lines.append(item.start_mark.line + 1)
            return items
        return self.scalar(node)

    def scalar(self, node: yaml.Node) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            self.problems.add(node.start_mark.line + 1, "a key must be a plain text, not a list or a mapping")
            return None
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            what = getattr(exc, "problem", None) or str(exc)
            self.problems.add(
                node.start_mark.line + 1,
                f"cannot read this value ({what}); only plain YAML values (text, numbers, booleans, null) are accepted",
            )
            return None


def load_file(path: str | os.PathLike[str], parse: Callable[[str, str], T]) -> T:
    """``parse(text, source)`` of the file at ``path``; ``ConfigProblems`` when it cannot be read."""
    source = os.fspath(path)
    problems = Problems(source)
    text = read_text(path, problems)
    problems.raise_if_any()
    assert text is not None
    return parse(text, source)


def read_text(path: str | os.PathLike[str], problems: Problems) -> str | None:
    """The file's text, or None after adding why it cannot be read (line 1)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        problems.add(1, f"cannot read the rules file ({exc}); give a readable UTF-8 YAML file")
        return None
