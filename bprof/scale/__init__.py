"""Per-rank work fanned out: `bprof reduce PATH...` and `bprof ingest --engine` run one reduce per
rank trace on a local process pool or on a Ray cluster, with traces read where they are stored.

  sources.py   which traces the given paths (or fsspec URLs) hold, grouped into runs, and where
               each one's reduced output goes
  tasks.py     one reduce as a picklable task (what a worker runs) and its result
  engines.py   the local pool and Ray: tasks in, results out as they finish
  outputs.py   finding a reduced output already made, writing a finished one (local or fsspec)
  fanout.py    the whole: plan, skip what is done, run, write, ingest
"""
