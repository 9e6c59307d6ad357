"""The trainer plays a tape: the real model trained as a syncer tape says (P = 1, τ = 0).

:func:`~diloco_core.spec.tape.simulate_tape` says, in integer ticks, when each replica sends,
which contributions each round holds and when each replica merges which global version;
:func:`play_tape` trains the run's model in that order. Each of the M replicas holds its own
params :math:`\\theta_m` and inner optimizer state (float32), and the syncer holds the global
versions :math:`\\theta_g^{(v)}` and the outer state. The player computes nothing of its own: it
drives the algorithm's phases, the contract every runtime uses
(:class:`~diloco_core.algorithm.phases.Phases`: ``inner_steps`` with an active mask,
``payloads``, ``merge`` with a participation row, ``round_outer_step`` around
:func:`~diloco_core.algorithm.outer_apply.apply_round`). Events are played in tape order:

* :class:`~diloco_core.spec.tape.Sent` (replica m, local step s, base b): m runs its inner
  steps from its last local step to s (local step :math:`s'` on the batch the in-step runtime
  gives replica m at step :math:`s'`, its inner optimizer's schedule at its own step count),
  then its contribution :math:`\\Delta_m = \\theta_g^{(b)} - \\theta_m` (float32, the payload phase) is taken and
  held (a replica waits for its round, τ = 0, so it is the same at the commit);
* :class:`~diloco_core.spec.tape.Dropped`: the contribution is discarded;
* :class:`~diloco_core.spec.tape.Committed` (version v, members): the members' contributions,
  in member order (the tape's arrival order), weighted by
  :func:`~diloco_core.spec.syncer.round_weights` (staleness :math:`s = v - 1 - b`), go through
  :func:`~diloco_core.algorithm.outer_apply.apply_round` (merged or sequential; the step of
  ``round_outer_step``: the run's outer optimizer for N = 1, Delayed Nesterov with buffer N and
  activation c otherwise; radial option) and make :math:`\\theta_g^{(v)}`;
* :class:`~diloco_core.spec.tape.Merged` (replica m, version v): a member blends,
  :math:`\\theta_m \\leftarrow \\alpha\\,\\theta_m + (1 - \\alpha)\\,\\theta_g^{(v)}` (α = 0:
  replaced), a healed replica (dropped contribution, rejoin) is replaced by
  :math:`\\theta_g^{(v)}` (the merge phase with participation 1 for a blend, 0 for a heal, -1
  for every other replica, which it leaves alone); its inner optimizer state is kept;
* :class:`~diloco_core.spec.tape.Lost` / :class:`~diloco_core.spec.tape.Joined`: a lost
  replica runs no step (the steps of a period it did not finish are never run); a joiner
  keeps the inner optimizer state it had and is replaced by the version it downloads (the
  heal merge that follows its join on the tape). The heal rules, and where this one differs
  from a replacement process's, are named in :mod:`diloco_core.algorithm.state`.

Every global version a later event still reads (a send's base, a merge) is kept until that
event. The replicas' states are stacked on a leading axis M and their inner steps run as one
program over all M (the ``inner_steps`` phase, as the in-step runtime runs it; a replica not due
keeps its row, exactly): every replica whose period has started runs with the one that must
reach its send (its steps depend on nothing else until its own send, τ = 0), so a synchronous
tape runs in lock step and reproduces the in-step trainer bit for bit (one replica alone, or a
vmap of size 1, rounds its reductions 1 to 4 ulp differently). Deterministic: no clock, every sum in tape order. **Bytes**: every sent contribution is
one payload (float32, :math:`4\\,|\\theta|` bytes, as the trainer's byte counters count a
replica's send); ``bytes_sent`` is their total over all replicas, the downloads not counted.

**Not supported yet** (refused with one line before anything compiles, never approximated):
fragments P > 1, overlap τ > 0, ``outer_overlap`` delayed / eager, compression other than
``none``, top-k, error feedback, ``reduction="reduce-scatter"``, DP, replica drops and rejoin
schedules, the background runtime, a mesh, checkpoints and resume, ``eval_replicas``.

Examples:
  Speeds to ticks (:func:`speed_ticks`): the fastest replica's step takes S ticks, S the smallest
  scale that makes every step time a whole number of ticks:

  >>> speed_ticks((1.0, 1.0, 0.5)), speed_ticks((1.0, 0.75)), speed_ticks((2, 3))
  ((1, 1, 2), (3, 4), (3, 2))
"""

from __future__ import annotations

