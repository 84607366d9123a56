"""The shoot-side agent: renews this node's lease through the KAPI's external DNS name."""
