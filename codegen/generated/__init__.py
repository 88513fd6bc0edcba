"""Kernel modules rendered from templates/ by `python -m codegen render`. Do not edit by hand."""
