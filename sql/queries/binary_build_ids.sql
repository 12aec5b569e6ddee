-- The build id of each of {binaries} (file names as frames store them) that has one: the newest frame definition's
-- (migration 0013), one row per binary. pprof exports put it in each binary's Mapping beside the file name, so
-- `go tool pprof`, Parca and Pyroscope can fetch the binary or its debug info by it. A binary stored without a GNU
-- build id (Python source files, perf maps, a file known only by its hash) has no row.
SELECT toString(binary) AS binary, argMax(id, last_seen) AS build_id
FROM (SELECT binary, build_id AS id, last_seen FROM frames WHERE binary IN {binaries:Array(String)} AND build_id != '')
GROUP BY binary
ORDER BY binary
