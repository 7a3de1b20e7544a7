"""docs/ stays true to the code: every rule and fix documented, the guide's verdicts as measured,
the JSON schema as written, and every link pointing into the repository."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [*sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def test_every_registered_rule_has_a_section():
    from gpushape.auditing.registry import load_rules

    text = (DOCS / "rules.md").read_text()
    sections = set(re.findall(r"^## `([a-z0-9-]+)`$", text, re.M))
    rules = set(load_rules())
    assert rules - sections == set(), "rules without a section in docs/rules.md"
    assert sections - rules == set(), "sections in docs/rules.md for rules that do not exist"


def test_every_fix_id_is_documented():
    from gpushape.auditing.fixes import FIXES

    text = (DOCS / "rules.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, re.M))
    assert documented == set(FIXES)


def test_guide_claims_table_matches_the_probe():
    """Every claim the probe measured is in docs/design.md with the full run's verdict."""
    profile = json.loads(
        (ROOT / "benchmarks/results/probe-h200/h200-sxm.json").read_text(encoding="utf-8")
    )
    text = (DOCS / "design.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \|.*\| ([a-z ]+) \|$", text, re.M))
    for claim in profile["guide_claims"]:
        assert rows.get(claim["id"]) == claim["verdict"], claim["id"]


def test_json_schema_section_lists_every_key():
    import torch

    import gpushape

    model = torch.nn.Sequential(torch.nn.Linear(4095, 64), torch.nn.ReLU())
    with torch.device("meta"):
        model = model.to("meta")
    report = gpushape.audit(model, (torch.empty(256, 4095, device="meta"),), gpu="h100")
    data = report.to_dict()
    assert data["findings"], "the example should produce a finding (tc-align)"
    text = (DOCS / "design.md").read_text().split("## The audit JSON", 1)[1]
    keys = set(data) | {f"totals.{k}" for k in data["totals"]}
    keys |= {f"layers[].{k}" for k in data["layers"][0]}
    keys |= {f"findings[].{k}" for k in data["findings"][0]}
    for key in sorted(keys):
        name = key.rsplit(".", 1)[-1]
        forms = (f"`{key}`", f"`{key}[]`", f"`.{name}`", f"`{name}`")
        assert any(form in text for form in forms), key


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_cite_only_the_repository(page):
    text = page.read_text()
    for outside in ("DESIGN.md", "../shared", "shared/anchors", "gpu-design-guide"):
        assert outside not in text, f"{page.name} refers to {outside}"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        assert (page.parent / target).resolve().exists(), f"{page.name}: broken link {target}"
