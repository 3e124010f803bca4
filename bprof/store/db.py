"""Open, create and migrate the bprof DuckDB store.

The schema lives in schema.sql (version SCHEMA_VERSION). A file written by an older bprof is
migrated in place by the steps in MIGRATIONS; a file from a newer bprof is refused, not guessed at.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import duckdb

from bprof.errors import DataError, UsageError

SCHEMA_VERSION = 8
DEFAULT_DB = Path("bprof.duckdb")

# version N -> SQL that turns a version-N store into version N+1. Each step repeats what schema.sql
# says of the objects it adds; tests/store/test_peaks.py checks that a migrated store equals a new one.
MIGRATIONS: dict[int, str] = {
    # 1 -> 2: device_peaks, the peaks `bprof calibrate` measures
    1: """
CREATE TABLE device_peaks (
    host VARCHAR NOT NULL,
    device_kind VARCHAR NOT NULL,
    device_name VARCHAR NOT NULL,
    dtype VARCHAR NOT NULL,
    num_threads INTEGER NOT NULL,
    flops_per_s DOUBLE,
    flops_per_s_spread_frac DOUBLE,
    mem_bytes_per_s DOUBLE,
    matmul_size INTEGER,
    num_repeats INTEGER,
    measured_at TIMESTAMPTZ NOT NULL,
    torch_version VARCHAR,
    PRIMARY KEY (host, device_kind, device_name, dtype, num_threads)
);
COMMENT ON TABLE device_peaks IS 'Peaks measured on this machine by bprof calibrate (dense matmul FLOP/s, copy bandwidth): MFU/HFU denominators where no datasheet applies, such as CPU runs. Re-calibrating replaces the row.';
COMMENT ON COLUMN device_peaks.host IS 'Host name where the measurement ran (socket.gethostname()).';
COMMENT ON COLUMN device_peaks.device_kind IS 'cpu or cuda.';
COMMENT ON COLUMN device_peaks.device_name IS 'CPU model name (/proc/cpuinfo model name) or GPU name (torch.cuda.get_device_name).';
COMMENT ON COLUMN device_peaks.dtype IS 'Matmul element type: fp32, tf32 (fp32 tensors with TF32 tensor cores allowed), bf16 or fp16.';
COMMENT ON COLUMN device_peaks.num_threads IS 'Intra-op CPU threads during the measurement (torch.get_num_threads()); on cpu rows the cores the peak is for.';
COMMENT ON COLUMN device_peaks.flops_per_s IS 'Best over repeats of dense n x n x n torch.mm FLOP/s, 2 n^3 FLOPs per matmul.';
COMMENT ON COLUMN device_peaks.flops_per_s_spread_frac IS 'Spread of the repeats: (max - min) / median of their FLOP/s; NULL with a single repeat.';
COMMENT ON COLUMN device_peaks.mem_bytes_per_s IS 'Copy bandwidth: read + write bytes of a large tensor copy_ per second, best over repeats; one measurement per calibration, shown on each of its dtype rows.';
COMMENT ON COLUMN device_peaks.matmul_size IS 'n of the n x n x n matmul.';
COMMENT ON COLUMN device_peaks.num_repeats IS 'Number of timed repeats behind flops_per_s and its spread.';
COMMENT ON COLUMN device_peaks.measured_at IS 'When the measurement finished.';
COMMENT ON COLUMN device_peaks.torch_version IS 'torch.__version__ of the measurement.';
""",
    # 2 -> 3: the tables of ranks ingested from `bprof reduce` outputs
    2: """
