"""Developer tooling that no image ships: the CRD generator (``python -m
kgroup_devtools.crdgen``) and the CRD's field descriptions it merges in."""
