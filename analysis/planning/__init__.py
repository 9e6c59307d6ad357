"""The planning library: numpy / pandas / matplotlib only, no JAX and no trainer.

Catalogs (:mod:`~analysis.planning.hardware`, :mod:`~analysis.planning.models`), closed forms
(:mod:`~analysis.planning.roofline`, :mod:`~analysis.planning.op_cost`, :mod:`~analysis.planning.bandwidth`,
:mod:`~analysis.planning.memory`), the compute-utilization simulator
(:mod:`~analysis.planning.simulate`, :mod:`~analysis.planning.sim_events`), goodput under
failures (:mod:`~analysis.planning.goodput`), a heterogeneous pool under the syncer rule
(:mod:`~analysis.planning.pool`, :mod:`~analysis.planning.pool_plan`), Decoupled DiLoCo's published
goodput beside that model (:mod:`~analysis.planning.published_goodput`), the papers' tables
(:mod:`~analysis.planning.paper_tables`) and the planner (:mod:`~analysis.planning.plan`,
:mod:`~analysis.planning.candidates`). Their public names are re-exported by :mod:`analysis`.
"""
