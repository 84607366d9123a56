"""Gardener, asked rather than imitated: its resource manager (grm), the real
dependency-watchdog (dependency_watchdog) and our stand-in of one prober, checked against it
(prober_standin), Gardener's objects in a seed (seed_objects), its own Go types and functions
asked about ours (gardener_types), the extension's registration (registration), and applying
manifests and rendering kustomizations (apply).

May import: core, image, base, kube.
"""
