"""diloco_core.launch.cluster: each host's command and the SLURM script, checked by the trainer."""

import shutil

import pytest

from diloco_core.launch import cluster
from diloco_core.run.cli import check_launch

SCHEDULE = ["--algorithm", "diloco", "--replicas", "2", "--sync-every", "20", "--compression", "bf16",
            "--model", "tiny", "--batch-size", "8", "--communication", "background"]


def test_each_host_runs_the_same_flags_and_its_own_process_options():
  cmds = cluster.host_commands(SCHEDULE, ["gpu-a", "gpu-b"], port=4321)
  assert cmds == [["python", "-m", "diloco_core.train", *SCHEDULE, "--coordinator", "gpu-a:4321",
                   "--num-processes", "2", "--process-id", str(i)] for i in (0, 1)]


@pytest.mark.parametrize("args, hosts, devices, message", [
    (["--algorithm", "dp", "--replicas", "2"], 2, None, "in-step run over 2 processes"),
    (SCHEDULE, 3, None, r"must be divisible by the process count \(3\)"),
    ([*SCHEDULE, "--mesh", "diloco=2,data=3"], 2, 8, "mesh"),
    (["--model", "tiny", "--sync-evry", "2"], 2, None, "unrecognized arguments: --sync-evry 2"),
])
def test_a_command_the_trainer_refuses_is_not_written(args, hosts, devices, message):
  with pytest.raises(ValueError, match=message):
    cluster.host_commands(args, [f"h{i}" for i in range(hosts)], devices_per_process=devices)
  with pytest.raises(ValueError, match=message):
    cluster.slurm_script(args, nodes=hosts, gpus_per_node=devices or 1)
  if devices is None:  # a TPU VM's workers: the trainer's checks for that many processes
    with pytest.raises(ValueError, match=message):
      cluster.tpu_vm_command(args, "tpu", zone="z", workers=hosts)


def test_a_tpu_vm_runs_the_same_flags_on_every_worker_without_process_options():
  cmd = cluster.tpu_vm_command([*SCHEDULE, "--out", "runs/my run"], "tpu-a", zone="europe-west4-a", workers=2)
  assert cmd[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "tpu-a", "--zone=europe-west4-a", "--worker=all"]
  assert cmd[8] == ("--command=cd ~/diloco && python -m diloco_core.train " + " ".join(SCHEDULE)
                    + " --out 'runs/my run'")  # one shell word per flag on the worker
  assert not any(flag in cmd[8] for flag in ("--coordinator", "--num-processes", "--process-id"))


def test_check_commands_wants_one_run_in_process_order():
  cmds = cluster.host_commands(SCHEDULE, ["a", "b"])
  with pytest.raises(ValueError, match=r"^command 1 has --process-id 0; the commands must be processes 0 to 1 in order.$"):
    cluster.check_commands([cmds[0], cmds[0]])
  other = list(cmds[1])
  other[other.index("--sync-every") + 1] = "40"
  with pytest.raises(ValueError, match=r"command 1 differs from command 0 in \['algo.sync_every'\]"):
    cluster.check_commands([cmds[0], other])
  with pytest.raises(ValueError, match="does not start with python -m diloco_core.train"):
    cluster.check_commands([["python", "train.py"]])


def test_the_trainers_check_refuses_inconsistent_process_options():
  base = ["--model", "tiny", "--communication", "background"]
  with pytest.raises(ValueError, match=r"^--num-processes \(3\) is not the number of processes that run this command \(2\).$"):
    check_launch([*base, *cluster.process_options("h0:1", 3, 0)], 2)
  with pytest.raises(ValueError, match=r"^--coordinator must be host:port with a port in \[1, 65535\], got 'h0:0'.$"):
    check_launch([*base, *cluster.process_options("h0:0", 2, 0)], 2)
  with pytest.raises(ValueError, match=r"^multi-process runs need all of --coordinator, --num-processes and --process-id"):
    check_launch([*base, "--coordinator", "h0:1"], 2)
  check_launch([*base, *cluster.process_options("[::1]:1234", 2, 1)], 2)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_slurm_script_expands_to_the_host_commands():
  """What bash makes of the script (srun, scontrol and python stood in for) is, task by task,
  the host command of that node: the GPU mesh spans every node's devices."""
  args = [*SCHEDULE, "--mesh", "diloco=2,data=8", "--out", "runs/it's here"]  # a quote survives
  script = cluster.slurm_script(args, nodes=2, gpus_per_node=8, port=2345)
  assert script.startswith("#!/bin/bash\n#SBATCH --job-name=diloco\n#SBATCH --nodes=2\n")
  assert "#SBATCH --gpus-per-node=8" in script and "srun bash -c" in script
  tasks = cluster.slurm_dry_run(script, ["n7", "n9"])
  assert tasks == cluster.host_commands(args, ["n7", "n9"], port=2345, devices_per_process=8)
  cluster.check_commands(tasks, 8)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_script_that_fails_under_bash_is_one_line():
  with pytest.raises(ValueError, match=r"^the script failed under bash \(exit 3\): oops$"):
    cluster.slurm_dry_run("#!/bin/bash\necho oops >&2\nexit 3\n", ["a"])
