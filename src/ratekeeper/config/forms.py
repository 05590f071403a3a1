"""``load_any``: a rules file of either form, told apart by its top level (``domain`` = Envoy)."""

from __future__ import annotations

import os

from ratekeeper.config.envoy import EnvoyConfig, envoy_of
from ratekeeper.config.model import RuleSet
from ratekeeper.config.native import rules_of
from ratekeeper.config.problems import Problems
from ratekeeper.config.yamlfile import YamlMap, load_file, read_yaml

__all__ = ["is_envoy", "load_any", "parse_any"]


def is_envoy(text: str) -> bool:
    """Whether the document is of the Envoy form: a mapping with a top-level ``domain``.

    A document that does not even read as YAML counts as native (its loader reports why).
    """
    doc = read_yaml(text, Problems("<detect>"))
    return isinstance(doc, YamlMap) and "domain" in doc


def parse_any(text: str, source: str = "<string>") -> RuleSet | EnvoyConfig:
    """Either form of a document given as text, read once (a big file costs one parse)."""
    problems = Problems(source)
    doc = read_yaml(text, problems)
    if isinstance(doc, YamlMap) and "domain" in doc:
        return envoy_of(doc, problems)
    return rules_of(doc, problems)


def load_any(path: str | os.PathLike[str]) -> RuleSet | EnvoyConfig:
    """The file's ``RuleSet`` (native form) or ``EnvoyConfig`` (top-level ``domain``);
    ``ConfigProblems`` listing every problem otherwise. A file with Envoy's ``descriptors``
    but no ``domain`` is reported as an Envoy file that lacks its domain."""
    return load_file(path, parse_any)