import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any, NamedTuple

import drjax
import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.algorithm.outer_apply import apply_round
from diloco_core.algorithm.state import MergeOperands, SendOperands
from diloco_core.devices.mesh import make_mesh
from diloco_core.spec import validity as v
from diloco_core.spec.syncer import SyncerConfig, exact_decimal, round_weights
from diloco_core.runtime.option_checks import check_playable
from diloco_core.spec.tape import Committed, Dropped, Joined, Lost, Merged, Sent, commit_ticks, simulate_tape

__all__ = ["TapePlay", "TapeResult", "TapeSetup", "play_tape", "speed_ticks", "tape_for"]


@dataclasses.dataclass
class TapeResult:
  """What :func:`play_tape` returns.

  Attributes:
    params: the final global params :math:`\\theta_g` (the last committed version).
    step_losses: ``(replica, local step, loss)`` of every inner step, in the order played (the
      loss before the update, as the trainer reports it).
    eval_loss: the eval loss of the final global params.
    version_eval_losses: ``(version, eval loss)`` of version 0 and each committed version (empty
      when ``eval_versions=False``).
    local_steps: the inner steps run, all replicas together.
    rounds: the committed rounds (the last version).
    members: each committed round's members as replica ids, in member order.
    round_marks: ``(version, local steps played, contributions sent)`` at each commit (the local
      steps of replicas whose period had started count as played: module docstring).
    contributions: the contributions sent (dropped ones included).
    payload_bytes: the bytes of one contribution.
    bytes_sent: ``contributions * payload_bytes``.
    tape: the tape played.
  """

  params: Any
  step_losses: list
  eval_loss: float
  version_eval_losses: list
  local_steps: int
  rounds: int
  members: list
  round_marks: list
  contributions: int
  payload_bytes: float
  bytes_sent: float
  tape: tuple


def speed_ticks(speeds, scale: int | None = None) -> tuple[int, ...]:
  """Each replica's inner-step time in ticks, from its speed (steps per unit of time).

  .. math:: \\text{ticks}_m = S \\cdot \\max_k v_k / v_m

  exactly, a float speed read as the decimal it prints as (0.3 is 3/10, as
  :func:`~diloco_core.spec.syncer.dylu_inner_steps` reads it). ``scale=None`` takes the smallest
  S >= 1 that makes every :math:`\\text{ticks}_m` an integer (the lcm of the ratios'
  denominators): a tick is 1/S of the fastest replica's step time. A given S that does not is
  refused, never rounded.

  Args:
    speeds: each replica's speed :math:`v_m > 0`.
    scale: S, ticks per step of the fastest replica (None: the smallest exact one).

  Returns:
    The step ticks, one per replica.

  Examples:
    >>> speed_ticks((1.0, 0.3))  # ratio 10/3: S = 3
    (3, 10)
    >>> speed_ticks((1.0, 0.3), scale=4)
    Traceback (most recent call last):
    ...
    ValueError: speeds (1.0, 0.3) with scale=4 give step times 4 * 10/3 ticks that are not whole: pass scale a multiple of 3 (or None).
  """
  if not isinstance(speeds, (tuple, list)) or not speeds:
    raise ValueError(f"speeds must be a non-empty tuple of positive speeds, one per replica, got {speeds!r}.")
  for i, s in enumerate(speeds):
    v.check_real(f"speeds (v_m) of replica {i}", s, low=0.0, low_open=True)
  exact = [exact_decimal(s) for s in speeds]
  ratios = [max(exact) / s for s in exact]
  need = functools.reduce(math.lcm, (r.denominator for r in ratios), 1)
  if scale is None:
    scale = need
  v.check_int("scale", scale, what=" (None: the smallest exact one)")
  for r in ratios:
    if (scale * r).denominator != 1:
      raise ValueError(f"speeds {tuple(speeds)!r} with scale={scale} give step times {scale} * {r} ticks that"
                       f" are not whole: pass scale a multiple of {need} (or None).")
  return tuple(int(scale * r) for r in ratios)


