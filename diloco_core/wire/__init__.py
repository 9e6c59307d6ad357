"""What crosses the link: quantization, sparsification, packed payloads, reduce-scatter.

Layer 2.

May import: spec.

Modules: :mod:`~diloco_core.wire.minifloat` (rounding to low-precision formats),
:mod:`~diloco_core.wire.compression` (quantize, error feedback, bits on the wire),
:mod:`~diloco_core.wire.sparse` (top-k), :mod:`~diloco_core.wire.packing` (the bytes of a
payload), :mod:`~diloco_core.wire.reduce_scatter` (chunked mean, re-quantized).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "quantize": "diloco_core.wire.compression",
    "quantize_tree": "diloco_core.wire.compression",
    "error_feedback": "diloco_core.wire.compression",
    "wire_bits": "diloco_core.wire.compression",
    "representable_values": "diloco_core.wire.minifloat",
    "WireLayout": "diloco_core.wire.packing",
    "WirePackingError": "diloco_core.wire.packing",
    "pack_payload": "diloco_core.wire.packing",
    "unpack_payload": "diloco_core.wire.packing",
    "ChunkPlan": "diloco_core.wire.reduce_scatter",
    "requantize_mean": "diloco_core.wire.reduce_scatter",
    "sparsify": "diloco_core.wire.sparse",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
