"""Pixel-side building blocks for SOHO, in plain torch (no torchvision on these machines)."""
