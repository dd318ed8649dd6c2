"""plait.nn: layers, losses and containers mirroring torch.nn (names, defaults, parameter names)."""

from plait.nn import functional