CREATE TABLE reduced_ranks (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    path VARCHAR NOT NULL,
    format_version INTEGER NOT NULL,
    bprof_version VARCHAR,
    reduced_at TIMESTAMPTZ,
    reduced_bytes BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank)
);
COMMENT ON TABLE reduced_ranks IS 'Ranks ingested from `bprof reduce` outputs instead of their traces: they have steps, collectives, clock samples and the per-step partition, but no events.';
COMMENT ON COLUMN reduced_ranks.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN reduced_ranks.rank IS 'Global rank.';
COMMENT ON COLUMN reduced_ranks.path IS 'The rank<R>.reduced directory as ingested (ranks.trace_path names the trace it was reduced from).';
COMMENT ON COLUMN reduced_ranks.format_version IS 'Version of the reduced format (bprof.store.reduce.FORMAT_VERSION) that wrote it.';
COMMENT ON COLUMN reduced_ranks.bprof_version IS 'bprof version that ran the reduce.';
COMMENT ON COLUMN reduced_ranks.reduced_at IS 'When the reduce ran.';
COMMENT ON COLUMN reduced_ranks.reduced_bytes IS 'Bytes of its Parquet files and manifest.';

CREATE TABLE reduced_spans (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    ts_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL,
    timeline VARCHAR NOT NULL,
    main_tid VARCHAR,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE reduced_spans IS 'timeline_spans rows of reduced ranks as `bprof reduce` computed them from the trace; the timeline analyzer copies them.';
COMMENT ON COLUMN reduced_spans.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN reduced_spans.rank IS 'Global rank (reduced_ranks.rank).';
COMMENT ON COLUMN reduced_spans.step IS 'Profiler step; -1 = the whole trace of a rank without ProfilerStep ranges.';
COMMENT ON COLUMN reduced_spans.ts_ns IS 'Span start, own clock (timeline_spans.ts_ns).';
COMMENT ON COLUMN reduced_spans.dur_ns IS 'Span length: the step time (timeline_spans.dur_ns).';
COMMENT ON COLUMN reduced_spans.timeline IS 'device or main_thread (timeline_spans.timeline).';
COMMENT ON COLUMN reduced_spans.main_tid IS 'The training (main) thread (timeline_spans.main_tid).';

CREATE TABLE reduced_breakdown (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    timeline VARCHAR NOT NULL,
    span_ns BIGINT NOT NULL,
    compute_ns BIGINT NOT NULL,
    exposed_comm_ns BIGINT NOT NULL,
    overlapped_comm_ns BIGINT NOT NULL,
    memcpy_ns BIGINT NOT NULL,
    idle_ns BIGINT NOT NULL,
    other_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE reduced_breakdown IS 'The per-step partition (breakdown_steps) of reduced ranks as `bprof reduce` computed it; the breakdown analyzer copies it.';
COMMENT ON COLUMN reduced_breakdown.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN reduced_breakdown.rank IS 'Global rank (reduced_ranks.rank).';
COMMENT ON COLUMN reduced_breakdown.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN reduced_breakdown.timeline IS 'device or main_thread.';
COMMENT ON COLUMN reduced_breakdown.span_ns IS 'Step span length (breakdown_steps.span_ns).';
COMMENT ON COLUMN reduced_breakdown.compute_ns IS 'breakdown_steps.compute_ns.';
COMMENT ON COLUMN reduced_breakdown.exposed_comm_ns IS 'breakdown_steps.exposed_comm_ns.';
COMMENT ON COLUMN reduced_breakdown.overlapped_comm_ns IS 'breakdown_steps.overlapped_comm_ns.';
COMMENT ON COLUMN reduced_breakdown.memcpy_ns IS 'breakdown_steps.memcpy_ns.';
COMMENT ON COLUMN reduced_breakdown.idle_ns IS 'breakdown_steps.idle_ns.';
COMMENT ON COLUMN reduced_breakdown.other_ns IS 'breakdown_steps.other_ns.';

CREATE TABLE reduced_exposed_comm (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    ts_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL
);
COMMENT ON TABLE reduced_exposed_comm IS 'The intervals of each step of a reduced rank that its partition labels exposed_comm (adjacent ones merged): what cross-rank analysis splits into waiting and transfer, and attributes to parallel dimensions.';
COMMENT ON COLUMN reduced_exposed_comm.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN reduced_exposed_comm.rank IS 'Global rank (reduced_ranks.rank).';
COMMENT ON COLUMN reduced_exposed_comm.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN reduced_exposed_comm.ts_ns IS 'Interval start, own clock.';
COMMENT ON COLUMN reduced_exposed_comm.dur_ns IS 'Interval length.';

CREATE TABLE reduced_dims (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    dim VARCHAR NOT NULL,
    comm_ns BIGINT NOT NULL,
    exposed_comm_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step, dim)
);
COMMENT ON TABLE reduced_dims IS 'Communication time per parallel dimension (breakdown_dims) of reduced ranks as `bprof reduce` computed it, with the dimensions it gave its own process groups; the breakdown analyzer copies it.';
COMMENT ON COLUMN reduced_dims.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN reduced_dims.rank IS 'Global rank (reduced_ranks.rank).';
COMMENT ON COLUMN reduced_dims.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN reduced_dims.dim IS 'Parallel dimension (breakdown_groups.dim of the rank''s reduce).';
COMMENT ON COLUMN reduced_dims.comm_ns IS 'breakdown_dims.comm_ns: time any call of this dimension was in flight.';
COMMENT ON COLUMN reduced_dims.exposed_comm_ns IS 'breakdown_dims.exposed_comm_ns: the exposed part of comm_ns.';
COMMENT ON COLUMN ranks.num_events IS 'Number of events ingested from the trace (for a reduced rank: read by bprof reduce; the store holds none of them).';
""",
    # 3 -> 4: the CI history (bprof ci record / check / trend)
    3: """
CREATE SEQUENCE ci_history_id_seq START 1;

CREATE TABLE ci_runs (
    history_id INTEGER PRIMARY KEY DEFAULT nextval('ci_history_id_seq'),
    series VARCHAR NOT NULL,
    run_name VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    source_db VARCHAR,
    benchmark VARCHAR,
    git_sha VARCHAR,
    git_branch VARCHAR,
    tags VARCHAR[],
    started_at TIMESTAMPTZ,
    recorded_at TIMESTAMPTZ NOT NULL,
    facts JSON NOT NULL,
    critical_rank INTEGER,
    critical_rank_frac DOUBLE,
    UNIQUE (series, fingerprint)
);
COMMENT ON TABLE ci_runs IS 'CI history: one row per run marked as part of a baseline series (bprof ci record), with what is needed to compare it without its traces. A history file (--history) holds only the ci_* tables.';
COMMENT ON COLUMN ci_runs.history_id IS 'History-wide identifier; the order runs joined their series.';
COMMENT ON COLUMN ci_runs.series IS 'Baseline series the run belongs to (bprof ci record --branch, e.g. main).';
COMMENT ON COLUMN ci_runs.run_name IS 'runs.name of the run in the store it came from.';
COMMENT ON COLUMN ci_runs.fingerprint IS 'runs.fingerprint: the same traces make the same fingerprint, so a run joins a series once.';
COMMENT ON COLUMN ci_runs.source_db IS 'Path of the store the run was summarised from.';
COMMENT ON COLUMN ci_runs.benchmark IS 'runs.benchmark: only runs of the same benchmark are compared.';
COMMENT ON COLUMN ci_runs.git_sha IS 'runs.git_sha: the commit the run measured.';
COMMENT ON COLUMN ci_runs.git_branch IS 'runs.git_branch: the branch the run was recorded on.';
COMMENT ON COLUMN ci_runs.tags IS 'runs.tags.';
COMMENT ON COLUMN ci_runs.started_at IS 'runs.started_at.';
COMMENT ON COLUMN ci_runs.recorded_at IS 'When the run joined the series.';
COMMENT ON COLUMN ci_runs.facts IS 'JSON of what must be equal for two runs to be comparable (device, world size, layout, model FLOPs, versions, peak); see bprof.ci.summary.';
COMMENT ON COLUMN ci_runs.critical_rank IS 'The rank that set the pace in most steps (largest span minus time waiting for peers).';
COMMENT ON COLUMN ci_runs.critical_rank_frac IS 'Share of the kept steps in which critical_rank set the pace.';

CREATE TABLE ci_metrics (
    history_id INTEGER NOT NULL,
    metric VARCHAR NOT NULL,
    value DOUBLE,
    unit VARCHAR NOT NULL,
    num_steps INTEGER NOT NULL,
    excluded_steps INTEGER[] NOT NULL,
    step_spread_frac DOUBLE,
    not_measurable VARCHAR,
    PRIMARY KEY (history_id, metric)
);
COMMENT ON TABLE ci_metrics IS 'Per-run robust summaries the CI gate compares: the median over the run''s steps, outlier steps excluded.';
COMMENT ON COLUMN ci_metrics.history_id IS 'Run (ci_runs.history_id).';
COMMENT ON COLUMN ci_metrics.metric IS 'step_time_ns (job step time: longest rank span of each step) or mfu_frac.';
COMMENT ON COLUMN ci_metrics.value IS 'Median over the kept steps; NULL when not measurable.';
COMMENT ON COLUMN ci_metrics.unit IS 'Unit of value (ns, frac).';
COMMENT ON COLUMN ci_metrics.num_steps IS 'Steps of the run with a value, outliers included.';
COMMENT ON COLUMN ci_metrics.excluded_steps IS 'Step numbers left out as outliers (modified z-score above 3.5, MAD floored at 1% of the median): checkpoint, evaluation or warm-up steps.';
COMMENT ON COLUMN ci_metrics.step_spread_frac IS 'Spread of the kept steps: 1.4826 * MAD / median.';
COMMENT ON COLUMN ci_metrics.not_measurable IS 'Why value is NULL, when it is.';

CREATE TABLE ci_components (
    history_id INTEGER NOT NULL,
    family VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    value_ns BIGINT NOT NULL,
    PRIMARY KEY (history_id, family, name)
);
COMMENT ON TABLE ci_components IS 'Parts of a run''s step the CI gate diffs to say why a metric moved: median over kept steps of each part on the step''s critical rank (stragglers: per run).';
COMMENT ON COLUMN ci_components.history_id IS 'Run (ci_runs.history_id).';
COMMENT ON COLUMN ci_components.family IS 'partition (breakdown_steps: compute, exposed_wait, exposed_transfer, overlapped_comm, memcpy, idle, other), kernel_class (kernels_classes), phase (phases_steps), idle_cause (idle_causes), comm_dim (breakdown_dims exposed time) or straggler (stragglers_ranks lost_ns of a flagged rank).';
COMMENT ON COLUMN ci_components.name IS 'The part within its family (compute, gemm, data_wait, dp, rank 3, ...).';
COMMENT ON COLUMN ci_components.value_ns IS 'Nanoseconds per step (median over kept steps; for a straggler its lost_ns).';
""",
    # 4 -> 5: the results of bprof replay
    4: """
CREATE SEQUENCE replay_id_seq START 1;

CREATE TABLE replays (
    replay_id INTEGER PRIMARY KEY DEFAULT nextval('replay_id_seq'),
    run_id INTEGER NOT NULL,
    replayed_at TIMESTAMPTZ NOT NULL,
    item_kind VARCHAR NOT NULL,
    item VARCHAR NOT NULL,
    item_key VARCHAR NOT NULL,
    rank INTEGER,
    variant VARCHAR NOT NULL,
    status VARCHAR NOT NULL,
    reason VARCHAR,
    device VARCHAR NOT NULL,
    shapes JSON,
    dtypes JSON,
    strides JSON,
    num_threads INTEGER,
    num_repeats INTEGER NOT NULL,
    calls_per_step DOUBLE,
    traced_ns BIGINT,
    traced_spread_frac DOUBLE,
    traced_basis VARCHAR,
    replayed_ns BIGINT,
    replayed_spread_frac DOUBLE,
    baseline_ns BIGINT,
    speedup DOUBLE,
    verdict VARCHAR,
    classification VARCHAR,
    group_size INTEGER,
    replayed_group_size INTEGER,
    bytes BIGINT,
    busbw_bytes_per_s DOUBLE,
    finding_id INTEGER,
    finding_title VARCHAR
);
COMMENT ON TABLE replays IS 'bprof replay: recorded ops, loops of ops and collectives rerun on this machine, and the fix variants replay verified; one row per item and variant (replaying again replaces the row of the same item, variant and device).';
COMMENT ON COLUMN replays.replay_id IS 'Store-wide replay identifier.';
COMMENT ON COLUMN replays.run_id IS 'Run the item was taken from (runs.run_id).';
COMMENT ON COLUMN replays.replayed_at IS 'When the replay ran.';
COMMENT ON COLUMN replays.item_kind IS 'op (one op signature), op_loop (a run of same-signature matmul calls in a row: a Python loop), collective (one collective signature) or collective_storm (all calls of one all_reduce group in a step).';
COMMENT ON COLUMN replays.item IS 'Human label: op and shapes/dtypes, or collective op, dtype, elements and group.';
COMMENT ON COLUMN replays.item_key IS 'Exact signature as JSON (name, Input Dims, Input type, Input Strides, Concrete Inputs; or op, dtype, elements, group): identifies the item across replays.';
COMMENT ON COLUMN replays.rank IS 'Rank whose calls the traced times are taken from (op items: all ranks'' calls of the signature).';
COMMENT ON COLUMN replays.variant IS 'baseline (as recorded), or the fix tried: bf16, pad8, pad64, pad128, contiguous, bmm; for collectives the same bytes per step in messages of another size: bucket (a storm''s calls fused into one), msg4x (every 4 calls of a storm fused), split4 (each call cut into 4).';
COMMENT ON COLUMN replays.status IS 'replayed, not_rebuildable (the signature does not say enough to call the op again; reason says why), not_applicable (the variant does not apply), failed (the op or process group failed; reason), or rebuildable (a dry run).';
COMMENT ON COLUMN replays.reason IS 'Why it was not replayed, or what to know when reading it (the group was larger than this machine runs, what a variant leaves out of its timing).';
COMMENT ON COLUMN replays.device IS 'Device kind replayed on: cpu or cuda.';
COMMENT ON COLUMN replays.shapes IS 'Op items: the recorded Input Dims; collectives: elements of each call.';
COMMENT ON COLUMN replays.dtypes IS 'Recorded Input type of each argument (or the collective''s dtype).';
COMMENT ON COLUMN replays.strides IS 'Recorded Input Strides, reproduced by the replay (non-contiguous views included).';
COMMENT ON COLUMN replays.num_threads IS 'Intra-op threads of the replay: the rank''s recorded intra_op_threads when known.';
COMMENT ON COLUMN replays.num_repeats IS 'Timed repeats behind replayed_ns (0 when not replayed).';
COMMENT ON COLUMN replays.calls_per_step IS 'Calls (or loops, storms) per step on a rank in the trace, median over steps.';
COMMENT ON COLUMN replays.traced_ns IS 'Median traced time of one call (op: its duration on CPU, its kernels'' device time on GPU; loop: the whole loop; collective: transfer time after the last peer arrived when collperf ran, else the call; storm: a step''s calls).';
COMMENT ON COLUMN replays.traced_spread_frac IS 'Spread of the traced times: (max - min) / median; NULL below two.';
COMMENT ON COLUMN replays.traced_basis IS 'What traced_ns measures (see traced_ns).';
COMMENT ON COLUMN replays.replayed_ns IS 'Median over the repeats of the replayed time of the same unit as traced_ns (a monotonic clock on CPU, CUDA events on GPU; collectives: the slowest rank).';
COMMENT ON COLUMN replays.replayed_spread_frac IS 'Spread of the repeats: (max - min) / median.';
COMMENT ON COLUMN replays.baseline_ns IS 'Variant rows: replayed_ns of the baseline, timed interleaved with the variant.';
COMMENT ON COLUMN replays.speedup IS 'Variant rows: baseline_ns / replayed_ns, a factor (above 1 is faster).';
COMMENT ON COLUMN replays.verdict IS 'Variant rows: faster (the variant won so many of the back-to-back repeat pairs that a fair coin would with probability <= 5 %, two-sided sign test, and the median paired speedup is above 1.05), slower (the reverse) or no better than noise.';
COMMENT ON COLUMN replays.classification IS 'Baseline rows: slow in isolation (the replay takes what the trace took: a kernel, shape or dtype problem), fast in isolation, slow in the trace (traced above 1.5 x replayed: contention, a straggler, overlap), or slower in isolation than in the trace (conditions differ).';
COMMENT ON COLUMN replays.group_size IS 'Collectives: ranks of the recorded process group.';
COMMENT ON COLUMN replays.replayed_group_size IS 'Collectives: ranks of the replay''s process group (at most what this machine runs).';
COMMENT ON COLUMN replays.bytes IS 'Collectives: bytes of the message(s) of the unit timed.';
COMMENT ON COLUMN replays.busbw_bytes_per_s IS 'Collectives: nccl-tests bus bandwidth of the replay, bytes / replayed time x the op''s factor (all_reduce 2(n-1)/n).';
COMMENT ON COLUMN replays.finding_id IS 'The bprof analyze finding the item verifies (findings.finding_id at replay time; analysing again renumbers findings).';
COMMENT ON COLUMN replays.finding_title IS 'Title of that finding, kept for when it is renumbered.';
COMMENT ON COLUMN ci_components.family IS 'partition (breakdown_steps: compute, exposed_wait, exposed_transfer, overlapped_comm, memcpy, idle, other), kernel_class (kernels_classes), phase (phases_steps), idle_cause (idle_causes), comm_dim (breakdown_dims exposed time), straggler (stragglers_ranks lost_ns of a flagged rank), or a work amount of one rank: work_flops (kernels_flops executed FLOPs), work_calls (collectives calls), work_bytes (collectives input bytes).';
COMMENT ON COLUMN ci_components.value_ns IS 'Nanoseconds per step (median over kept steps; for a straggler its lost_ns); for the work_* families the amount per step on that rank (FLOPs, calls or bytes), median over kept steps.';
""",
    # 5 -> 6: the predictions of bprof whatif (and the message-size variants of replays.variant)
    5: """
COMMENT ON COLUMN replays.variant IS 'baseline (as recorded), or the fix tried: bf16, pad8, pad64, pad128, contiguous, bmm; for collectives the same bytes per step in messages of another size: bucket (a storm''s calls fused into one), msg4x (every 4 calls of a storm fused), split4 (each call cut into 4).';
CREATE TABLE whatif (
    run_id INTEGER NOT NULL,
    scenario VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    predicted_ns BIGINT NOT NULL,
    measured_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, scenario, rank, step)
);
COMMENT ON TABLE whatif IS 'bprof whatif: each rank''s step replayed from the step''s dependency graph (per-rank chains of work between matched collectives), unchanged or under a scenario; rerunning a scenario replaces its rows.';
COMMENT ON COLUMN whatif.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN whatif.scenario IS 'unchanged (the replay of what was measured: a consistency check), or the scenario string as given, parts joined by + and applied in order (no-stragglers, no-host-gaps, perfect-overlap, scale:X=F, coll:bw=G,lat=U).';
COMMENT ON COLUMN whatif.rank IS 'Global rank.';
COMMENT ON COLUMN whatif.step IS 'Profiler step (-1: the whole trace of a rank without ProfilerStep ranges).';
COMMENT ON COLUMN whatif.predicted_ns IS 'Replayed step time of the rank: replayed end of its span - its start.';
COMMENT ON COLUMN whatif.measured_ns IS 'Measured step time of the rank (timeline_spans.dur_ns).';

