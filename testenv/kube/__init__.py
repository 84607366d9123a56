"""A Kubernetes control plane, KCM, the real kubelet, and the stand-ins of controllers."""
