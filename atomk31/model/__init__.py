"""The engine's K3.1: batched layers over the paged cache and the KDA state pool."""

from atomk31.model.batch import ForwardBatch
from atomk31.model.k31 import K31Model

__all__ = ["ForwardBatch", "K31Model"]
