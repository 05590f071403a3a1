"""YAML read with ``yaml.safe_load``'s semantics, keeping the line of every value.

``read_yaml`` composes the document into nodes (so syntax errors keep their mark) and
builds plain values from them: mappings become ``YamlMap`` (a ``dict`` that also knows
its own line and the line of each key), sequences ``YamlList`` (a ``list`` that knows
the line of each item), scalars what the safe constructor makes of them. Nothing else is
ever constructed (no arbitrary objects), and a key given twice in one mapping is a
problem instead of the last one silently winning.

A rules file may come from someone the process should not trust with its memory, so
reading one is bounded: at most ``MAX_FILE_BYTES``, at most ``MAX_DEPTH`` levels of
nesting (the composer recurses per level), and aliases (``*name``, ``<<: *name``) may
repeat at most ``MAX_REPEATED`` values in all. Without that last bound a few hundred
bytes of nested aliases expand to billions of values. Each bound that is hit is a
problem with its line, like any other mistake in the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import yaml
from yaml.constructor import SafeConstructor

from ratekeeper.config.problems import Problems

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_REPEATED",
    "YamlList",
    "YamlMap",
    "from_data",
    "line_of",
    "load_file",
    "read_text",
    "read_yaml",
]

T = TypeVar("T")

MAX_FILE_BYTES = 2 * 1024 * 1024
"""The largest rules file read (bytes); a real one is a few kilobytes."""

MAX_DEPTH = 64
"""The deepest nesting of mappings and lists; the forms need fewer than 30 (Envoy descriptors
nested a dozen deep)."""

MAX_REPEATED = 100_000
"""How many values aliases may repeat in one document (each value an alias copies counts,
and each key a merge ``<<`` copies)."""

_MERGE = "tag:yaml.org,2002:merge"
_VALUE = "tag:yaml.org,2002:value"


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


def from_data(value: object, line: int) -> Any:
    """Python data (dicts, lists, scalars) as the reader's values, every mapping and list
    in it placed at ``line``: rules given in code go through the checks a file does."""
    if isinstance(value, Mapping):
        mapping = YamlMap((k, from_data(v, line)) for k, v in value.items())
        mapping.line = line
        mapping.key_lines = dict.fromkeys(mapping, line)
        return mapping
    if isinstance(value, list | tuple):
        items = YamlList(from_data(v, line) for v in value)
        items.line = line
        items.item_lines = [line] * len(items)
        return items
    return value


def line_of(value: object, default: int) -> int:
    """The line a mapping or sequence starts on; ``default`` for scalars (they do not carry one)."""
    return getattr(value, "line", default)


class _Refused(Exception):
    """A bound of the reader was hit at ``line``: the document is not built further."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


def _too_deep(line: int) -> _Refused:
    return _Refused(
        line,
        f"the document nests deeper than {MAX_DEPTH} levels of mappings and lists; "
        "a rules file needs far fewer: flatten it",
    )


class _Alias(yaml.Node):
    """Where an alias stands in the document, and the node it names.

    The stock composer hands back the anchored node itself, so the alias's own line is
    lost; keeping it lets a problem found while expanding the alias point at the alias.
    """

    def __init__(self, target: yaml.Node, mark: Any) -> None:
        super().__init__(target.tag, None, mark, mark)
        self.target = target


