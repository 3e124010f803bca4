-- The bprof store, schema version 10 (bprof.store.db.SCHEMA_VERSION). Every table and column is documented with COMMENT ON;
-- tests/store/test_schema.py fails when one is not. Times are int64 nanoseconds: `*_ts_ns`
-- on the rank's own clock (epoch-based), `*_dur_ns` durations. Sizes say their unit.

CREATE TABLE meta (
    key VARCHAR PRIMARY KEY,
    value VARCHAR NOT NULL
);
COMMENT ON TABLE meta IS 'Store-level facts, such as the schema version.';
COMMENT ON COLUMN meta.key IS 'Name of the fact (schema_version, created_by).';
COMMENT ON COLUMN meta.value IS 'Its value, as text.';

CREATE SEQUENCE run_id_seq START 1;

CREATE TABLE runs (
    run_id INTEGER PRIMARY KEY DEFAULT nextval('run_id_seq'),
    name VARCHAR NOT NULL UNIQUE,
    started_at TIMESTAMPTZ,
    ingested_at TIMESTAMPTZ NOT NULL,
    source_path VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL UNIQUE,
    command VARCHAR,
    git_sha VARCHAR,
    git_branch VARCHAR,
    benchmark VARCHAR,
    tags VARCHAR[],
    world_size INTEGER,
    num_ranks_ingested INTEGER NOT NULL,
    missing_ranks INTEGER[],
    backend VARCHAR,
    device_name VARCHAR,
    peak_flops_per_s DOUBLE,
    model_flops_per_step DOUBLE,
    consistent BOOLEAN NOT NULL,
    inconsistency VARCHAR,
    metadata JSON
);
COMMENT ON TABLE runs IS 'One row per ingested run: a set of per-rank traces of one job and step window.';
COMMENT ON COLUMN runs.run_id IS 'Store-wide run identifier.';
COMMENT ON COLUMN runs.name IS 'Unique human name (from --name, else the directory name, made unique).';
COMMENT ON COLUMN runs.started_at IS 'Wall-clock start of the earliest traced event of any rank.';
COMMENT ON COLUMN runs.ingested_at IS 'When the run was ingested.';
COMMENT ON COLUMN runs.source_path IS 'The path(s) given to ingest, joined by ";".';
COMMENT ON COLUMN runs.fingerprint IS 'sha256 over the sorted per-file sha256s: the same files make the same run.';
COMMENT ON COLUMN runs.command IS 'Training command line, when the capture recorded it.';
COMMENT ON COLUMN runs.git_sha IS 'Git commit of the training code, when known.';
COMMENT ON COLUMN runs.git_branch IS 'Git branch of the training code, when known.';
COMMENT ON COLUMN runs.benchmark IS 'Benchmark name that groups comparable runs for CI history.';
COMMENT ON COLUMN runs.tags IS 'Free-form labels.';
COMMENT ON COLUMN runs.world_size IS 'Number of ranks of the job (from distributedInfo), which may exceed the ranks ingested.';
COMMENT ON COLUMN runs.num_ranks_ingested IS 'Number of rank traces ingested for this run.';
COMMENT ON COLUMN runs.missing_ranks IS 'Ranks of the job with no trace (crashed, killed, or not captured): a partial run; empty when complete, NULL when the world size is unknown.';
COMMENT ON COLUMN runs.backend IS 'Default process-group backend (nccl, gloo, ...).';
COMMENT ON COLUMN runs.device_name IS 'Device of rank 0 (GPU name, or cpu).';
COMMENT ON COLUMN runs.peak_flops_per_s IS 'Dense peak FLOP/s per device used for MFU; NULL until known (never guessed).';
COMMENT ON COLUMN runs.model_flops_per_step IS 'Model FLOPs per optimizer step declared by the training script (bprof_model metadata).';
COMMENT ON COLUMN runs.consistent IS 'False when the files disagree on world size, backend, run id or step numbers.';
COMMENT ON COLUMN runs.inconsistency IS 'How the files disagree, when consistent is false.';
COMMENT ON COLUMN runs.metadata IS 'Extra run metadata as JSON (bprof_model, capture info).';