def tape_for(cfg, syncer: SyncerConfig, speeds, *, latency: int = 0, transfer: int = 0, losses=(), joins=(),
             scale: int | None = None) -> tuple:
  """The tape of ``cfg``'s run on replicas of the given speeds: :func:`speed_ticks` and
  :func:`~diloco_core.spec.tape.simulate_tape` with the run's H and equal total local steps
  :math:`M \\times` ``cfg.steps``.

  Args:
    cfg: the run (its ``algo.replicas``, ``algo.sync_every``, ``steps``; checked by :func:`~diloco_core.runtime.option_checks.check_playable`).
    syncer: the syncer's knobs.
    speeds: each replica's speed (steps per unit of time), M of them.
    latency, transfer: the link's ticks (:func:`~diloco_core.spec.tape.simulate_tape`).
    losses, joins: ``(tick, replica)`` pairs.
    scale: ticks per step of the fastest replica (:func:`speed_ticks`).

  Returns:
    The tape.

  Examples:
    >>> from diloco_core.run.config import TrainConfig
    >>> from diloco_core.algorithm.config import DiLoCoConfig
    >>> cfg = TrainConfig(steps=4, algo=DiLoCoConfig(replicas=2, sync_every=2))
    >>> tape = tape_for(cfg, SyncerConfig(quorum=1, late="carry"), (1.0, 0.5))
    >>> [(e.tick, e.replica, e.step) for e in tape if isinstance(e, Sent)]
    [(2, 0, 2), (4, 0, 4), (4, 1, 2), (6, 0, 6)]
  """
  check_playable(cfg, syncer)
  m = cfg.algo.replicas
  if not isinstance(speeds, (tuple, list)) or len(speeds) != m:
    raise ValueError(f"speeds must be one positive speed per replica (M={m}), got {speeds!r}.")
  return simulate_tape(syncer, speed_ticks(tuple(speeds), scale), cfg.algo.sync_every, m * cfg.steps,
                       latency=latency, transfer=transfer, losses=losses, joins=joins)


class TapeSetup(NamedTuple):
  """What a play trains: the run's data, initial params, jitted eval loss and algorithm object,
  built as the trainer builds them (:func:`~diloco_core.run.run_setup.set_up`, or
  :func:`~diloco_core.run.tape_run.make_setup` for a play outside ``train``)."""

  data: Any
  params: Any
  eval_fn: Any  #: ``eval_fn(params, tokens)``: the loss the trainer reports, jitted
  algo: Any


def play_tape(cfg, syncer: SyncerConfig, tape, setup: TapeSetup, *, eval_versions: bool = True,
              observe=None) -> TapeResult:
  """Trains ``cfg``'s model as ``tape`` says (module docstring).

  Args:
    cfg: the run (a :class:`~diloco_core.run.config.TrainConfig`; refused as
      :func:`~diloco_core.runtime.option_checks.check_playable` says, before anything compiles).
    syncer: the syncer's knobs the tape was made with (weights, apply, buffer, activation, radial).
    tape: :func:`~diloco_core.spec.tape.simulate_tape`'s (or :func:`tape_for`'s) tape.
    eval_versions: also evaluate every committed version.
    setup: the run's data, params, eval loss and algorithm (:class:`TapeSetup`).
    observe: called at each commit as ``observe(event, contributions, params)``: the
      :class:`~diloco_core.spec.tape.Committed` event, its members' pseudo-gradients (member
      order) and the global params they are applied to (the version before); None: nothing.

  Returns:
    A :class:`TapeResult`.

  Examples:
    >>> from diloco_core import DataConfig, DiLoCoConfig
    >>> from diloco_core.run.config import TrainConfig
    >>> from diloco_core.run.tape_run import make_setup  # the trainer's build (the run layer)
    >>> cfg = TrainConfig(model="tiny", data=DataConfig(vocab_size=16, order=1), batch_size=2, seq_len=8,
    ...                   steps=4, warmup_steps=1, algo=DiLoCoConfig(replicas=2, sync_every=2))
    >>> syncer = SyncerConfig(quorum=1, late="carry")
    >>> result = play_tape(cfg, syncer, tape_for(cfg, syncer, (1.0, 0.5)), make_setup(cfg))
    >>> result.local_steps, result.rounds, result.members
    (8, 3, [[0], [0, 1], [0]])
  """
  check_playable(cfg, syncer)
  play = TapePlay(cfg, syncer, tape, setup, eval_versions, observe)
  while play.rounds_left():
    play.play_round()
  return play.finish()