class _BoundedLoader(yaml.SafeLoader):
    """The safe loader whose composer refuses nesting deeper than ``MAX_DEPTH``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self._next_mark()
            target = super().compose_node(parent, index)
            assert target is not None  # the composer raises on an unknown alias
            return _Alias(target, mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _too_deep(self._next_mark().line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _next_mark(self) -> Any:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        return event.start_mark


def read_yaml(text: str, problems: Problems) -> Any:
    """The document's value, or None after adding the syntax error (with its line) to ``problems``.

    An empty document is None too (without a problem: the caller says what it expected).
    """
    try:
        node = yaml.compose(text, Loader=_BoundedLoader)
        if node is None:
            return None
        return _Builder(problems).build(node, 1, None)
    except _Refused as exc:
        problems.add(exc.line, exc.message)
        return None
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


def _deref(node: yaml.Node) -> yaml.Node:
    return node.target if isinstance(node, _Alias) else node


_Pairs = list[tuple[yaml.Node, yaml.Node]]


class _Builder:
    """Values from nodes, counting what aliases repeat.

    A node built a second time is a repetition (an alias, or a merge, brought it back):
    each counts against ``MAX_REPEATED``, so the work done is at most the file's own nodes
    plus that bound. ``depth`` counts nesting through aliases too (an alias may even name
    a collection that contains it).
    """

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self.constructor = SafeConstructor()
        self.built: set[int] = set()
        self.repeated = 0
        self.merged: dict[int, tuple[_Pairs, _Pairs]] = {}
        self.merging: set[int] = set()

    def charge(self, count: int, line: int) -> None:
        self.repeated += count
        if self.repeated > MAX_REPEATED:
            raise _Refused(
                line,
                f"YAML aliases here repeat more than {MAX_REPEATED:,} values in all (each alias copies "
                "what its anchor holds, so nested aliases multiply); write the values out or use fewer aliases",
            )

    def build(self, node: yaml.Node, depth: int, alias_line: int | None) -> Any:
        if isinstance(node, _Alias):
            alias_line = alias_line or node.start_mark.line + 1
            node = node.target
        line = node.start_mark.line + 1
        where = alias_line or line
        if depth > MAX_DEPTH:
            raise _too_deep(where)
        if id(node) in self.built:
            self.charge(1, where)
        self.built.add(id(node))
        if isinstance(node, yaml.MappingNode):
            return self.mapping(node, depth, alias_line)
        if isinstance(node, yaml.SequenceNode):
            items = YamlList()
            items.line = line
            items.item_lines = []
            for item in node.value:
                items.append(self.build(item, depth + 1, alias_line))
                items.item_lines.append(item.start_mark.line + 1)
            return items
        return self.scalar(node)

    def mapping(self, node: yaml.MappingNode, depth: int, alias_line: int | None) -> YamlMap:
        # Keys merged in with '<<' come first so the mapping's own keys override them (as
        # in safe_load); only an own key given twice is a problem.
        merged, own = self.flatten(node, depth, alias_line)
        out = YamlMap()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        own_keys: set[str] = set()
        for pairs, is_own in ((merged, False), (own, True)):
            for key_node, value_node in pairs:
                key_line = key_node.start_mark.line + 1
                key = self.scalar(key_node)
                if not isinstance(key, str):
                    self.problems.add(key_line, f"a key must be a text, got {key!r}; write a field name")
                    continue
                if is_own:
                    if key in own_keys:
                        self.problems.add(
                            key_line,
                            f"key {key!r} appears twice in one mapping (first on line {out.key_lines[key]}); "
                            "give each key once",
                        )
                        continue
                    own_keys.add(key)
                out[key] = self.build(value_node, depth + 1, alias_line)
                out.key_lines[key] = key_line
        return out

    def flatten(self, node: yaml.MappingNode, depth: int, alias_line: int | None) -> tuple[_Pairs, _Pairs]:
        """``(merged, own)``: the pairs ``<<`` brings in (the first mapping of a merged list
        winning, as in safe_load) and the mapping's own pairs; each merged pair is charged."""
        done = self.merged.get(id(node))
        if done is not None:
            return done
        where = alias_line or node.start_mark.line + 1
        if depth > MAX_DEPTH:
            raise _too_deep(where)
        if id(node) in self.merging:
            raise _Refused(where, "a mapping merges itself (through an alias); merge another mapping")
        self.merging.add(id(node))
        merged: _Pairs = []
        own: _Pairs = []
        for key_node, value_node in node.value:
            if _deref(key_node).tag != _MERGE:
                own.append((key_node, value_node))
                continue
            value_line = value_node.start_mark.line + 1
            source = _deref(value_node)
            sources = source.value if isinstance(source, yaml.SequenceNode) else [source]
            for item in reversed(sources):
                target = _deref(item)
                if not isinstance(target, yaml.MappingNode):
                    self.problems.add(
                        item.start_mark.line + 1,
                        "a merge key (<<) takes a mapping or a list of mappings, e.g. <<: *defaults",
                    )
                    continue
                inner_merged, inner_own = self.flatten(target, depth + 1, alias_line or value_line)
                self.charge(len(inner_merged) + len(inner_own), alias_line or value_line)
                merged += inner_merged
                merged += inner_own
        self.merging.discard(id(node))
        self.merged[id(node)] = (merged, own)
        return merged, own

    def scalar(self, node: yaml.Node) -> Any:
        node = _deref(node)
        if not isinstance(node, yaml.ScalarNode):
            self.problems.add(node.start_mark.line + 1, "a key must be a plain text, not a list or a mapping")
            return None
        if node.tag == _VALUE:  # the '=' key: safe_load reads it as the text "="
            return node.value
        try:
            return self.constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError) as exc:
            # ValueError: e.g. an integer of more digits than Python converts (4,300).
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
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            problems.add(
                1,
                f"the rules file is larger than {MAX_FILE_BYTES:,} bytes; a rules file is a few kilobytes: "
                "give the right file, or split it",
            )
            return None
        # Universal newlines, as reading in text mode does.
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
    except (OSError, UnicodeDecodeError) as exc:
        problems.add(1, f"cannot read the rules file ({exc}); give a readable UTF-8 YAML file")
        return None
