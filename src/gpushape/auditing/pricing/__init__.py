"""What-ifs priced with the cost model, shared by the rules: records of untraced ops (`synth`),
padded GEMMs (`padding`), merged projections (`linear`), fused against math attention
(`attention`), an optimizer's step (`optimizer_step`), activations kept for backward (`memory`)."""
