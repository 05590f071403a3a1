"""``ratekeeper config check FILE``: validate a rules file (either form) and summarise it.

Exit 0 with one line per rule (and the warnings), or exit 1 with every problem.
"""

from __future__ import annotations

import argparse
import sys

from ratekeeper.config import ConfigProblems, HttpRule, KeyTemplate, RuleSet, load_any
from ratekeeper.config.envoy import EnvoyNode
from ratekeeper.config.native import NEVER_HOSTS, NEVER_METHODS, NEVER_PATH

__all__ = ["add_parser", "describe_envoy_node", "describe_http_rule", "run"]


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config",
        help="check a rules file",
        description="Work with rules files (the native form, rules:, or the Envoy form, domain:).",
    )
    actions = p.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check",
        help="validate a rules file and summarise its rules",
        description=(
            "Validate a rules file and print one line per rule (exit 0), or every problem "
            "with its file and line (exit 1). Warnings are printed either way."
        ),
        epilog="example: ratekeeper config check rules.yaml",
    )
    check.add_argument("file", metavar="FILE", help="the rules file (YAML)")


def run(args: argparse.Namespace) -> int:
    try:
        loaded = load_any(args.file)
    except ConfigProblems as exc:
        for problem in exc.problems:
            print(problem, file=sys.stderr)
        for warning in exc.warnings:
            print(warning, file=sys.stderr)
        n = len(exc.problems)
        print(f"{args.file}: {n} problem{'s' if n != 1 else ''}; the file was not loaded", file=sys.stderr)
        return 1
    if isinstance(loaded, RuleSet):
        for http_rule in loaded:
            print(describe_http_rule(http_rule))
        summary = f"{args.file}: native form, {len(loaded)} rule{'s' if len(loaded) != 1 else ''}"
    else:
        print(f"domain {loaded.domain}")
        for node in loaded.nodes:
            print(describe_envoy_node(node))
        summary = f"{args.file}: Envoy form, domain {loaded.domain!r}, {len(loaded.nodes)} limited descriptors"
    for warning in loaded.warnings:
        print(warning)
    print(f"{summary}, {len(loaded.warnings)} warning{'s' if len(loaded.warnings) != 1 else ''}: OK")
    return 0


def describe_http_rule(r: HttpRule) -> str:
    """One line: name, match, key, limits, algorithm, flags."""
    m = r.match
    methods = ",".join(sorted(m.methods)) or "*"
    if m.methods is NEVER_METHODS:
        methods = "(no method)"
    paths = "(no path)" if m.paths == (NEVER_PATH,) else "|".join(p.source for p in m.paths) or "/*"
    match = f"{methods} {paths}"
    if m.hosts:
        match += " host=" + ("(none)" if m.hosts is NEVER_HOSTS else ",".join(sorted(m.hosts)))
    key = r.key.describe()
    limits = ", ".join(str(x) for x in r.rule.limits)
    flags = []
    if r.shadow:
        flags.append("shadow")
    if r.rule.on_error:
        flags.append(f"on_error={r.rule.on_error}")
    if r.rule.burst:
        flags.append(f"burst={r.rule.burst}")
    if r.cost != 1:
        flags.append(f"cost={r.cost.source if isinstance(r.cost, KeyTemplate) else r.cost}")
    if r.rule.quota is not None:
        flags.append("quota")
    tail = f" [{' '.join(flags)}]" if flags else ""
    return f"{r.name}: {match} key={key} limits={limits} algorithm={r.rule.algorithm}{tail}"


def describe_envoy_node(n: EnvoyNode) -> str:
    """One line per limited descriptor: its id, the rule name, limits, algorithm, flags."""
    flags = []
    flags += [f for f, on in (("shadow_mode", n.shadow), ("quota_mode", n.quota_mode)) if on]
    flags += [f for f, on in (("share_threshold", n.share_threshold), ("value_to_metric", n.value_to_metric)) if on]
    if n.detailed_metric:
        flags.append("detailed_metric")
    if n.replaces:
        flags.append("replaces=" + ",".join(n.replaces))
    tail = f" [{' '.join(flags)}]" if flags else ""
    name = f" name={n.name}" if n.name else ""
    if n.blocked:
        return f"{n.descriptor}:{name} blocked (requests_per_unit: 0, every request refused){tail}"
    if n.rule is None:
        return f"{n.descriptor}:{name} unlimited{tail}"
    limits = ", ".join(str(x) for x in n.rule.limits)
    return f"{n.descriptor}:{name} limits={limits} algorithm={n.rule.algorithm}{tail}"