CREATE TABLE whatif_runs (
    run_id INTEGER NOT NULL,
    scenario VARCHAR NOT NULL,
    computed_at TIMESTAMPTZ NOT NULL,
    num_steps INTEGER NOT NULL,
    num_ranks INTEGER NOT NULL,
    measured_step_ns BIGINT,
    predicted_step_ns BIGINT,
    delta_frac DOUBLE,
    measured_mfu_frac DOUBLE,
    predicted_mfu_frac DOUBLE,
    max_error_frac DOUBLE,
    median_error_frac DOUBLE,
    assumptions VARCHAR[] NOT NULL,
    PRIMARY KEY (run_id, scenario)
);
COMMENT ON TABLE whatif_runs IS 'bprof whatif: one row per run and scenario, the predicted job step time and MFU against the measured run.';
COMMENT ON COLUMN whatif_runs.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN whatif_runs.scenario IS 'As whatif.scenario.';
COMMENT ON COLUMN whatif_runs.computed_at IS 'When bprof whatif ran.';
COMMENT ON COLUMN whatif_runs.num_steps IS 'Steps replayed (the analysed steps with spans).';
COMMENT ON COLUMN whatif_runs.num_ranks IS 'Most ranks replayed in one step.';
COMMENT ON COLUMN whatif_runs.measured_step_ns IS 'Job step time as measured: the longest rank''s span per step, median over steps.';
COMMENT ON COLUMN whatif_runs.predicted_step_ns IS 'The same over the replayed spans.';
COMMENT ON COLUMN whatif_runs.delta_frac IS '(predicted_step_ns - measured_step_ns) / measured_step_ns: below 0 when the scenario shortens the step.';
COMMENT ON COLUMN whatif_runs.measured_mfu_frac IS 'The run''s MFU (metrics.mfu_frac); NULL when not measurable.';
COMMENT ON COLUMN whatif_runs.predicted_mfu_frac IS 'measured_mfu_frac x measured_step_ns / predicted_step_ns: the same model FLOPs and peaks over the predicted step.';
COMMENT ON COLUMN whatif_runs.max_error_frac IS 'Largest |predicted_ns - measured_ns| / measured_ns over the rank-steps: for the unchanged scenario the replay''s consistency error, for the others how far a rank''s step moved.';
COMMENT ON COLUMN whatif_runs.median_error_frac IS 'Median of the same over the rank-steps.';
COMMENT ON COLUMN whatif_runs.assumptions IS 'What each part of the scenario assumed, in order (also printed by bprof whatif).';
""",
    # 6 -> 7: execution trace nodes (and the op_chain items, compile variant and together of replays)
    6: """
