"""Shared test setup.

Tiny models run ~30x faster with one intra-op thread than with oversubscribed threads on a
busy 2-core machine, so the test run pins torch to one thread.
"""
import torch

torch.set_num_threads(1)
