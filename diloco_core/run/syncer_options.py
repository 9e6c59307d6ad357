"""The run's syncer options (``TrainConfig.syncer``): the syncer rule's knobs as trainer flags.

:class:`SyncerOptions` declares each knob of :class:`~diloco_core.spec.syncer.SyncerConfig` as a
field with its flag (``--quorum``, ``--grace``, ``--late``, ...), plus the replicas' speeds and
the link of the simulated time (:func:`~diloco_core.runtime.tape_player.tape_for`). **At their
defaults** :func:`~diloco_core.run.loop.train` runs exactly as before (the in-step runtime's
lock step, every number unchanged); **any other value** makes ``train`` play the tape of the
run's syncer on replicas of those speeds (:mod:`~diloco_core.runtime.tape_player`), which supports
P = 1, τ = 0 only: :func:`~diloco_core.runtime.option_checks.check_playable` refuses the rest with one line before anything
compiles.

**On real processes** (``communication="background"``) nothing is played: ``quorum`` with
``elastic`` makes each sync a K-of-M vote in wall-clock time, open ``grace_s`` seconds after its
K-th replica (:mod:`~diloco_core.runtime.quorum`; a late process is dropped from that sync and
healed), and ``step_delay`` slows named processes (a straggler for tests and demos);
:func:`check_on_processes` refuses the tape's other knobs there in one line. An elastic run
records its rounds (``<out>/tape.json``); ``tape`` replays that file with the in-step trainer,
its drops as ``drop_schedule`` (:func:`check_tape`).

Examples:
  >>> SyncerOptions().is_default(), SyncerOptions(quorum=1, late="carry").is_default()
  (True, False)
  >>> SyncerOptions(speeds=(1.0, 0.5), dylu=True).syncer_config(2).inner_steps_of(4, 2)
  (4, 2)
  >>> parse_speeds("1, 1, 0.5")
  (1.0, 1.0, 0.5)
  >>> parse_step_delay("2:0.5, 1:0.1")
  ((2, 0.5), (1, 0.1))
"""

from __future__ import annotations

import dataclasses
import threading

from diloco_core.runtime.option_checks import check_playable
from diloco_core.spec import validity as v
from diloco_core.spec.fields import field, flag_names
from diloco_core.spec.syncer import (APPLY_MODES, LATE_POLICIES, PROCESS_KNOBS, STALENESS_EXPONENT, WEIGHTINGS,
                                     SyncerConfig, tape_only_knobs)

__all__ = ["MAX_STEP_DELAY_S", "SyncerOptions", "check_on_processes", "check_step_delay_processes", "check_tape", "parse_inner_steps", "parse_speeds",
           "parse_step_delay", "syncer_flags", "tape_drops"]

_G = "syncer"
#: The longest ``step_delay`` (and ``grace_s``) in seconds: what a timer of this Python can wait
#: (``threading.TIMEOUT_MAX``; about 292 years on Linux). Beyond it ``time.sleep`` overflows.
MAX_STEP_DELAY_S = threading.TIMEOUT_MAX


def _parse_list(text: str | None, name: str, kind, example: str) -> tuple | None:
  if text is None or not str(text).strip():
    return None
  try:
    return tuple(kind(x.strip()) for x in str(text).split(","))
  except ValueError:
    raise ValueError(f"`{name}` must be comma-separated {kind.__name__}s, one per replica, e.g. {example};"
                     f" got {text!r}.") from None


def parse_speeds(text: str | None) -> tuple | None:
  """``"1,1,0.5"`` -> ``(1.0, 1.0, 0.5)`` (None for no text)."""
  return _parse_list(text, "speeds", float, "1,1,0.5")


def parse_inner_steps(text: str | None) -> tuple | None:
  """``"4,4,2"`` -> ``(4, 4, 2)`` (None for no text)."""
  return _parse_list(text, "inner_steps", int, "4,4,2")