CREATE TABLE ranks (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    local_rank INTEGER,
    host VARCHAR,
    pid BIGINT,
    device_name VARCHAR,
    device_index INTEGER,
    trace_path VARCHAR NOT NULL,
    trace_sha256 VARCHAR NOT NULL,
    trace_bytes BIGINT NOT NULL,
    time_base VARCHAR NOT NULL,
    base_time_ns BIGINT NOT NULL,
    first_ts_ns BIGINT,
    last_ts_ns BIGINT,
    num_events BIGINT NOT NULL,
    clock_offset_ns BIGINT,
    clock_residual_ns BIGINT,
    distributed_info JSON,
    device_properties JSON,
    PRIMARY KEY (run_id, rank)
);
COMMENT ON TABLE ranks IS 'One row per rank trace of a run.';
COMMENT ON COLUMN ranks.run_id IS 'Run the rank belongs to (runs.run_id).';
COMMENT ON COLUMN ranks.rank IS 'Global rank.';
COMMENT ON COLUMN ranks.local_rank IS 'Rank within its host, when known.';
COMMENT ON COLUMN ranks.host IS 'Host name, when the trace or capture recorded it.';
COMMENT ON COLUMN ranks.pid IS 'OS process id of the rank (pid of its CPU events).';
COMMENT ON COLUMN ranks.device_name IS 'Name of the device the rank ran on (GPU model, or cpu).';
COMMENT ON COLUMN ranks.device_index IS 'Index of that device on its host; NULL on CPU runs.';
COMMENT ON COLUMN ranks.trace_path IS 'Path of the trace file as ingested.';
COMMENT ON COLUMN ranks.trace_sha256 IS 'sha256 of the trace file as stored (compressed or not).';
COMMENT ON COLUMN ranks.trace_bytes IS 'Uncompressed size of the trace JSON in bytes.';
COMMENT ON COLUMN ranks.time_base IS 'How the trace wrote time: relative_base (baseTimeNanoseconds + relative us) or absolute_us.';
COMMENT ON COLUMN ranks.base_time_ns IS 'baseTimeNanoseconds of the file (0 for absolute traces); ts_ns = base + ts * 1000.';
COMMENT ON COLUMN ranks.first_ts_ns IS 'Earliest event start on this rank (own clock).';
COMMENT ON COLUMN ranks.last_ts_ns IS 'Latest event end on this rank (own clock).';
COMMENT ON COLUMN ranks.num_events IS 'Number of events ingested from the trace (for a reduced rank: read by bprof reduce; the store holds none of them).';
COMMENT ON COLUMN ranks.clock_offset_ns IS 'Offset to add to this rank''s clock to align it with the run''s reference; NULL until clock alignment runs.';
COMMENT ON COLUMN ranks.clock_residual_ns IS 'Residual error of that offset estimate; NULL until clock alignment runs.';
COMMENT ON COLUMN ranks.distributed_info IS 'The trace''s distributedInfo object (backend, world size, process groups).';
COMMENT ON COLUMN ranks.device_properties IS 'The trace''s deviceProperties list.';

CREATE TABLE events (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    kind VARCHAR NOT NULL,
    cat VARCHAR,
    name VARCHAR,
    pid VARCHAR,
    tid VARCHAR,
    device INTEGER,
    stream BIGINT,
    ts_ns BIGINT,
    dur_ns BIGINT,
    correlation BIGINT,
    external_id BIGINT,
    step INTEGER,
    args JSON
);
COMMENT ON TABLE events IS 'Every trace event of every rank, with normalised kind and integer-ns times.';
COMMENT ON COLUMN events.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN events.rank IS 'Global rank whose trace holds the event.';
COMMENT ON COLUMN events.kind IS 'Normalised kind: cpu_op, user_annotation, gpu_user_annotation, kernel, gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver, python_function, flow_start, flow_end, instant, trace_span, metadata, or other.';
COMMENT ON COLUMN events.cat IS 'The raw Kineto category as written (Operator, cpu_op, Kernel, ac2g, ...).';
COMMENT ON COLUMN events.name IS 'Event name (op, kernel or range name).';
COMMENT ON COLUMN events.pid IS 'Raw pid as text: OS pid on CPU rows, device index on GPU rows, or a label.';
COMMENT ON COLUMN events.tid IS 'Raw tid as text: OS thread id on CPU rows, stream on GPU rows, or a label.';
COMMENT ON COLUMN events.device IS 'Device index of GPU rows (kernel, memcpy, memset, gpu_user_annotation); NULL on CPU rows.';
COMMENT ON COLUMN events.stream IS 'CUDA/HIP stream of GPU rows; NULL on CPU rows.';
COMMENT ON COLUMN events.ts_ns IS 'Start, epoch nanoseconds on the rank''s own clock.';
COMMENT ON COLUMN events.dur_ns IS 'Duration in nanoseconds (0 for instants and flows).';
COMMENT ON COLUMN events.correlation IS 'Launch-to-kernel correlation id (runtime and GPU rows) or flow id (flow rows).';
COMMENT ON COLUMN events.external_id IS 'Kineto External id tying GPU rows and runtime calls to their CPU op.';
COMMENT ON COLUMN events.step IS 'Profiler step the event belongs to (GPU rows: the step of their launch); NULL outside steps.';
COMMENT ON COLUMN events.args IS 'The raw args object of the event.';

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

