"""Every registered rule fires on its textbook case, at the right module with a positive
saving, and stays silent on a twin that does the same thing well (cases.py)."""

from __future__ import annotations

import pytest

from gpushape.auditing import audit
from gpushape.auditing.finding import Severity
from gpushape.auditing.fixes import FIXES
from gpushape.auditing.registry import load_rules

from .cases import CASES

RULES = sorted(load_rules())


def _findings(side, rule: str):
    model, inputs, kwargs = side.build()
    return audit(model, inputs, rules=[rule], **kwargs).findings


def test_rule_ids_are_designs_table():
    design = {
        "tc-align",
        "nchw-conv",
        "fp32-math",
        "unfused-norm-act",
        "bn-no-running-stats",
        "conv-bias-before-bn",
        "separate-qkv",
        "manual-attention",
        "attention-head-dim",
        "unfused-softmax-dropout",
        "unfused-activation",
        "dense-mlm-head",
        "materialized-attention-mask",
        "kv-cache-in-training",
        "slow-max-pool",
        "unfused-grn",
        "slow-group-norm",
        "slow-stem",
        "launch-bound",
        "wave-quantization",
        "checkpoint-candidate",
        "optimizer-not-fused",
        "dataloader",
    }
    assert set(RULES) == design


@pytest.mark.parametrize("rule", RULES)
def test_every_rule_has_a_case(rule):
    assert rule in CASES, f"rule {rule} has no firing model and twin in tests/auditing/cases.py"


@pytest.mark.parametrize("rule", RULES)
def test_rule_fires(rule):
    case = CASES[rule]
    findings = _findings(case.fires, rule)
    assert findings, f"{rule} did not fire on its case"
    top = max(findings, key=lambda f: f.gpu_severity)
    assert top.rule == rule
    assert top.gpu_severity > Severity.INFO  # graded by the GPU: the mode's wall in test_modes
    assert top.module == case.module
    assert top.fix is None or top.fix in FIXES
    assert top.message and top.evidence
    if case.saving == "time":
        assert top.est_saving_s is not None and top.est_saving_s > 0
    elif case.saving == "memory":
        assert top.est_saving_s is None and top.evidence["freed_bytes"] > 0
    else:
        assert top.est_saving_s is None


@pytest.mark.parametrize("rule", RULES)
def test_twin_does_not_fire(rule):
    findings = _findings(CASES[rule].twin, rule)
    assert not findings, [f.to_dict() for f in findings]
