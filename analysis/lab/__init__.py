"""The experiments machinery behind the docs: it trains, so it needs the trainer (JAX).

Sweeps and their cache (:mod:`~analysis.lab.sweeps`, :mod:`~analysis.lab.sweep_cache`), the
docs' named experiments (:mod:`~analysis.lab.experiments`), a notebook's live sweep
(:mod:`~analysis.lab.live`), the stored experiments and their re-check
(:mod:`~analysis.lab.stored`, :mod:`~analysis.lab.storing`, :mod:`~analysis.lab.recheck`, :mod:`~analysis.lab.recheck_build`, :mod:`~analysis.lab.realizations`,
:mod:`~analysis.lab.cpu_kind`), the papers' claims tested on them (:mod:`~analysis.lab.claims`)
measured background runs (:mod:`~analysis.lab.measured`, stored: :mod:`~analysis.lab.overlap_measured`,
:mod:`~analysis.lab.wire_measured`) and the accelerator measurements
(:mod:`~analysis.lab.accelerator`, :mod:`~analysis.lab.roofline_measured`,
:mod:`~analysis.lab.main_job_measured`, :mod:`~analysis.lab.notebooks_measured`). Nothing here is imported by
``import analysis``; ``from analysis import stored`` loads a module on first use.
"""
