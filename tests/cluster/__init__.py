"""The cluster tier: a real Kubernetes control plane and bubblewrap-backed nodes on loopback."""
