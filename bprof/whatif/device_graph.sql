-- What did each rank's host ask of its GPU in a step, and what did the GPU run? The launch-level
-- nodes of bprof.whatif.device_graph: every CUDA/HIP runtime or driver call (its thread), every
-- kernel, memcpy and memset (its device and stream), tied by correlation id.
-- Reads events, timeline_threads; writes the temp table _dg_events (read one rank at a time: it is
-- written in rank order, so a rank's rows sit together).
--
-- Definitions.
-- * step: events.step (GPU rows: the step of their launch), so a step's GPU work that runs on
--   after the next step started is still its own; rows outside steps are left out.
-- * training: the call is on a thread that drives training (timeline_threads: main or backward);
--   other threads (an NCCL watchdog polling cudaEventQuery) are nodes but never end a step.
-- * op_name: the CPU op whose External id the row carries (the innermost op that launched it), so
--   a scenario can name kernels by their op (aten::mm) as well as by their own name.

CREATE OR REPLACE TEMP TABLE _dg_events AS
WITH ops AS (
    SELECT rank, external_id, any_value(name) AS op_name FROM events
    WHERE run_id = $run_id AND kind = 'cpu_op' AND external_id IS NOT NULL
    GROUP BY ALL
), threads AS (
    SELECT rank, tid FROM timeline_threads WHERE run_id = $run_id
)
SELECT e.rank, e.step, e.kind IN ('cuda_runtime', 'cuda_driver') AS is_host, e.name, o.op_name, e.tid,
    coalesce(e.device, -1) AS device, coalesce(e.stream, -1) AS stream, e.ts_ns, greatest(e.dur_ns, 0) AS dur_ns,
    e.correlation, (t.tid IS NOT NULL) AS training
FROM events e
LEFT JOIN ops o ON o.rank = e.rank AND o.external_id = e.external_id
LEFT JOIN threads t ON t.rank = e.rank AND t.tid = e.tid
WHERE e.run_id = $run_id AND e.step IS NOT NULL AND e.ts_ns IS NOT NULL
  AND e.kind IN ('cuda_runtime', 'cuda_driver', 'kernel', 'gpu_memcpy', 'gpu_memset')
ORDER BY e.rank, e.ts_ns;
