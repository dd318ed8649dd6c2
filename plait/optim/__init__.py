"""plait.optim: SGD (momentum, nesterov, weight decay), Adam and AdamW, with step and cosine LR schedules.

Each step builds the parameter and state updates as one lazy graph (under no_grad) and realizes them together,
so a step is a single compiled plan and no history is kept between steps.

>>> import plait
>>> lin = plait.nn.Linear(2, 1, device="cpu")
>>> opt = plait.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)
>>> lin(plait.Tensor.ones(4, 2, device="cpu")).sum().backward()
>>> opt.step()
"""

from plait.optim import lr_scheduler
from plait.optim.optimizer import SGD, Adam, AdamW, Optimizer

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "lr_scheduler"]
