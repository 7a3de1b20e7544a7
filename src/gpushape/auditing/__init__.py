"""What is wrong with a design on a given GPU: rules, findings, reports.

    from gpushape.auditing import audit, Finding, Severity, register_rule
    report = audit(model, example_inputs, gpu="h200")

Names load on first use, so `import gpushape.auditing` stays free of torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "audit": "api",
    "Report": "report",
    "Finding": "finding",
    "Severity": "finding",
    "register_rule": "registry",
    "load_rules": "registry",
    "AuditContext": "context",
    "BackendFlags": "context",
    "FIXES": "fixes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpushape.auditing' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