CREATE TABLE collectives (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    call_index INTEGER NOT NULL,
    op VARCHAR NOT NULL,
    raw_name VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    is_p2p BOOLEAN NOT NULL,
    peer_rank INTEGER,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks INTEGER[],
    group_size INTEGER,
    seq BIGINT,
    dtype VARCHAR,
    in_elems BIGINT,
    out_elems BIGINT,
    in_bytes BIGINT,
    out_bytes BIGINT,
    num_parts INTEGER NOT NULL,
    tid VARCHAR,
    cpu_ts_ns BIGINT,
    cpu_dur_ns BIGINT,
    device_ts_ns BIGINT,
    device_dur_ns BIGINT,
    num_kernels INTEGER NOT NULL,
    external_id BIGINT,
    step INTEGER,
    PRIMARY KEY (run_id, rank, call_index)
);
COMMENT ON TABLE collectives IS 'One row per rank per collective or p2p call (wait is not a collective).';
COMMENT ON COLUMN collectives.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collectives.rank IS 'Global rank that made the call.';
COMMENT ON COLUMN collectives.call_index IS 'Order of the call on this rank (by CPU or device start), from 0.';
COMMENT ON COLUMN collectives.op IS 'Canonical op: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, gather, scatter, barrier, send, recv, or unknown.';
COMMENT ON COLUMN collectives.raw_name IS 'Name as traced (c10d::allreduce_, record_param_comms Collective name, NCCL kernel or gloo range name).';
COMMENT ON COLUMN collectives.source IS 'What the row was built from: c10d (a c10d::* CPU op, with its record_param_comms if any), record_param_comms, kernel_only (an NCCL kernel with no CPU op) or gloo_only (a gloo:* range with no CPU op).';
COMMENT ON COLUMN collectives.is_p2p IS 'True for send and recv.';
COMMENT ON COLUMN collectives.peer_rank IS 'Global rank of the other side of a send or recv, when known (the trace''s Dst Rank of a send or Src Rank of a recv, or bprof record); NULL for collectives.';
COMMENT ON COLUMN collectives.pg_name IS 'Process group name (id) when traced or implied by a single process group.';
COMMENT ON COLUMN collectives.pg_desc IS 'Process group description (default_pg, DATA_PARALLEL_GROUP, ...).';
COMMENT ON COLUMN collectives.pg_ranks IS 'Global ranks of the process group.';
COMMENT ON COLUMN collectives.group_size IS 'Number of ranks in the process group.';
COMMENT ON COLUMN collectives.seq IS 'Per-process-group sequence number of a collective (trace Seq, or the Flight Recorder under bprof record); for send/recv the Seq torch writes, which is the group''s collective counter + 1 (the same for every message until the next collective), or under bprof record the message number of its (group, sender, receiver) pair.';
COMMENT ON COLUMN collectives.dtype IS 'Element type as traced (Float, BFloat16, float, c10::BFloat16, ...).';
COMMENT ON COLUMN collectives.in_elems IS 'Input elements (In msg nelems, or the product of Input Dims).';
COMMENT ON COLUMN collectives.out_elems IS 'Output elements (Out msg nelems), when traced.';
COMMENT ON COLUMN collectives.in_bytes IS 'Input message size in bytes (in_elems * element size).';
COMMENT ON COLUMN collectives.out_bytes IS 'Output message size in bytes (out_elems * element size).';
COMMENT ON COLUMN collectives.num_parts IS 'Number of record_param_comms parts (more than 1 for coalesced collectives).';
COMMENT ON COLUMN collectives.tid IS 'CPU thread that issued the call.';
COMMENT ON COLUMN collectives.cpu_ts_ns IS 'Start of the CPU call, own clock.';
COMMENT ON COLUMN collectives.cpu_dur_ns IS 'Duration of the CPU call (launch cost for async NCCL ops).';
COMMENT ON COLUMN collectives.device_ts_ns IS 'Start of its work: first NCCL kernel, or the gloo worker range; own clock.';
COMMENT ON COLUMN collectives.device_dur_ns IS 'From device_ts_ns to the end of its last kernel or gloo range.';
COMMENT ON COLUMN collectives.num_kernels IS 'Number of device kernels (or gloo ranges) linked to the call.';
COMMENT ON COLUMN collectives.external_id IS 'External id of the CPU op the row was built from.';
COMMENT ON COLUMN collectives.step IS 'Profiler step of the call.';

