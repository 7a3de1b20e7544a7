"""BatchNorm (training statistics) + activation (+ residual) in one kernel pair per pass.

The public op is `batch_norm_act.py` (`batch_norm_act`, `BatchNormAct2d`, exported by
`gpushape.kernels`); kernels, launch plans and the measured tuning table are private modules.
"""
