"""Restarts in place: the keeper in front of torchrun (gang) and the warm launcher. Imports
`contract` (and the stdlib) only.
"""
