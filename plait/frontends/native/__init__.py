"""The native frontend: plait.Tensor and the functions that build graphs from it."""