CREATE TABLE steps (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    ts_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL,
    device_ts_ns BIGINT,
    device_dur_ns BIGINT,
    device_lag_ns BIGINT,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE steps IS 'Profiler steps (ProfilerStep#N ranges on the CPU) per rank, and where the rank has device events the step on the device: the device work the step launched.';
COMMENT ON COLUMN steps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN steps.rank IS 'Global rank.';
COMMENT ON COLUMN steps.step IS 'Step number N of ProfilerStep#N.';
COMMENT ON COLUMN steps.ts_ns IS 'Start of the step on the CPU, own clock.';
COMMENT ON COLUMN steps.dur_ns IS 'CPU duration of the step range.';
COMMENT ON COLUMN steps.device_ts_ns IS 'Start of the step on the device, own clock: the end of the previous step''s device work when the previous step (N-1) launched any (the device was busy with it, or idle waiting for this step''s launches), else (the first step) where the device was last busy before the step''s first device work, but not before the CPU range began (a device idle since then was waiting for the step), or with no device activity recorded before it (unknown before the window) at the CPU range start when the step''s first device work started before its second launch (the device was free), else at that first device work; NULL when the step launched no device work (CPU traces).';
COMMENT ON COLUMN steps.device_dur_ns IS 'From device_ts_ns to the end of the last device work the step launched (the latest end over this and earlier steps: the device steps tile its timeline); the step time where it exists.';
COMMENT ON COLUMN steps.device_lag_ns IS 'How long after the CPU step''s end (ts_ns + dur_ns) the device finished the step''s work: the queue the host ran ahead by; negative when the device was done before the CPU range ended. NULL with device_ts_ns.';

CREATE TABLE clock_samples (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    reference_rank INTEGER NOT NULL,
    phase VARCHAR NOT NULL,
    send_ns BIGINT NOT NULL,
    reference_ns BIGINT NOT NULL,
    recv_ns BIGINT NOT NULL
);
COMMENT ON TABLE clock_samples IS 'Clock ping-pongs between each host''s first rank and global rank 0 (bprof record), for clock alignment.';
COMMENT ON COLUMN clock_samples.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN clock_samples.rank IS 'The rank that sent the ping (its host''s first rank).';
COMMENT ON COLUMN clock_samples.reference_rank IS 'The rank that answered (global rank 0).';
COMMENT ON COLUMN clock_samples.phase IS 'When: start:<window> or end:<window>.';
COMMENT ON COLUMN clock_samples.send_ns IS 'Ping sent, on the sender''s clock.';
COMMENT ON COLUMN clock_samples.reference_ns IS 'Ping answered, on the reference rank''s clock.';
COMMENT ON COLUMN clock_samples.recv_ns IS 'Answer received, on the sender''s clock; the offset estimate reference_ns - (send_ns + recv_ns) / 2 is off by at most half of recv_ns - send_ns.';

CREATE TABLE metrics (
    run_id INTEGER NOT NULL,
    name VARCHAR NOT NULL,
    value DOUBLE,
    unit VARCHAR NOT NULL,
    computed_by VARCHAR NOT NULL,
    PRIMARY KEY (run_id, name)
);
COMMENT ON TABLE metrics IS 'Run-level numbers that CI and the history views read (mfu, step_time_ns, ...).';
COMMENT ON COLUMN metrics.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN metrics.name IS 'Metric name, unit-suffixed where it has one (step_time_ns, mfu_frac).';
COMMENT ON COLUMN metrics.value IS 'Value; NULL when not measurable.';
COMMENT ON COLUMN metrics.unit IS 'Unit of value (ns, frac, flops_per_s, count).';
COMMENT ON COLUMN metrics.computed_by IS 'Analyzer that wrote the metric.';

CREATE TABLE step_metrics (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    name VARCHAR NOT NULL,
    value DOUBLE,
    unit VARCHAR NOT NULL,
    PRIMARY KEY (run_id, rank, step, name)
);
COMMENT ON TABLE step_metrics IS 'Per-rank, per-step samples of a metric: the evidence the CI gate compares.';
COMMENT ON COLUMN step_metrics.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN step_metrics.rank IS 'Global rank.';
COMMENT ON COLUMN step_metrics.step IS 'Profiler step number.';
COMMENT ON COLUMN step_metrics.name IS 'Metric name (step_time_ns, mfu_frac, ...).';
COMMENT ON COLUMN step_metrics.value IS 'Value; NULL when not measurable.';
COMMENT ON COLUMN step_metrics.unit IS 'Unit of value.';

CREATE SEQUENCE finding_id_seq START 1;

CREATE TABLE findings (
    finding_id INTEGER PRIMARY KEY DEFAULT nextval('finding_id_seq'),
    run_id INTEGER NOT NULL,
    analyzer VARCHAR NOT NULL,
    severity VARCHAR NOT NULL,
    lost_ns BIGINT,
    title VARCHAR NOT NULL,
    detail VARCHAR,
    evidence JSON
);
COMMENT ON TABLE findings IS 'Ranked findings: what is slow and how much fixing it would buy.';
COMMENT ON COLUMN findings.finding_id IS 'Store-wide finding identifier.';
COMMENT ON COLUMN findings.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN findings.analyzer IS 'Analyzer that produced the finding.';
COMMENT ON COLUMN findings.severity IS 'info, warning or critical; not_measurable when the data cannot answer.';
COMMENT ON COLUMN findings.lost_ns IS 'How much shorter the step would be with this cause removed (counterfactual in detail); findings overlap and are never summed.';
COMMENT ON COLUMN findings.title IS 'One-line summary.';
COMMENT ON COLUMN findings.detail IS 'Explanation, including the counterfactual behind lost_ns.';
COMMENT ON COLUMN findings.evidence IS 'JSON naming the ranks, steps and events behind the finding.';

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
    host_ts_ns BIGINT,
    host_dur_ns BIGINT,
    device_lag_ns BIGINT,
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
COMMENT ON COLUMN reduced_spans.host_ts_ns IS 'Start of the step on the host (timeline_spans.host_ts_ns).';
COMMENT ON COLUMN reduced_spans.host_dur_ns IS 'Length of the step on the host (timeline_spans.host_dur_ns).';
COMMENT ON COLUMN reduced_spans.device_lag_ns IS 'Device lag behind the CPU step (timeline_spans.device_lag_ns).';

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
COMMENT ON COLUMN ci_components.family IS 'partition (breakdown_steps: compute, exposed_wait, exposed_transfer, overlapped_comm, memcpy, idle, other), kernel_class (kernels_classes), phase (phases_steps), idle_cause (idle_causes), comm_dim (breakdown_dims exposed time), straggler (stragglers_ranks lost_ns of a flagged rank), or a work amount of one rank: work_flops (kernels_flops executed FLOPs), work_calls (collectives calls), work_bytes (collectives input bytes).';
COMMENT ON COLUMN ci_components.name IS 'The part within its family (compute, gemm, data_wait, dp, rank 3, ...).';
COMMENT ON COLUMN ci_components.value_ns IS 'Nanoseconds per step (median over kept steps; for a straggler its lost_ns); for the work_* families the amount per step on that rank (FLOPs, calls or bytes), median over kept steps.';

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
    finding_title VARCHAR,
    together INTEGER
);
COMMENT ON TABLE replays IS 'bprof replay: recorded ops, loops of ops and collectives rerun on this machine, and the fix variants replay verified; one row per item and variant (replaying again replaces the row of the same item, variant and device).';
COMMENT ON COLUMN replays.replay_id IS 'Store-wide replay identifier.';
COMMENT ON COLUMN replays.run_id IS 'Run the item was taken from (runs.run_id).';
COMMENT ON COLUMN replays.replayed_at IS 'When the replay ran.';
COMMENT ON COLUMN replays.item_kind IS 'op (one op signature), op_loop (a run of same-signature matmul calls in a row: a Python loop), op_chain (a short sequence of top-level ops wired output to input, read from the execution trace), collective (one collective signature) or collective_storm (all calls of one all_reduce group in a step).';
COMMENT ON COLUMN replays.item IS 'Human label: op and shapes/dtypes, or collective op, dtype, elements and group.';
COMMENT ON COLUMN replays.item_key IS 'Exact signature as JSON (name, Input Dims, Input type, Input Strides, Concrete Inputs; or op, dtype, elements, group): identifies the item across replays.';
COMMENT ON COLUMN replays.rank IS 'Rank whose calls the traced times are taken from (op items: all ranks'' calls of the signature).';
COMMENT ON COLUMN replays.variant IS 'baseline (as recorded), or the fix tried: bf16, pad8, pad64, pad128, contiguous, bmm; for op chains compile (torch.compile of the chain); for collectives the same bytes per step in messages of another size: bucket (a storm''s calls fused into one), msg4x (every 4 calls of a storm fused), split4 (each call cut into 4).';
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
COMMENT ON COLUMN replays.together IS 'Op and chain replays: processes that ran the item at once on this host''s CPU (1: alone; N: bprof replay --together N, as N ranks shared the host); collectives: 1.';

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

