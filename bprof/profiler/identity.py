"""Which rank a process of a `bprof record` job is, and whether it is a training rank at all.

Every process of the job that imports torch runs bprof's hook: the training ranks, and also the
launcher (`accelerate launch`, torchrun's agent), DataLoader workers and compile workers. Where the
rank comes from, first match wins:
  RANK / WORLD_SIZE / LOCAL_RANK     set by torchrun, deepspeed, accelerate's multi-process launch,
                                     dlrover-run: known at `import torch` (`from_launcher_env`)
  the default process group          a script that passed rank and world size to init_process_group
  SLURM_PROCID / SLURM_NTASKS /      `srun python train.py`, whether or not the script maps them
  SLURM_LOCALID                      to RANK itself
  none of these                      rank 0 of a world of 1, claimed by exactly one process
Without launcher variables the answer waits for the process's first training step (an optimizer
step or `bprof.step()`), which launchers and helper processes never take; the script has by then
initialised its process group and set any variables it maps. Of the processes left with no rank,
the first to step claims rank 0 by creating meta/single_process.claim exclusively; any other
stays inert.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLAIM_FILE = "single_process.claim"  # in run_dir/meta: the pid of the process recorded as the world of 1


@dataclass(frozen=True)
class Identity:
    rank: int
    world_size: int
    local_rank: int
    source: str  # "RANK", "process group", "SLURM_PROCID" or "single process": how it was found


def from_launcher_env(env=os.environ) -> Identity | None:
    """The rank a launcher set in the environment, known at `import torch`; None without RANK."""
    if "RANK" not in env:
        return None
    return Identity(int(env["RANK"]), int(env.get("WORLD_SIZE", "1")), int(env.get("LOCAL_RANK", "0")), "RANK")


def resolve(run_dir: Path, env=os.environ) -> Identity | None:
    """At the first training step of a process that had no RANK at import; None: not a rank to record."""
    group = _from_process_group(env)
    if group is not None:
        return group
    launcher = from_launcher_env(env)  # the script may have mapped its own variables to RANK by now
    if launcher is not None:
        return launcher
    if "SLURM_PROCID" in env:
        return Identity(int(env["SLURM_PROCID"]), int(env.get("SLURM_NTASKS", "1")),
                        int(env.get("SLURM_LOCALID", "0")), "SLURM_PROCID")
    return Identity(0, 1, 0, "single process") if _claim_single(run_dir) else None


def _local_rank(env) -> int:
    return int(env.get("LOCAL_RANK") or env.get("SLURM_LOCALID") or 0)


def _from_process_group(env) -> Identity | None:
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        return Identity(dist.get_rank(), dist.get_world_size(), _local_rank(env), "process group")
    except Exception:  # a half-initialised or broken process group: fall back to the variables
        return None


def _claim_single(run_dir: Path) -> bool:
    path = run_dir / "meta" / CLAIM_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()}\n")
    return True
