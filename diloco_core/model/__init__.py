"""The built-in model: a small decoder-only transformer in Flax NNX (dense or mixture of experts).

Layer 2.

May import: spec, devices.

Modules: :mod:`~diloco_core.model.transformer` (layer-stacked blocks, the losses),
:mod:`~diloco_core.model.moe` (routing and the expert MLP), :mod:`~diloco_core.model.fused_loss`
(the head and the cross-entropy fused, chunk by chunk), :mod:`~diloco_core.model.embedding` (the
token lookup, whose gradient fuses with a replica-stacked optimizer update).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "Transformer": "diloco_core.model.transformer",
    "init_model": "diloco_core.model.transformer",
    "layer_mask": "diloco_core.model.transformer",
    "muon_dimensions": "diloco_core.model.transformer",
    "lm_loss": "diloco_core.model.transformer",
    "train_loss": "diloco_core.model.transformer",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
