"""tsar.TensorInfo: what the index says about one tensor (Archive.info, Archive.infos).
Its own module, imported on first use: a dataclass costs ~1 ms to create, which
`import tsar` in every worker need not pay."""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """What the index says about one tensor, without touching its bytes."""

    name: str
    entry: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    strides: Tuple[int, ...]
    storage_offset: int  # in elements
    storage: int  # storage id: equal for tensors that share a storage
    role: str  # "tensor", "parameter", "buffer" or "sparse_component"
    requires_grad: bool
    # The dimension a tensor-parallel archive (saved with ``tp=``) splits it
    # along for its ranks, or None for a tensor stored whole.
    shard_dim: Optional[int] = None

    def __post_init__(self):
        if self.shard_dim is not None and self.shard_dim < 0:
            object.__setattr__(self, "shard_dim", None)
