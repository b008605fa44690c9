"""Shared test setup.

Tiny models run ~30x faster with one intra-op thread than with oversubscribed threads on a
busy 2-core machine, so the test run pins torch to one thread. The verifier plugin ``univer_patch`` is imported
explicitly, as the harness and users do.
"""
import torch

import univer_patch  # noqa: F401  (the plugin eagle never imports: registers traversal, greedy, univer)

torch.set_num_threads(1)
