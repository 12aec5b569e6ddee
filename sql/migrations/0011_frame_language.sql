-- Each frame's language, stored with it: what the UI colors by and a query can filter on (`WHERE language =
-- 'python'`). It follows from the frame's kind, so it is a MATERIALIZED column: written with every new row, and for
-- the rows of older parts computed when read (ADD COLUMN rewrites no part). INTERPRETED frames are Python's: the
-- interpreter's own frames (`qualname (file:line)`, producers/python_frames.py) and CPython's -X perf trampolines
-- (`py::function:file`) alike; GPU_KERNEL frames are the GPU kernels at the leaves of launching stacks.
--
-- Cluster: frames is one replicated table on every node (0002): the ALTER runs once, without ON CLUSTER, as in 0008.
ALTER TABLE frames
    ADD COLUMN IF NOT EXISTS language LowCardinality(String)
    MATERIALIZED multiIf(kind = 'INTERPRETED', 'python', kind = 'KERNEL', 'kernel', kind = 'GPU_KERNEL', 'gpu',
                         kind = 'NATIVE', 'native', 'unknown')
    CODEC(ZSTD(1));

-- frame_names (0009) with each frame's language. frames is whole on every node, so this stays a plain view there.
-- @cluster on every node
CREATE OR REPLACE VIEW frame_names AS
SELECT frame_id,
       argMax(function, last_seen) AS function,
       argMax(binary, last_seen) AS binary,
       argMax(kind, last_seen) AS kind,
       argMax(language, last_seen) AS language
FROM frames
GROUP BY frame_id;
