"""The trainer's command lines for a run over several hosts: one per host, or a SLURM batch script.

One process per host (or node), each with its own devices, joined by ``jax.distributed``:
every process runs the same trainer flags plus the process options of
:data:`~diloco_core.run.flags.PROCESS_FLAGS` (``--coordinator`` host:port of process 0,
``--num-processes``, ``--process-id``). :func:`host_commands` writes each host's command;
:func:`slurm_script` writes a batch script whose ``srun`` starts one task per node and takes the
three values from SLURM's environment (the first node of ``SLURM_JOB_NODELIST``,
``SLURM_NTASKS``, ``SLURM_PROCID``); :func:`tpu_vm_command` writes the ``gcloud`` command for a
Cloud TPU VM slice, where JAX reads them from the TPU's environment. Both build a process's options with one function,
:func:`process_options`, and both are checked before they are returned: :func:`check_commands`
runs the trainer's own up-front checks (:func:`~diloco_core.run.flags.check_launch`) on every
command, and that they form one run. :func:`slurm_dry_run` runs a script under ``bash`` with
stand-ins for ``srun``, ``scontrol`` and ``python`` and returns the command each task would run,
so that what the shell makes of the script can be checked too. On one machine,
:mod:`diloco_core.launch.supervisor` (``python -m diloco_core.launch``) does all of this itself.

Examples:
  >>> cmds = host_commands(["--model", "tiny", "--communication", "background"], ["h0", "h1"])
  >>> " ".join(cmds[1])
  'python -m diloco_core.train --model tiny --communication background --coordinator h0:1234 --num-processes 2 --process-id 1'
"""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import tempfile
import textwrap
from typing import Sequence

from diloco_core.run.flags import PROCESS_FLAGS, build_parser, check_launch

#: The trainer's command.
TRAINER = ("python", "-m", "diloco_core.train")
#: The coordinator's port on the first host.
PORT = 1234


def process_options(coordinator, num_processes, process_id) -> list[str]:
  """The process options of one process (values as given: numbers, or shell words).

  Examples:
    >>> process_options("h0:1234", 2, 0)
    ['--coordinator', 'h0:1234', '--num-processes', '2', '--process-id', '0']
  """
  values = dict(coordinator=coordinator, num_processes=num_processes, process_id=process_id)
  return [word for name, flag in PROCESS_FLAGS.items() for word in (flag, str(values[name]))]


def check_commands(commands: Sequence[Sequence[str]], devices_per_process: int | None = None) -> None:
  """Raises a one-line ``ValueError`` unless ``commands`` are one trainer run, one per process.

  Each must be :data:`TRAINER` with flags :func:`~diloco_core.run.flags.check_launch` accepts for
  ``len(commands)`` processes (of ``devices_per_process`` devices each, if given), and all must
  carry the same flags but ``--process-id``, which runs 0, 1, ... in their order.

  Examples:
    >>> check_commands([[*TRAINER, "--communication", "background", *process_options("h0:1", 2, i)]
    ...                 for i in (0, 0)])
    Traceback (most recent call last):
    ...
    ValueError: command 1 has --process-id 0; the commands must be processes 0 to 1 in order.
  """
  parser, first = build_parser(), None
  for i, cmd in enumerate(commands):
    if tuple(cmd[:len(TRAINER)]) != TRAINER:
      raise ValueError(f"command {i} does not start with {' '.join(TRAINER)}: {' '.join(cmd[:3])}.")
    args = list(cmd[len(TRAINER):])
    check_launch(args, len(commands), devices_per_process)
    parsed = vars(parser.parse_args(args))
    if parsed.pop("process_id") != i:
      raise ValueError(f"command {i} has {PROCESS_FLAGS['process_id']} {cmd[cmd.index(PROCESS_FLAGS['process_id']) + 1]};"
                       f" the commands must be processes 0 to {len(commands) - 1} in order.")
    first = parsed if first is None else first
    if parsed != first:
      changed = sorted(k for k in parsed if parsed[k] != first[k])
      raise ValueError(f"command {i} differs from command 0 in {changed}: every process runs the same flags.")


def host_commands(train_args: Sequence[str], hosts: Sequence[str], *, port: int = PORT,
                  devices_per_process: int | None = None) -> list[list[str]]:
  """Each host's command of one run, process ``i`` on ``hosts[i]``, the coordinator on ``hosts[0]``.

  Args:
    train_args: the trainer's flags, the same on every host (without the process options).
    hosts: the hosts' names, as the others reach them.
    port: the coordinator's port on ``hosts[0]``.
    devices_per_process: each host's devices (its GPUs), to check ``--mesh`` against.

  Returns:
    One argv per host, checked by :func:`check_commands`.

  Raises:
    ValueError: the trainer refuses a command (one line).
  """
  coordinator = f"{hosts[0]}:{port}"
  cmds = [[*TRAINER, *train_args, *process_options(coordinator, len(hosts), i)] for i in range(len(hosts))]
  check_commands(cmds, devices_per_process)
  return cmds