CREATE SEQUENCE hang_id_seq START 1;

CREATE TABLE hangs (
    hang_id INTEGER PRIMARY KEY DEFAULT nextval('hang_id_seq'),
    run_id INTEGER NOT NULL,
    analysed_at TIMESTAMPTZ NOT NULL,
    source_path VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL,
    verdict VARCHAR NOT NULL,
    world_size INTEGER NOT NULL,
    num_dumps INTEGER NOT NULL,
    num_stuck_groups INTEGER NOT NULL,
    culprit_ranks INTEGER[] NOT NULL,
    culprits JSON NOT NULL,
    dead_ranks INTEGER[] NOT NULL,
    late_ranks INTEGER[],
    notes VARCHAR[] NOT NULL,
    detail JSON NOT NULL,
    UNIQUE (run_id, fingerprint)
);
COMMENT ON TABLE hangs IS 'Hang verdicts (bprof hang --db, bprof record --hang-timeout): one row per verdict on a stuck or dead job''s Flight Recorder dumps. A verdict attaches to the run of the same bprof record when one was ingested (its latest window), else to a run row of the hang alone (runs.num_ranks_ingested 0); the same dumps stored again for the same run replace the row.';
COMMENT ON COLUMN hangs.hang_id IS 'Store-wide hang identifier.';
COMMENT ON COLUMN hangs.run_id IS 'Run the verdict attaches to (runs.run_id).';
COMMENT ON COLUMN hangs.analysed_at IS 'When the verdict was stored.';
COMMENT ON COLUMN hangs.source_path IS 'The path(s) the dumps were read from (absolute), joined by ";".';
COMMENT ON COLUMN hangs.fingerprint IS 'sha256 over the sorted sha256s of the dump files and hang/ranks.json: the same dumps make the same fingerprint.';
COMMENT ON COLUMN hangs.verdict IS 'The verdict sentence bprof hang prints: the culprits and why the others wait, and (with a window captured before) which ranks were already late in it.';
COMMENT ON COLUMN hangs.world_size IS 'Ranks of the job the verdict judged (from the dumps, their groups, --world-size or bprof record).';
COMMENT ON COLUMN hangs.num_dumps IS 'Ranks with a usable dump (the others are missing, empty or unreadable: no_dump).';
COMMENT ON COLUMN hangs.num_stuck_groups IS 'Process groups the verdict found stuck.';
COMMENT ON COLUMN hangs.culprit_ranks IS 'The culprit ranks, most telling first (the order of culprits).';
COMMENT ON COLUMN hangs.culprits IS 'JSON list, one object per culprit: rank, reason (dead, mismatch, not_joined, behind, no_dump), process_group, last_seq (its last collective sequence number in that group), last_collective (described: op, seq, group, sizes, state), stack (top frames of its training thread, innermost first), groups (the stuck groups it explains), late_before (true/false: the straggler analysis of the window captured before flagged it; null without one).';
COMMENT ON COLUMN hangs.dead_ranks IS 'Ranks the launcher saw killed by a signal (bprof record --hang-timeout); empty otherwise.';
COMMENT ON COLUMN hangs.late_ranks IS 'Ranks the straggler analysis of the attached run (a step window captured before the hang) found late: stragglers_ranks flagged or measurably_slower; NULL when there is no such window or it has no straggler analysis.';
COMMENT ON COLUMN hangs.notes IS 'What the verdict could not read (missing, empty, unreadable dumps; ranks that did not answer).';
COMMENT ON COLUMN hangs.detail IS 'The whole verdict as bprof hang --json prints it (groups, members, mismatches, before).';