def parse_step_delay(text: str | None) -> tuple | None:
  """``"2:0.5,1:0.1"`` -> ``((2, 0.5), (1, 0.1))``: (process, seconds) pairs (None for no text)."""
  if text is None or not str(text).strip():
    return None
  try:
    return tuple((int(p), float(d)) for p, d in (x.strip().split(":") for x in str(text).split(",")))
  except ValueError:
    raise ValueError(f"`step_delay` must be comma-separated PROCESS:SECONDS pairs, e.g. 2:0.5; got {text!r}.") from None




@dataclasses.dataclass(frozen=True)
class SyncerOptions:
  """The syncer's knobs of one run (:class:`~diloco_core.spec.syncer.SyncerConfig`'s, same names)
  and the simulated time of its tape; the defaults are today's synchronous trainer."""

  speeds: tuple | None = field(
      None, flag="speeds", group=_G, parse=parse_speeds, symbol="v_m",
      help="each replica's speed, steps per unit of time, e.g. 1,1,0.5 (the tape's step times; with"
           " --dylu also DyLU's inner steps); default: all equal")
  inner_steps: tuple | None = field(
      None, flag="inner-steps-per-replica", group=_G, parse=parse_inner_steps, symbol="H_m",
      help="each replica's inner steps per contribution, e.g. 4,4,2 (default: H for every replica)")
  dylu: bool = field(False, flag="dylu", group=_G,
                     help="DyLU: H_m = max(1, floor(H v_m / max v)) from --speeds")
  quorum: int | None = field(None, flag="quorum", group=_G, parse=int, symbol="K",
                             help="contributions a round waits for (default: every live replica)")
  grace: int = field(0, flag="grace", group=_G, symbol="G",
                     help="ticks a round stays open after its K-th contribution")
  late: str = field("drop", flag="late", group=_G, help=f"a late contribution: one of {LATE_POLICIES}")
  max_staleness: int | None = field(None, flag="max-staleness", group=_G, parse=int, symbol="s",
                                    help="late carry: the largest staleness admitted, in versions (committed rounds, also under"
                                         " --outer-apply sequential, where Liu et al. count outer steps) (default: any)")
  apply: str = field("merged", flag="outer-apply", group=_G,
                     help=f"a round's outer step: one of {APPLY_MODES} (sequential: one per contribution)")
  buffer: int = field(1, flag="outer-buffer", group=_G, symbol="N",
                      help="Delayed Nesterov's buffer (1: the outer optimizer as it is)")
  activation: float = field(0.0, flag="momentum-activation", group=_G, symbol="c",
                            help="Delayed Nesterov's momentum activation, in [0, 1/N]")
  weights: str = field("uniform", flag="contribution-weights", group=_G,
                       help=f"a round's contribution weights: one of {WEIGHTINGS} (staleness: s in versions, as --max-staleness)")
  staleness_exponent: float = field(STALENESS_EXPONENT, flag="staleness-exponent", group=_G, symbol="a",
                                    help="weights staleness: the discount (1 + s)^-a")
  radial: bool = field(False, flag="radial", group=_G, help="radial-directional mean of a merged round")
  latency: int = field(0, flag="link-latency", group=_G, help="the tape's link latency, ticks each way")
  transfer: int = field(0, flag="link-transfer", group=_G, help="the tape's transfer time of one payload, ticks")
  grace_s: float = field(0.0, flag="grace-s", group=_G,
                         help="real processes (background, elastic, --quorum): seconds a sync stays open"
                              " after its K-th replica (--grace is the tape's, in ticks)")
  step_delay: tuple | None = field(
      None, flag="step-delay", group=_G, parse=parse_step_delay,
      help="real processes (background): PROCESS:SECONDS[,...], the named process sleeps that long"
           " after each inner step (a straggler: slower, same numbers)")
  tape: str | None = field(
      None, flag="tape", group=_G,
      help="in-step: replay the rounds an elastic run over real processes recorded (its <out>/tape.json)"
           " as its drops, on any mesh; every other syncer knob at its default")

  def is_default(self) -> bool:
    """Every knob at its default: the trainer's own lock step (no tape)."""
    return self == SyncerOptions()

  def plays_tape(self, cfg) -> bool:
    """Whether ``train`` plays the tape of a simulated syncer: a knob off its default, in-step, no
    recorded ``tape`` (replayed by the trainer itself: :func:`check_tape`; background: real processes)."""
    return not self.is_default() and self.tape is None and cfg.communication != "background"

  def syncer_config(self, replicas: int) -> SyncerConfig:
    """The :class:`~diloco_core.spec.syncer.SyncerConfig` of these options (not checked)."""
    if self.dylu and self.speeds is None:
      raise ValueError("`dylu` takes the inner steps from the replicas' speeds: pass `speeds`.")
    return SyncerConfig(inner_steps=self.inner_steps, speeds=self.speeds if self.dylu else None,
                        quorum=self.quorum, grace=self.grace, late=self.late, max_staleness=self.max_staleness,
                        apply=self.apply, buffer=self.buffer, activation=self.activation, weights=self.weights,
                        staleness_exponent=self.staleness_exponent, radial=self.radial)

  def replica_speeds(self, replicas: int) -> tuple:
    """``speeds``, or 1 for every replica."""
    return (1.0,) * replicas if self.speeds is None else self.speeds

  def validate(self, cfg) -> None:
    """One-line ``ValueError`` for a bad knob, or a run the tape player cannot play (nothing for the defaults)."""
    if self.is_default():
      return
    m = cfg.algo.replicas
    v.check_bool("`dylu`", self.dylu)
    v.check_bool("`radial`", self.radial)
    if self.speeds is not None:
      if not isinstance(self.speeds, tuple) or len(self.speeds) != m:
        raise ValueError(f"`speeds` must be one speed per replica (M={m}), got {self.speeds!r}.")
      for i, s in enumerate(self.speeds):
        v.check_real(f"`speeds` (v_m) of replica {i}", s, low=0.0, low_open=True)
    for name in ("latency", "transfer"):
      v.check_int(f"`{name}`", getattr(self, name), low=0, what=" (ticks)")
    if cfg.communication == "background":
      check_on_processes(cfg, self)
      return
    if self.tape is not None:
      check_tape(cfg, self)
      return
    for name in PROCESS_KNOBS[1:]:
      if getattr(self, name) != getattr(SyncerOptions(), name):
        raise ValueError(f"`{name}` acts on real processes: use `communication` background (the tape's"
                         f" {'grace is `grace`, in ticks' if name == 'grace_s' else 'speeds are `speeds`'}).")
    check_playable(cfg, self.syncer_config(m))


