-- Each frame's build id: the GNU build id (or the file hash that stands for one) of the binary the symbolizer named
-- it from, the kernel's for kernel frames, '' where there is none (Python source files, [unknown], [truncated], GPU
-- kernels). pprof's Mapping carries it beside the file name, so `go tool pprof`, Parca and Pyroscope can fetch the
-- binary or its debug info by it. A frame id hashes the name, binary and kind only, so two builds of one binary that
-- name a function alike share a frame: the newest definition's build id is the frame's (argMax on last_seen, as for
-- the other columns). Rows written before this migration read '' (ADD COLUMN rewrites no part).
--
-- Cluster: frames is one replicated table on every node (0002): the ALTER runs once, without ON CLUSTER, as in 0011.
ALTER TABLE frames
    ADD COLUMN IF NOT EXISTS build_id LowCardinality(String) DEFAULT '' CODEC(ZSTD(1));

-- frame_names (0011) with each frame's build id. frames is whole on every node, so this stays a plain view there.
-- @cluster on every node
CREATE OR REPLACE VIEW frame_names AS
SELECT frame_id,
       argMax(function, last_seen) AS function,
       argMax(binary, last_seen) AS binary,
       argMax(kind, last_seen) AS kind,
       argMax(language, last_seen) AS language,
       argMax(build_id, last_seen) AS build_id
FROM frames
GROUP BY frame_id;
