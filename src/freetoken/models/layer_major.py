"""A prefill split into chunks, run through the decoder layer by layer: every chunk of layer l, then layer l+1.

Chunk c of layer l attends to the K/V that chunks 0..c wrote at layer l, exactly as when the chunks run one
after another through all layers (chunk-major), and every op sees the same inputs: the results are the same.
What changes is the order in which the MoE layers are needed: each once, so a cold prompt streams the expert
pool once instead of once per chunk. The price: the activations of every chunk (``h`` and ``x``, [T_c, D]
each) are kept while the pass runs. Work proceeds in units of (layer, chunk), so a caller can stop between
any two (decode steps of other requests run there) and carry on later.
"""

from __future__ import annotations

import torch

from freetoken.cache.kv_pool import KVPool
from freetoken.layers.attention import AttnBatch
from freetoken.models.decoder import DecoderModel


def activation_bytes(tokens: int, hidden: int, dtype: torch.dtype) -> int:
    """What a layer-major pass keeps per its tokens: the residual ``h`` and the normed ``x``."""
    return 2 * tokens * hidden * torch.empty((), dtype=dtype).element_size()


class LayerMajorPass:
    def __init__(self, model: DecoderModel, chunks: list[tuple[torch.Tensor, AttnBatch]], kv: KVPool) -> None:
        if not model.layers:
            raise ValueError("a layer-major pass needs at least one decoder layer")
        self.model, self.kv = model, kv
        self.batches = [b for _, b in chunks]
        self._ids = [ids for ids, _ in chunks]
        self.h: list[torch.Tensor] = []
        self.x: list[torch.Tensor] = []
        self.layer, self.chunk = 0, 0  # the next unit

    @property
    def num_chunks(self) -> int:
        return len(self.batches)

    @property
    def done(self) -> bool:
        return self.layer == len(self.model.layers)

    @property
    def units_left(self) -> int:
        return (len(self.model.layers) - self.layer) * self.num_chunks - self.chunk

    @torch.inference_mode()
    def run_unit(self) -> None:
        """Layer ``self.layer`` (attention, then its MLP or MoE) over chunk ``self.chunk``."""
        m, c = self.model, self.chunk
        if self.layer == 0:  # embeddings when a chunk first comes
            h, x = m.start(self._ids[c], self.batches[c])
            self.h.append(h)
            self.x.append(x)
        self.h[c], self.x[c] = m.block(self.layer, self.h[c], self.x[c], self.batches[c], self.kv)
        self.chunk += 1
        if self.chunk == self.num_chunks:
            self.layer, self.chunk = self.layer + 1, 0

    def run(self) -> list[torch.Tensor]:
        while not self.done:
            self.run_unit()
        return self.hidden()

    def hidden(self) -> list[torch.Tensor]:
        """Each chunk's final hidden states [T_c, D] (after the final norm), once ``done``."""
        assert self.done, "the pass has layers left"
        return self.x
