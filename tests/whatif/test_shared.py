"""The unchanged replay on the real GPU traces of ../shared/traces (single-rank graphs: the rank's
collectives join nobody, so they keep their measured duration), and scenarios that can only
shorten a step do. Skips when ../shared is absent."""

import pytest

from bprof.whatif.run import whatif
from tests.analyzers import recorded

FOLDERS = ["a100_ddp_nccl_rank0", "a100_ws16_rank0", "v100_ns_resolution_rank0", "mi250_rocm_minitoy",
           "v100_resnet50_legacy_2021", "cpu_gloo_rank34"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_single_rank_replay_reproduces_the_measured_steps(tmp_path, folder):
    con, run_id = recorded.shared(tmp_path, folder, ["match", "clock", "idle"])
    out = whatif(con, run_id, ["no-host-gaps", "perfect-overlap", "scale:gemm=1.0"])
    base = out.summaries[0]
    assert base["num_steps"] >= 1
    assert base["max_error_frac"] <= 0.001, base
    for res in out.results[1:]:
        for p, m in zip(res.predicted_ns, res.measured_ns):
            assert (p <= m).all(), res.scenario
    assert out.summaries[3]["predicted_step_ns"] == base["measured_step_ns"]
    members = con.execute("SELECT count(*) FROM _wi_members").fetchone()[0]
    print(folder, base, out.summaries[1]["delta_frac"], out.summaries[2]["delta_frac"], "members", members)
    con.close()
