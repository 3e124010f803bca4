"""Synthetic multi-rank runs with planted truth: ingest reproduces every count truth.json states."""

from __future__ import annotations

import pytest

from bprof.store.ingest import ingest_paths
from bprof.synth import Fault, Scenario, write_run

OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter": "reduce_scatter",
       "broadcast": "broadcast", "send": "send", "recv": "recv", "all_to_all": "all_to_all"}


@pytest.mark.parametrize("fmt,pretty", [("modern", False), ("2022", False), ("modern", True)])
def test_counts_steps_and_collectives_match_truth(store, tmp_path, fmt, pretty):
    truth = write_run(Scenario(tp=2, pp=2, dp=1, steps=2, hosts=2, fmt=fmt, seed=3,
                               faults=[Fault("slow_rank", rank=1, extra_ns=2_000_000)]),
                      tmp_path / "run", gzip=not pretty, pretty=pretty)
    [r] = ingest_paths(store, [tmp_path / "run"])
    assert r.num_ranks == truth["world_size"] == 4
    for rank in truth["ranks"]:
        counts = rank["counts"]
        got = store.execute("SELECT num_events, device_name, device_index FROM ranks WHERE run_id = ? AND rank = ?",
                            [r.run_id, rank["rank"]]).fetchone()
        assert got == (counts["num_events"], rank["device"], rank["device_index"])
        kernels = store.execute("SELECT count(*) FROM events WHERE run_id = ? AND rank = ? AND kind = 'kernel'",
                                [r.run_id, rank["rank"]]).fetchone()[0]
        assert kernels == counts["num_kernels"]
        by_op = dict(store.execute("SELECT op, count(*) FROM collectives WHERE run_id = ? AND rank = ? GROUP BY op",
                                   [r.run_id, rank["rank"]]).fetchall())
        assert by_op == {OPS[k]: v for k, v in counts["collectives_by_op"].items()}
        linked = store.execute("SELECT sum(num_kernels) FROM collectives WHERE run_id = ? AND rank = ?",
                               [r.run_id, rank["rank"]]).fetchone()[0]
        assert linked == counts["num_nccl_kernels"]
        steps = store.execute("SELECT list(step ORDER BY step) FROM steps WHERE run_id = ? AND rank = ?",
                              [r.run_id, rank["rank"]]).fetchone()[0]
        assert steps == rank["steps"]


def test_modern_collectives_carry_group_seq_and_bytes(store, tmp_path):
    truth = write_run(Scenario(tp=2, pp=2, dp=2, steps=1, hosts=2, seed=5), tmp_path / "run")
    [r] = ingest_paths(store, [tmp_path / "run"])
    # p2p instances hold both members, each with its own op (send / recv) and seq
    want = {(m["rank"], c["pg_desc"], m["seq"]): (OPS[m["op"]], c["bytes"], sorted(c["ranks"]))
            for c in truth["collectives"] for m in c["members"]}
    rows = store.execute("""SELECT rank, pg_desc, seq, op, in_bytes, pg_ranks FROM collectives
                            WHERE run_id = ?""", [r.run_id]).fetchall()
    got = {(rank, desc, seq): (op, nbytes, ranks) for rank, desc, seq, op, nbytes, ranks in rows}
    assert got == want
