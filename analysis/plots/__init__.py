"""Figures for the docs and notebooks: each function takes data and returns a Figure (or a
colored table).

Nothing here computes a result. Figures are closed in pyplot before they are returned, so a
notebook shows them only where they are displayed or glued (:func:`~analysis.plots.notebook.glue`: placed by the docs
build, shown in the cell elsewhere). By figure family:
:mod:`analysis.plots.results` (sweep results and calculator tables),
:mod:`analysis.plots.timelines` (communication schedules and simulated runs),
:mod:`analysis.plots.tape_timeline` (the syncer rule's simulated tapes, replica by replica),
:mod:`analysis.plots.tables` (a paper's table beside ours, colored) and
:mod:`analysis.plots.design` (the device mesh and its collectives).
"""

from analysis.plots._style import LABELS
from analysis.plots._style import SYMBOLS
from analysis.plots._style import label
from analysis.plots._style import short
from analysis.plots.design import plot_layers
from analysis.plots.design import plot_mesh
from analysis.plots.notebook import glue
from analysis.plots.results import plot_bars
from analysis.plots.results import VERDICT_COLORS
from analysis.plots.results import plot_curves
from analysis.plots.results import plot_goodput
from analysis.plots.results import plot_intervals
from analysis.plots.results import plot_lines
from analysis.plots.results import plot_metric
from analysis.plots.results import plot_roofline
from analysis.plots.results import plot_tradeoff
from analysis.plots.tables import STEP_COLORS
from analysis.plots.tables import side_by_side
from analysis.plots.tape_timeline import plot_tapes
from analysis.plots.tape_timeline import tape_spans
from analysis.plots.timelines import plot_elastic
from analysis.plots.timelines import plot_hiding
from analysis.plots.timelines import plot_schedule
from analysis.plots.timelines import plot_timeline
from analysis.plots.timelines import schedule_frame
from analysis.plots.timelines import schedule_text