def tape_drops(cfg) -> tuple[tuple[int, int], ...]:
  """The ``drop_schedule`` that replays ``cfg.syncer.tape`` (the file, checked against the run's
  M, H and steps: :func:`~diloco_core.runtime.trace_tape.read_tape`,
  :func:`~diloco_core.runtime.trace_tape.drops_of_tape`)."""
  from diloco_core.runtime.trace_tape import drops_of_tape, read_tape  # loaded when a tape is replayed (it imports the runtime)
  m, h = cfg.algo.replicas, cfg.algo.sync_every
  return drops_of_tape(read_tape(cfg.syncer.tape, m, h, cfg.steps), m, h)


def check_tape(cfg, opts: SyncerOptions) -> None:
  """One-line ``ValueError`` for a ``tape`` replay the trainer cannot make, before anything compiles:
  another syncer knob set (the tape decided the rounds), a run the recorded one cannot have been
  (P > 1, τ > 0; ``communication`` background is refused by :func:`check_on_processes`), drops of its own, a missing or unreadable file,
  a tape of another M, H or number of syncs or not of the recorded shape (:func:`tape_drops`),
  and what ``drop_schedule`` refuses (:meth:`~diloco_core.run.config.TrainConfig.validate`).

  The replay is the in-step trainer with the tape's drops as ``drop_schedule``, on any mesh
  (``train`` sets it): on a mesh of one replica per device it is the recorded run bit for bit."""
  default = SyncerOptions()
  for f in dataclasses.fields(SyncerOptions):
    value = getattr(opts, f.name)
    if f.name != "tape" and value != getattr(default, f.name):
      raise ValueError(f"`{f.name}`={value!r} with `tape`: a recorded tape already says who synced when; leave"
                       f" `{f.name}` at its default ({getattr(default, f.name)!r}), or drop `tape`.")
  if not isinstance(opts.tape, str) or not opts.tape:
    raise ValueError(f"`tape` must be the path of a recorded tape (<out>/tape.json), got {opts.tape!r}.")
  a = cfg.algo
  for name, value, ok, allowed in (("`fragments`", a.fragments, a.fragments == 1, "1"),
                                   ("`overlap`", a.overlap, a.overlap == 0, "0"),
                                   ("`drop_prob`", cfg.drop_prob, not cfg.drop_prob, "0")):
    if not ok:
      raise ValueError(f"{name}={value!r} with `tape`: a recorded tape is replayed in-step, as the whole-model"
                       f" rounds (P = 1, τ = 0) and drops it records; use {allowed}.")
  drops = tape_drops(cfg)
  if cfg.drop_schedule and cfg.drop_schedule != drops:
    raise ValueError(f"`drop_schedule`={cfg.drop_schedule!r} with `tape`: the replay's drops are the tape's,"
                     f" {drops!r}; leave `drop_schedule` empty.")
  try:
    dataclasses.replace(cfg, drop_schedule=drops, syncer=SyncerOptions()).validate()
  except ValueError as e:
    raise ValueError(f"`tape` replays as drop_schedule={drops!r}: {e}") from None