def tpu_vm_command(train_args: Sequence[str], name: str, *, zone: str, workers: int,
                   repo: str = "~/diloco") -> list[str]:
  """The ``gcloud`` command that runs the trainer on every worker of a Cloud TPU VM slice.

  On a TPU slice JAX reads the process layout (coordinator, count, id) from the TPU
  environment, so every worker runs the same flags with no process options. The flags are
  checked as :func:`host_commands` checks them for ``workers`` processes, so a command is only
  written for a run the trainer accepts.

  Args:
    train_args: the trainer's flags, the same on every worker.
    name: the TPU VM's name.
    zone: its zone.
    workers: its number of hosts (one trainer process each).
    repo: where the repository (with its environment active) is on every worker.

  Returns:
    The argv of ``gcloud compute tpus tpu-vm ssh``, its remote command as one word.

  Examples:
    >>> cmd = tpu_vm_command(["--model", "tiny", "--communication", "background"], "my-tpu",
    ...                      zone="us-east5-a", workers=2)
    >>> cmd[-1]
    '--command=cd ~/diloco && python -m diloco_core.train --model tiny --communication background'
  """
  host_commands(train_args, [f"worker{i}" for i in range(workers)])
  remote = " ".join([f"cd {repo}", "&&", *TRAINER, *map(shlex.quote, train_args)])
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, f"--zone={zone}", "--worker=all",
          f"--command={remote}"]


def slurm_script(train_args: Sequence[str], *, nodes: int, gpus_per_node: int, port: int = PORT,
                 job_name: str = "diloco", time_limit: str = "04:00:00") -> str:
  """An ``sbatch`` script that runs the trainer with ``train_args`` on ``nodes`` GPU nodes.

  One task per node (``srun``), each a trainer process with the node's GPUs; the process
  options come from SLURM's environment, in each task. The flags are first checked as
  :func:`host_commands` checks them (stand-in host names), so a script is only written for a
  run the trainer accepts.

  Returns:
    The script's text.

  Examples:
    >>> print(slurm_script(["--model", "tiny", "--communication", "background"], nodes=2,
    ...                    gpus_per_node=1).splitlines()[-1])
    srun bash -c 'exec python -m diloco_core.train "$@" --coordinator "$COORDINATOR" --num-processes "$SLURM_NTASKS" --process-id "$SLURM_PROCID"' bash "${TRAIN[@]}"
  """
  host_commands(train_args, [f"node{i}" for i in range(nodes)], port=port, devices_per_process=gpus_per_node)
  task = " ".join([*TRAINER, '"$@"', *process_options('"$COORDINATOR"', '"$SLURM_NTASKS"', '"$SLURM_PROCID"')])
  flags = textwrap.fill(" ".join(map(shlex.quote, train_args)), 88, initial_indent="    ",
                        subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
  return "\n".join([
      "#!/bin/bash",
      f"#SBATCH --job-name={job_name}",
      f"#SBATCH --nodes={nodes}",
      "#SBATCH --ntasks-per-node=1",
      f"#SBATCH --gpus-per-node={gpus_per_node}",
      f"#SBATCH --time={time_limit}",
      "# Submit from the repository, its environment active: sbatch this.sh",
      "set -euo pipefail",
      "# process 0 runs on the first node and hosts the coordinator",
      f'export COORDINATOR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1):{port}"',
      "TRAIN=(", flags, ")",
      "# one task per node; each takes its process id and the task count from SLURM",
      f"srun bash -c 'exec {task}' bash \"${{TRAIN[@]}}\""])


_SRUN = """#!/bin/bash
for ((i = 0; i < SLURM_NNODES; i++)); do
  SLURM_PROCID=$i SLURM_NODEID=$i SLURM_NTASKS=$SLURM_NNODES "$@" || exit $?
done
"""
_PYTHON = """#!/bin/bash
printf '%s\\0' "$@" > "$DRY_RUN_OUT/$SLURM_PROCID"
"""


def slurm_dry_run(script: str, hosts: Sequence[str]) -> list[list[str]]:
  """The command each task of ``script`` would run on the nodes ``hosts``, read from ``bash``.

  The script runs with ``SLURM_JOB_NODELIST`` and ``SLURM_NNODES`` set, and stand-ins on the
  ``PATH``: ``scontrol`` prints ``hosts``, ``srun`` runs its command once per node with that
  task's ``SLURM_PROCID`` and ``SLURM_NTASKS``, and ``python`` records its arguments.

  Returns:
    One argv per task, ``python`` first, in task order.

  Raises:
    ValueError: the script failed under ``bash`` (one line: its exit code and last error line).

  Examples:
    >>> script = slurm_script(["--model", "tiny", "--communication", "background"], nodes=2,
    ...                       gpus_per_node=1)
    >>> slurm_dry_run(script, ["a", "b"]) == host_commands(
    ...     ["--model", "tiny", "--communication", "background"], ["a", "b"])
    True
  """
  with tempfile.TemporaryDirectory(prefix="slurm-dry-run-") as tmp:
    tmp = pathlib.Path(tmp)
    (tmp / "bin").mkdir()
    (tmp / "out").mkdir()
    hostnames = "".join(f"echo {shlex.quote(h)}\n" for h in hosts)
    for name, text in (("srun", _SRUN), ("python", _PYTHON), ("scontrol", "#!/bin/bash\n" + hostnames)):
      (tmp / "bin" / name).write_text(text)
      (tmp / "bin" / name).chmod(0o755)
    (tmp / "job.sh").write_text(script)
    env = dict(os.environ, PATH=f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               SLURM_JOB_NODELIST=",".join(hosts), SLURM_NNODES=str(len(hosts)), DRY_RUN_OUT=str(tmp / "out"))
    run = subprocess.run(["bash", str(tmp / "job.sh")], env=env, capture_output=True, text=True)
    if run.returncode:
      last = (run.stderr.strip().splitlines() or ["no output"])[-1]
      raise ValueError(f"the script failed under bash (exit {run.returncode}): {last}")
    return [["python", *(tmp / "out" / str(i)).read_bytes().decode().split("\0")[:-1]]
            for i in range(len(hosts))]
