"""FLOPs and minimum bytes per op: `registry.py` (the conventions, `register_formula`, `op_work`)
and one file of formulas per op family (matmul, conv, attention, norm, memory)."""
