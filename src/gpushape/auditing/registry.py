"""Rules, registered by id with `@register_rule`. A new rule is one new file in audit/rules/.

    @register_rule("tc-align", title="dimension misses the tensor-core granularity")
    def check(ctx: AuditContext) -> Iterable[Finding]: ...

Every module in `gpushape.audit.rules` is imported by `load_rules()`, so dropping a file there
registers its rule; tests are parametrized over the registry, so a rule without a test case
fails the suite.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import GpushapeError

if TYPE_CHECKING:
    from .context import AuditContext
    from .finding import Finding

Check = Callable[["AuditContext"], Iterable["Finding"]]


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    check: Check


_RULES: dict[str, Rule] = {}
_loaded = False


def register_rule(rule_id: str, *, title: str) -> Callable[[Check], Check]:
    def decorate(fn: Check) -> Check:
        if rule_id in _RULES and _RULES[rule_id].check is not fn:
            raise ValueError(f"rule {rule_id!r} is registered twice")
        _RULES[rule_id] = Rule(rule_id, title, fn)
        return fn

    return decorate


def load_rules() -> dict[str, Rule]:
    """Every rule, by id (imports each file of audit/rules once)."""
    global _loaded
    if not _loaded:
        from . import rules

        for info in pkgutil.iter_modules(rules.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{rules.__name__}.{info.name}")
        _loaded = True
    return dict(sorted(_RULES.items()))


def select_rules(ids: Iterable[str] | None = None) -> list[Rule]:
    rules = load_rules()
    if ids is None:
        return list(rules.values())
    wanted = list(ids)
    unknown = [i for i in wanted if i not in rules]
    if unknown:
        raise GpushapeError(
            f"unknown rule {', '.join(map(repr, unknown))}; known: {', '.join(rules)}"
        )
    return [rules[i] for i in wanted]


def run_rules(ctx: AuditContext, ids: Iterable[str] | None = None) -> list[Finding]:
    from .finding import sort_findings

    findings: list[Finding] = []
    for rule in select_rules(ids):
        findings.extend(rule.check(ctx))
    return sort_findings(findings)
