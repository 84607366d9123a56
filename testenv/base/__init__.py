"""What every other room stands on, needing neither a control plane nor a network of its own:
the one way to start a program (process), the one background loop and the one wait (poller,
wait), the small KAPI client (kapi), certificates (pki), building the pinned binaries
(binaries) and what a long build says while it runs (progress), running the project's images
(containers) and the agent's image's interpreter settings (imagelike), what client-go makes of
a kubeconfig (kubeconfig_probe), and this project's earlier releases (releases).

May import: core, image.
"""
