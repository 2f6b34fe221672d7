"""Downstream evaluation: metrics as the official evaluators compute them, and Meta-Sum."""