class TapePlay:
  """One play of a tape, round by round (:func:`play_tape`; the tape runtime's state,
  :class:`~diloco_core.runtime.tape_runtime.TapeRuntime`).

  The replicas' params and inner optimizer states are stacked on a leading replica axis M, and
  inner steps run as one program over all M (the algorithm's ``inner_steps`` under
  ``drjax.program``, as the in-step runtime runs it), a replica not active left as it was
  (its ``active`` mask: ``where``, exact). Replicas whose
  period has started run together: the period's steps depend on nothing but the replica's
  own state and data until its send (τ = 0), so running them before another replica's send
  changes no number, and a synchronous tape runs all M in lock step, as the trainer does.
  (One replica alone, or a vmap of size 1, rounds its reductions differently: 1 to 4 ulp.)
  :meth:`play_round` plays the events up to the next commit, :meth:`finish` the rest; the
  events are played in tape order either way, so a play is the same however it is cut.
  """

  def __init__(self, cfg, syncer: SyncerConfig, tape, setup: TapeSetup, eval_versions: bool = True, observe=None):
    m = cfg.algo.replicas
    data, params, eval_fn, algo = setup
    self.observe = observe
    self.syncer, self.data, self.eval_versions, self.m = syncer, data, eval_versions, m
    self.hp = algo.typed_hyperparams()
    algo.prepare(params)
    # The algorithm's own phases, each one program over the M replicas (drjax on a one-device
    # mesh, as the in-step runtime runs them)
    run, self.mesh = drjax.program(diloco=m), make_mesh()
    self.advance = jax.jit(run(lambda hp, p, o, batch, active: algo.inner_steps(hp, p, o, batch, active)[:3]))
    self.treedef = jax.tree.structure(params)
    self.deltas = jax.jit(run(lambda hp, g, r: algo.payloads("all", None, hp, SendOperands(g, [], r, None, None))[1]))
    self.merges = jax.jit(run(lambda al, g, r, how: algo.merge("all", None, al, MergeOperands(g, r, how))))
    tokens = jnp.asarray(data.eval_batch())
    self.evaluate = lambda p: float(eval_fn(p, tokens))
    self.payload = float(algo.bytes_sent(cfg.algo.sync_every))  # P = 1: the whole model, float32
    start = algo.initial_state(params, m, hp=self.hp)
    self.params, self.opt = start.params, start.opt_state
    self.count, self.target = [0] * m, [None] * m
    self.versions, self.version = {0: params}, 0
    init, self.step = algo.round_outer_step(self.hp, syncer.buffer, syncer.activation)
    self.outer = init(params)
    self.alpha = self.hp["alpha"]
    # jitted as the trainer's step is (op by op, XLA rounds the outer step 1 ulp differently);
    # Delayed Nesterov's count is host-side, so N > 1 runs op by op
    self.apply = jax.jit(functools.partial(apply_round, step=self.step, apply=syncer.apply, radial=syncer.radial),
                         static_argnames="weights") if syncer.buffer == 1 else functools.partial(
                             apply_round, step=self.step, apply=syncer.apply, radial=syncer.radial)
    self.pending: dict = {}
    self.losses: list = []
    self.batches: dict = {}
    self.members: list = []
    self.marks: list = []
    self.sent = 0
    self.tape, self.next = tuple(tape), 0  # the events, and the index of the next to play
    self.result: TapeResult | None = None  # set by finish()
    self.last_use = {}  # version -> the last event that reads it (a send's base, a merge)
    for i, e in enumerate(self.tape):
      if isinstance(e, Sent):
        self.last_use[e.base] = i
      elif isinstance(e, Merged):
        self.last_use[e.version] = i
    self.commits = len(commit_ticks(self.tape))
    self.evals = [(0, self.evaluate(self.versions[0]))] if eval_versions else []
    for r in range(m):
      self.start(-1, r)

  def delta(self, base, m: int):
    """Replica m's contribution against ``base``: the payload phase (float32, no wire format)."""
    with jax.set_mesh(self.mesh):
      sent = self.deltas(self.hp, jax.tree.leaves(base), jax.tree.leaves(self.params))
    return jax.tree.unflatten(self.treedef, [x[m] for x in sent])

  def merge(self, m: int, target, heal: bool) -> None:
    """Replica m merges ``target``: the merge phase with a participation row that blends m
    (1), or heals it (0: replaced), and leaves every other replica alone (-1)."""
    how = np.full(self.m, -1.0, np.float32)
    how[m] = 0.0 if heal else 1.0
    with jax.set_mesh(self.mesh):
      leaves = self.merges(self.alpha, jax.tree.leaves(target), jax.tree.leaves(self.params), jnp.asarray(how))
    self.params = jax.tree.unflatten(self.treedef, leaves)

  def batch(self, active: list[bool]):
    """The stacked batch: replica k's of data step ``count[k]`` (its next local step) where active."""
    rows = []
    for k, on in enumerate(active):
      if on and self.count[k] not in self.batches:
        self.batches[self.count[k]] = self.data.train_batch(self.count[k])
      rows.append(self.batches[self.count[k]][k] if on else None)
    like = next(r for r in rows if r is not None)
    low = min(self.count[k] for k, on in enumerate(active) if on)
    for s in [s for s in self.batches if s < low]:
      del self.batches[s]
    return jnp.asarray(np.stack([np.zeros_like(like) if r is None else r for r in rows]))

  def run_to(self, m: int, step: int) -> None:
    """Runs replica m's inner steps up to local step ``step``, with every other started period."""
    if self.target[m] != step:
      raise ValueError(f"tape: replica {m} sends after local step {step}, but its period ends at {self.target[m]}"
                       " (not a tape of simulate_tape for this run).")
    while self.count[m] < step:
      active = [t is not None and c < t for c, t in zip(self.count, self.target)]
      with jax.set_mesh(self.mesh):
        self.params, self.opt, loss = self.advance(self.hp, self.params, self.opt, self.batch(active),
                                                   jnp.asarray(active))
      for k in range(self.m):
        if active[k]:
          self.count[k] += 1
          self.losses.append((k, self.count[k], loss, k))

  def start(self, i: int, m: int) -> None:
    """Replica m starts a period after event i: its target is the step of its next send (None
    if it is lost first or sends no more)."""
    self.target[m] = None
    for e in self.tape[i + 1:]:
      if e.replica == m and isinstance(e, (Sent, Lost)):
        self.target[m] = e.step if isinstance(e, Sent) else None
        return

  def rounds_left(self) -> int:
    """The commits still to play."""
    return self.commits - len(self.marks)

  def play_round(self) -> None:
    """Plays the events up to the next commit, that commit included (ValueError: none is left)."""
    if not self.rounds_left():
      raise ValueError(f"tape: every one of its {self.commits} rounds is played.")
    while not self._play_event():
      pass

  def finish(self) -> TapeResult:
    """Plays the events after the last commit and returns the play's :class:`TapeResult` (also
    kept as the play's ``result``)."""
    while self.next < len(self.tape):
      self._play_event()
    final = self.versions[self.version]
    fetched = jax.device_get([x for _, _, x, _ in self.losses])
    losses = [(m, s, float(x[k])) for (m, s, _, k), x in zip(self.losses, fetched)]
    self.result = TapeResult(params=final, step_losses=losses, eval_loss=self.evaluate(final),
                             version_eval_losses=self.evals, local_steps=len(losses), rounds=self.version,
                             members=self.members, round_marks=self.marks, contributions=self.sent,
                             payload_bytes=self.payload, bytes_sent=self.sent * self.payload, tape=self.tape)
    return self.result

  def _play_event(self) -> bool:
    """Plays the next event; whether it was a commit."""
    i, e = self.next, self.tape[self.next]
    self.next += 1
    if isinstance(e, Sent):
      self.run_to(e.replica, e.step)
      self.target[e.replica] = None
      self.pending[e.replica, e.step] = self.delta(self.versions[e.base], e.replica)
      self.sent += 1
    elif isinstance(e, Dropped):
      del self.pending[e.replica, e.step]
    elif isinstance(e, Committed):
      self.commit(e)
      if self.eval_versions:
        self.evals.append((e.version, self.evaluate(self.versions[e.version])))
    elif isinstance(e, Merged):
      self.merge(e.replica, self.versions[e.version], e.heal)
      self.start(i, e.replica)
    elif isinstance(e, Lost):
      self.target[e.replica] = None
    elif isinstance(e, Joined):
      self.count[e.replica] = e.step
    else:
      raise ValueError(f"tape events must be those of simulate_tape, got {e!r}.")
    for old in [u for u in self.versions if u != self.version and self.last_use.get(u, -1) <= i]:
      del self.versions[old]
    return isinstance(e, Committed)

  def commit(self, e: Committed) -> None:
    s = self.syncer
    grads = [self.pending.pop((c.replica, c.step)) for c in e.members]
    weights = round_weights(s, [c.inner_steps for c in e.members], [e.version - 1 - c.base for c in e.members])
    if self.observe is not None:
      self.observe(e, grads, self.versions[self.version])
    g, self.outer = self.apply(self.versions[self.version], self.outer, grads, weights=weights)
    self.version = e.version
    self.versions[e.version] = g
    self.members.append([c.replica for c in e.members])
    self.marks.append((e.version, len(self.losses), self.sent))