-- `bprof record --watch`: the per-iteration series every rank wrote between trace windows
-- (bprof.watch.files), and what the live analysis saw and did (watch/live.json). A recording is
-- the whole run directory; each of its captured windows is a run of its own (watch_windows links them).
CREATE SEQUENCE watch_recording_id_seq START 1;

CREATE TABLE watch_recordings (
    recording_id INTEGER PRIMARY KEY DEFAULT nextval('watch_recording_id_seq'),
    name VARCHAR NOT NULL UNIQUE,
    source_path VARCHAR NOT NULL,
    fingerprint VARCHAR NOT NULL UNIQUE,
    ingested_at TIMESTAMPTZ NOT NULL,
    record_id VARCHAR,
    command VARCHAR,
    started_at TIMESTAMPTZ,
    num_ranks INTEGER NOT NULL,
    num_iterations INTEGER NOT NULL,
    newest_complete_iteration INTEGER,
    options JSON
);
COMMENT ON TABLE watch_recordings IS 'One row per bprof record --watch run directory ingested: the watch series spans the whole recording, while each captured trace window is a run of its own (watch_windows). A watched job that opened no window is a recording with no run.';
COMMENT ON COLUMN watch_recordings.recording_id IS 'Store-wide recording identifier.';
COMMENT ON COLUMN watch_recordings.name IS 'Unique name among recordings and runs: watch-<the run directory''s name>, made unique with -2, -3, ...; bprof analyze and bprof export accept it as their RUN.';
COMMENT ON COLUMN watch_recordings.source_path IS 'The run directory as ingested (absolute).';
COMMENT ON COLUMN watch_recordings.fingerprint IS 'sha256 over the sorted "path:sha256" of every watch file (steps and groups Parquet, live.json): ingesting the same files again changes nothing.';
COMMENT ON COLUMN watch_recordings.ingested_at IS 'When it was ingested.';
COMMENT ON COLUMN watch_recordings.record_id IS 'bprof record''s run id (meta/launch.json run_id; runs.metadata $.bprof.run_id of its windows); NULL without launch.json.';
COMMENT ON COLUMN watch_recordings.command IS 'The recorded command (meta/launch.json), joined by spaces.';
COMMENT ON COLUMN watch_recordings.started_at IS 'When bprof record started the command (meta/launch.json started_ns).';
COMMENT ON COLUMN watch_recordings.num_ranks IS 'Ranks with watch rows.';
COMMENT ON COLUMN watch_recordings.num_iterations IS 'Distinct iterations with a row on any rank.';
COMMENT ON COLUMN watch_recordings.newest_complete_iteration IS 'Newest iteration every rank had reported when the live analysis stopped (live.json); NULL without live.json.';
COMMENT ON COLUMN watch_recordings.options IS 'The live analysis''s options (bprof.watch.live.WatchOptions, live.json options): score window, limits, rules.';

