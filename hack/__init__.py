"""Generators and one-off tools for the repository (not shipped in any image)."""
