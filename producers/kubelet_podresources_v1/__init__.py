"""Generated gRPC modules for the kubelet's pod-resources API v1 (api.proto beside them); do not edit them by hand:
regenerate as api.proto says."""