CREATE TABLE watch_steps (
    recording_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    host VARCHAR,
    start_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL,
    step_ns BIGINT NOT NULL,
    busy_ns BIGINT NOT NULL,
    data_wait_ns BIGINT NOT NULL,
    data_idle_ns BIGINT NOT NULL,
    gc_ns BIGINT NOT NULL,
    blocked_ns BIGINT NOT NULL,
    windowed BOOLEAN NOT NULL,
    PRIMARY KEY (recording_id, rank, attempt, iteration)
);
COMMENT ON TABLE watch_steps IS 'One row per rank, launcher attempt and iteration of a watched recording: the steps Parquet files of watch/rank<R>[.restart<K>]/ as the ranks wrote them (bprof.watch.files).';
COMMENT ON COLUMN watch_steps.recording_id IS 'Recording (watch_recordings.recording_id).';
COMMENT ON COLUMN watch_steps.rank IS 'Global rank.';
COMMENT ON COLUMN watch_steps.attempt IS 'The launcher''s attempt (torchrun restart; 0 for the first): folder rank<R>.restart<K>.';
COMMENT ON COLUMN watch_steps.iteration IS 'Iteration as bprof counts them (0-based; the one that ended at end_ns).';
COMMENT ON COLUMN watch_steps.host IS 'Host of the rank (the files'' bprof_watch metadata).';
COMMENT ON COLUMN watch_steps.start_ns IS 'Wall clock (the rank''s time.time_ns, shifted by its clock sample) when the iteration started.';
COMMENT ON COLUMN watch_steps.end_ns IS 'Wall clock when it ended (the next optimizer step''s hook).';
COMMENT ON COLUMN watch_steps.step_ns IS 'end_ns - start_ns: the rank''s step time.';
COMMENT ON COLUMN watch_steps.busy_ns IS 'CPU time of the training thread in the iteration: compute and Python on a CPU rank, no wait for peers.';
COMMENT ON COLUMN watch_steps.data_wait_ns IS 'Wall time in DataLoader iterators'' __next__.';
COMMENT ON COLUMN watch_steps.data_idle_ns IS 'The part of data_wait_ns the training thread slept (waiting for loader workers); busy_ns + data_idle_ns is the rank''s own time the live score compares.';
COMMENT ON COLUMN watch_steps.gc_ns IS 'Python garbage-collector pauses.';
COMMENT ON COLUMN watch_steps.blocked_ns IS 'Time blocked in collectives: synchronous calls and async Work.wait() from Python; on a CPU rank also DDP''s reducer''s wait at the end of backward (the sum of the iteration''s watch_groups rows).';
COMMENT ON COLUMN watch_steps.windowed IS 'A trace window was open in the iteration (its profiler''s cost is in the row).';

CREATE TABLE watch_groups (
    recording_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    iteration INTEGER NOT NULL,
    pg_name VARCHAR NOT NULL,
    pg_desc VARCHAR NOT NULL,
    blocked_ns BIGINT NOT NULL,
    num_calls BIGINT NOT NULL,
    PRIMARY KEY (recording_id, rank, attempt, iteration, pg_name, pg_desc)
);
COMMENT ON TABLE watch_groups IS 'Blocked collective time per rank, attempt, iteration and process group (the groups Parquet files): collectives called from Python, and on a CPU rank DDP''s reducer waits; only groups with calls in the iteration have a row.';
COMMENT ON COLUMN watch_groups.recording_id IS 'Recording (watch_recordings.recording_id).';
COMMENT ON COLUMN watch_groups.rank IS 'Global rank.';
COMMENT ON COLUMN watch_groups.attempt IS 'The launcher''s attempt (watch_steps.attempt).';
COMMENT ON COLUMN watch_groups.iteration IS 'Iteration (watch_steps.iteration).';
COMMENT ON COLUMN watch_groups.pg_name IS 'Process group name; "async" collects the waits of async work, whose group the Work does not say.';
COMMENT ON COLUMN watch_groups.pg_desc IS 'Process group description ("Work.wait" for the async waits).';
COMMENT ON COLUMN watch_groups.blocked_ns IS 'Time blocked in the group''s collectives in the iteration: synchronous calls from Python and async Work.wait() (group "async"), plus, on a CPU rank, the training thread''s time off the CPU inside backward in a DDP module''s group (its reducer''s wait for the buckets; preemption on an oversubscribed host counts too).';
COMMENT ON COLUMN watch_groups.num_calls IS 'Number of those calls; a backward pass counts as one call of its DDP module''s group (the files'' calls column).';

CREATE TABLE watch_windows (
    recording_id INTEGER NOT NULL,
    run_id INTEGER NOT NULL,
    window_range VARCHAR NOT NULL,
    start_iteration INTEGER NOT NULL,
    end_iteration INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    trigger_reason VARCHAR,
    PRIMARY KEY (recording_id, run_id)
);
COMMENT ON TABLE watch_windows IS 'The trace windows of a watched recording that were ingested as runs: one row per window run, chosen in advance (--steps) or opened by the watch (trigger).';
COMMENT ON COLUMN watch_windows.recording_id IS 'Recording (watch_recordings.recording_id).';
COMMENT ON COLUMN watch_windows.run_id IS 'The window''s run (runs.run_id).';
COMMENT ON COLUMN watch_windows.window_range IS 'The window as bprof record names it, half-open: start:end (runs.metadata $.window.window).';
COMMENT ON COLUMN watch_windows.start_iteration IS 'First iteration of the window.';
COMMENT ON COLUMN watch_windows.end_iteration IS 'First iteration after it.';
COMMENT ON COLUMN watch_windows.attempt IS 'The launcher''s attempt that captured it.';
COMMENT ON COLUMN watch_windows.trigger_reason IS 'Why the watch opened it (meta/rank<R>.json windows_captured trigger, the reason of watch_triggers); NULL for a window chosen in advance.';

