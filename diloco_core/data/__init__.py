"""Training data: a seeded synthetic language with an exact loss floor, or a local file.

Layer 2. Pure numpy (Grain for files): batches are a function of ``(seed, replica, step)``.

May import: spec.

Modules: :mod:`~diloco_core.data.sources` (``DataConfig``, ``make_dataset``),
:mod:`~diloco_core.data.dataset` (the batch interface and random streams),
:mod:`~diloco_core.data.markov` (the Markov source), :mod:`~diloco_core.data.files` (local token
files, read on demand), :mod:`~diloco_core.data.grain_data` (the Grain pipeline over files).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "DataConfig": "diloco_core.data.sources",
    "make_dataset": "diloco_core.data.sources",
    "MarkovSource": "diloco_core.data.markov",
    "open_tokens": "diloco_core.data.files",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
