"""Kernels for a Linear's backward: the bias gradient as a column sum."""