ALTER TABLE replays ADD COLUMN together INTEGER;
COMMENT ON COLUMN replays.together IS 'Op and chain replays: processes that ran the item at once on this host''s CPU (1: alone; N: bprof replay --together N, as N ranks shared the host); collectives: 1.';
CREATE TABLE exec_nodes (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node_id BIGINT NOT NULL,
    parent_id BIGINT,
    name VARCHAR NOT NULL,
    rf_id BIGINT,
    tid BIGINT,
    op_schema VARCHAR,
    inputs JSON,
    outputs JSON
);
COMMENT ON TABLE exec_nodes IS 'The nodes of PyTorch execution traces (Chakra format, bprof record --execution-trace): every op and record_function of a rank''s window with the identities of the tensors it read and wrote.';
COMMENT ON COLUMN exec_nodes.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN exec_nodes.rank IS 'Global rank whose execution trace holds the node.';
COMMENT ON COLUMN exec_nodes.node_id IS 'The node''s id in its file: ids grow in the order nodes start (tensor ids share the counter).';
COMMENT ON COLUMN exec_nodes.parent_id IS 'Id of the enclosing node (Chakra ctrl_deps): an op, a record_function range or the thread''s root.';
COMMENT ON COLUMN exec_nodes.name IS 'Op or range name (aten::mul, ProfilerStep#3, ...).';
COMMENT ON COLUMN exec_nodes.rf_id IS 'Record function id: equal to the Kineto event''s args."Record function id" of the same op (events.args).';
COMMENT ON COLUMN exec_nodes.tid IS 'Execution trace thread id (its own numbering, not the OS tid).';
COMMENT ON COLUMN exec_nodes.op_schema IS 'The op''s schema with its overload (aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor); NULL for ranges.';
COMMENT ON COLUMN exec_nodes.inputs IS 'The inputs as written: {values, shapes, types, strides}, a tensor''s value being [tensor id, storage id, offset, elements, element bytes, device].';
COMMENT ON COLUMN exec_nodes.outputs IS 'The outputs, in the same form.';

