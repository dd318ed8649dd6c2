"""Frontends: the native Tensor API, PyTorch (torch.compile backend) and ONNX."""
