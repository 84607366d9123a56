"""Processes, waiting, the KAPI client, certificates, the binaries and the images."""