def check_on_processes(cfg, opts: SyncerOptions) -> None:
  """One-line ``ValueError`` for syncer options a run over real processes (``communication``
  background) cannot take: there ``quorum`` K (with ``elastic``; a K-of-M vote, late drop,
  merged apply, N = 1: :mod:`~diloco_core.runtime.quorum`), ``grace_s`` (with a quorum below M)
  and ``step_delay`` act; every other knob is the tape's and must stay at its default.

  Examples:
    >>> from diloco_core.run.config import TrainConfig
    >>> from diloco_core.algorithm.config import DiLoCoConfig
    >>> run = TrainConfig(algo=DiLoCoConfig(replicas=3), communication="background", elastic=True)
    >>> check_on_processes(run, SyncerOptions(quorum=2, grace_s=1.5, step_delay=((2, 0.5),)))
    >>> check_on_processes(run, SyncerOptions(quorum=2, late="carry"))
    Traceback (most recent call last):
    ...
    ValueError: `late`='carry' is not built on real processes (`communication` background: a K-of-M `quorum` with `grace_s`, late drop, merged apply, N = 1): use 'drop', or `communication` in-step (the tape).
  """
  m, default = cfg.algo.replicas, dataclasses.asdict(SyncerOptions())
  tape_only = tape_only_knobs(dataclasses.asdict(opts), default)
  if tape_only:
    name = tape_only[0]
    raise ValueError(f"`{name}`={getattr(opts, name)!r} is not built on real processes (`communication` background:"
                     f" a K-of-M `quorum` with `grace_s`, late drop, merged apply, N = 1): use {default[name]!r}, or"
                     f" `communication` in-step (the tape).")
  seen: set = set()
  for process, seconds in opts.step_delay or ():
    if not v.is_int(process) or not 0 <= process < m:
      raise ValueError(f"`step_delay` names process {process!r}: a process of the run, in [0, replicas={m}).")
    if process in seen:
      raise ValueError(f"`step_delay` names process {process} twice: one PROCESS:SECONDS pair per process.")
    seen.add(process)
    v.check_real(f"`step_delay` of process {process}", seconds, low=0.0, high=MAX_STEP_DELAY_S)
  v.check_real("`grace_s`", opts.grace_s, low=0.0, high=MAX_STEP_DELAY_S)
  if opts.quorum is None or opts.quorum == m:
    if opts.grace_s:
      raise ValueError(f"`grace_s` keeps a quorum's sync open: pass `quorum` K < replicas={m}, or drop `grace_s`.")
    return
  if not v.is_int(opts.quorum) or not 1 <= opts.quorum <= m:
    raise ValueError(f"`quorum` (K) must be an integer in [1, replicas={m}], got {opts.quorum!r}.")
  if not cfg.elastic:
    raise ValueError("`quorum` on real processes leaves a late process out of a sync, as an elastic run"
                     " leaves a lost one: add `elastic`, or use `communication` in-step (the tape).")
  if cfg.algo.reduction == "reduce-scatter":
    raise ValueError("`quorum` on real processes decides who counts from the payloads that arrived whole;"
                     " `reduction` reduce-scatter commits each sync at a barrier of every live process (a late"
                     " one would hold it): use `reduction` all-gather, or drop `quorum`.")
  if opts.quorum < cfg.min_replicas:
    raise ValueError(f"`quorum` K={opts.quorum} closes a sync with {opts.quorum} replica(s), fewer than"
                     f" `min_replicas`={cfg.min_replicas}: the run would stop at the first sync a process is"
                     f" late for; pass `quorum` >= `min_replicas`, or a lower `min_replicas`.")


