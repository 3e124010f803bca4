"""What `srun --ntasks N python train.py` gives the tasks, without Slurm: N plain processes, each
with SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (one node) and MASTER_ADDR/MASTER_PORT, and no RANK.

usage: slurm_launch.py NTASKS PORT script args...   exits with the first non-zero exit code of a task
"""

import os
import subprocess
import sys

ntasks, port, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
tasks = [subprocess.Popen([sys.executable, *cmd], env={**base, "SLURM_PROCID": str(i), "SLURM_NTASKS": str(ntasks),
                                                       "SLURM_LOCALID": str(i), "SLURM_NNODES": "1",
                                                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
         for i in range(ntasks)]
codes = [t.wait() for t in tasks]
sys.exit(next((c for c in codes if c != 0), 0))
