"""Test tooling that no image copies: the sidecar harness (a sidecar process on a scripted
target, its audit file read back, the safety check over several sidecars' audits)."""