CREATE TABLE watch_triggers (
    recording_id INTEGER NOT NULL,
    trigger_index INTEGER NOT NULL,
    seen_at_iteration INTEGER NOT NULL,
    start_iteration INTEGER NOT NULL,
    num_steps INTEGER NOT NULL,
    rule VARCHAR NOT NULL,
    rank INTEGER,
    reason VARCHAR NOT NULL,
    time_ns BIGINT NOT NULL,
    run_id INTEGER,
    PRIMARY KEY (recording_id, trigger_index)
);
COMMENT ON TABLE watch_triggers IS 'Trace windows the live analysis asked for (live.json triggers), in order, and the run each one produced.';
COMMENT ON COLUMN watch_triggers.recording_id IS 'Recording (watch_recordings.recording_id).';
COMMENT ON COLUMN watch_triggers.trigger_index IS 'Position in live.json''s triggers (0-based).';
COMMENT ON COLUMN watch_triggers.seen_at_iteration IS 'Newest iteration every rank had reported when the rule fired.';
COMMENT ON COLUMN watch_triggers.start_iteration IS 'First iteration of the window it asked for.';
COMMENT ON COLUMN watch_triggers.num_steps IS 'Iterations the window was to capture.';
COMMENT ON COLUMN watch_triggers.rule IS 'rank (a rank''s score stayed above the limit) or step (the job''s step above the factor x its rolling median).';
COMMENT ON COLUMN watch_triggers.rank IS 'The rank the rank rule named; NULL for the step rule.';
COMMENT ON COLUMN watch_triggers.reason IS 'The reason sentence the live analysis printed and the ranks recorded with the window.';
COMMENT ON COLUMN watch_triggers.time_ns IS 'Wall clock of the record process when it fired (time.time_ns).';
COMMENT ON COLUMN watch_triggers.run_id IS 'The run of the window it produced (watch_windows.run_id, same start iteration); NULL when that window was not captured or not ingested.';

CREATE TABLE watch_episodes (
    recording_id INTEGER NOT NULL,
    episode_index INTEGER NOT NULL,
    rule VARCHAR NOT NULL,
    rank INTEGER,
    first_iteration INTEGER NOT NULL,
    last_iteration INTEGER NOT NULL,
    worst_score DOUBLE NOT NULL,
    triggered BOOLEAN NOT NULL,
    PRIMARY KEY (recording_id, episode_index)
);
COMMENT ON TABLE watch_episodes IS 'When it went wrong: each stretch of iterations a rule held (a rank slow, or the job''s step slow), from live.json episodes.';
COMMENT ON COLUMN watch_episodes.recording_id IS 'Recording (watch_recordings.recording_id).';
COMMENT ON COLUMN watch_episodes.episode_index IS 'Position in live.json''s episodes (0-based, in the order they began).';
COMMENT ON COLUMN watch_episodes.rule IS 'rank or step (watch_triggers.rule).';
COMMENT ON COLUMN watch_episodes.rank IS 'The slow rank (rank rule); NULL for the step rule.';
COMMENT ON COLUMN watch_episodes.first_iteration IS 'First iteration of the stretch the rule held over.';
COMMENT ON COLUMN watch_episodes.last_iteration IS 'Last iteration it held (the episode ends once it has not held for the score window).';
COMMENT ON COLUMN watch_episodes.worst_score IS 'Highest score over the episode: the rank''s own time over its peers'' (rank rule), or the job''s step over its rolling median (step rule).';
COMMENT ON COLUMN watch_episodes.triggered IS 'The episode opened a trace window.';

CREATE TABLE watch_scores (
    recording_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    host VARCHAR,
    iteration INTEGER NOT NULL,
    own_ns BIGINT NOT NULL,
    peers_own_ns BIGINT NOT NULL,
    excess_ns BIGINT NOT NULL,
    score DOUBLE NOT NULL,
    num_slow_iterations INTEGER NOT NULL,
    PRIMARY KEY (recording_id, rank)
);
COMMENT ON TABLE watch_scores IS 'Each rank''s last live straggler score (live.json scores): the median over its last score-window iterations.';
COMMENT ON COLUMN watch_scores.recording_id IS 'Recording (watch_recordings.recording_id).';
COMMENT ON COLUMN watch_scores.rank IS 'Global rank.';
COMMENT ON COLUMN watch_scores.host IS 'Its host.';
COMMENT ON COLUMN watch_scores.iteration IS 'Newest iteration the score includes.';
COMMENT ON COLUMN watch_scores.own_ns IS 'Median own time (busy_ns + data_idle_ns) over the score''s iterations, rounded to the nanosecond.';
COMMENT ON COLUMN watch_scores.peers_own_ns IS 'Median over the same iterations of the other ranks'' median own time.';
COMMENT ON COLUMN watch_scores.excess_ns IS 'Median of own minus peers'' own time (negative: faster than its peers).';
COMMENT ON COLUMN watch_scores.score IS 'Median of own over peers'' own time: the straggler score (bprof_straggler_score).';
COMMENT ON COLUMN watch_scores.num_slow_iterations IS 'Consecutive iterations, up to the newest, the rank met the rank rule (live.json slow_run).';