COMMENT ON COLUMN replays.item_kind IS 'op (one op signature), op_loop (a run of same-signature matmul calls in a row: a Python loop), op_chain (a short sequence of top-level ops wired output to input, read from the execution trace), collective (one collective signature) or collective_storm (all calls of one all_reduce group in a step).';
COMMENT ON COLUMN replays.variant IS 'baseline (as recorded), or the fix tried: bf16, pad8, pad64, pad128, contiguous, bmm; for op chains compile (torch.compile of the chain); for collectives the same bytes per step in messages of another size: bucket (a storm''s calls fused into one), msg4x (every 4 calls of a storm fused), split4 (each call cut into 4).';
""",
    # 7 -> 8: send/recv take their peer from the trace (Dst Rank / Src Rank), and their seq says what
    # torch's Seq on them is; runs ingested before keep their rows (re-ingest to read the peers)
    7: """
COMMENT ON COLUMN collectives.peer_rank IS 'Global rank of the other side of a send or recv, when known (the trace''s Dst Rank of a send or Src Rank of a recv, or bprof record); NULL for collectives.';
COMMENT ON COLUMN collectives.seq IS 'Per-process-group sequence number of a collective (trace Seq, or the Flight Recorder under bprof record); for send/recv the Seq torch writes, which is the group''s collective counter + 1 (the same for every message until the next collective), or under bprof record the message number of its (group, sender, receiver) pair.';
""",
}


class NeedsMigration(DataError):
    """A read-only open of a store an older bprof wrote: a writing open migrates it."""


def schema_sql() -> str:
    return resources.files("bprof.store").joinpath("schema.sql").read_text()


def open_store(path: Path | str = DEFAULT_DB, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Connect to the store at `path`, creating it (or migrating it) when needed.

    Read-only opening of a missing file is a usage error; a store of a newer schema is a data
    error naming both versions.
    """
    path = Path(path)
    if read_only and not path.exists():
        raise UsageError(f"{path}: no bprof store here (run `bprof ingest` first, or pass --db)")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        raise DataError(f"{path}: cannot open as a DuckDB store ({_first_line(exc)})") from None
    # DuckDB's own progress bar would print to stdout, into --json output; bprof shows its own
    con.execute("SET enable_progress_bar = false")
    try:
        version = _schema_version(con)
        if version is None:
            if read_only:
                raise DataError(f"{path}: a DuckDB file but not a bprof store (no meta table)")
            _create(con)
        elif version > SCHEMA_VERSION:
            raise DataError(
                f"{path}: written by a newer bprof (schema {version}; this bprof reads up to "
                f"{SCHEMA_VERSION}); upgrade bprof to read it"
            )
        elif version < SCHEMA_VERSION:
            if read_only:
                raise NeedsMigration(f"{path}: schema {version} needs migrating to {SCHEMA_VERSION}; open it once without read-only")
            _migrate(con, version)
    except BaseException:
        con.close()
        raise
    return con


def _schema_version(con: duckdb.DuckDBPyConnection) -> int | None:
    has_meta = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'meta' AND schema_name = 'main'"
    ).fetchone()[0]
    if not has_meta:
        return None
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None


def _create(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(schema_sql())
        con.execute("INSERT INTO meta VALUES ('schema_version', ?), ('created_by', 'bprof')",
                    [str(SCHEMA_VERSION)])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _migrate(con: duckdb.DuckDBPyConnection, version: int) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        for v in range(version, SCHEMA_VERSION):
            if v not in MIGRATIONS:
                raise DataError(f"no migration from schema {v} to {v + 1}")
            con.execute(MIGRATIONS[v])
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