def check_step_delay_processes(opts: SyncerOptions, processes: int) -> None:
  """One-line ``ValueError`` when ``step_delay`` names a process a run of ``processes`` processes
  does not have (the delay would never act); the launcher calls it before any process starts.

  Examples:
    >>> check_step_delay_processes(SyncerOptions(step_delay=((1, 0.5),)), processes=2)
    >>> check_step_delay_processes(SyncerOptions(step_delay=((3, 0.5),)), processes=2)
    Traceback (most recent call last):
    ...
    ValueError: `step_delay` names process 3, but the run has 2 process(es) (0 to 1): name one of them, or start more processes.
  """
  for process, _ in opts.step_delay or ():
    if process >= processes:
      raise ValueError(f"`step_delay` names process {process}, but the run has {processes} process(es) (0 to"
                       f" {processes - 1}): name one of them, or start more processes.")


def _flag_value(value) -> str:
  return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in value) if isinstance(value, tuple) else (
      f"{value:g}" if isinstance(value, float) else str(value))


def syncer_flags(syncer: SyncerConfig, speeds: tuple | None = None) -> list[str]:
  """The trainer's flags that give ``syncer`` on replicas of ``speeds``: its knobs that differ
  from the defaults, by the flags :class:`SyncerOptions` declares (DyLU's speeds as ``--speeds``
  and ``--dylu``).

  Args:
    syncer: the knobs (e.g. a row of :data:`~diloco_core.spec.syncer_settings.SYNCER_SETTINGS`
      through :func:`~diloco_core.spec.syncer_settings.syncer_preset`).
    speeds: the replicas' speeds of the tape (default: all equal, no flag); DyLU's own speeds
      win where ``syncer.speeds`` is set.

  Returns:
    The flags, in :class:`SyncerOptions`' field order.

  Examples:
    >>> syncer_flags(SyncerConfig(quorum=1, late="carry", apply="sequential", buffer=4), (1.0, 1.0, 1.0, 0.5))
    ['--speeds', '1,1,1,0.5', '--quorum', '1', '--late', 'carry', '--outer-apply', 'sequential', '--outer-buffer', '4']
    >>> syncer_flags(SyncerConfig(speeds=(1.0, 0.5)))
    ['--speeds', '1,0.5', '--dylu']
  """
  knobs = {f.name: getattr(syncer, f.name) for f in dataclasses.fields(SyncerConfig)}
  dylu = knobs.pop("speeds")
  options = SyncerOptions(speeds=dylu if dylu is not None else speeds, dylu=dylu is not None, **knobs)
  flags, default = flag_names(SyncerOptions), SyncerOptions()
  out: list[str] = []
  for name, flag in flags.items():
    value = getattr(options, name)
    if value == getattr(default, name):
      continue
    out += [flag] if isinstance(value, bool) else [flag, _flag_value(value)]
  return out
