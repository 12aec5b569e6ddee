-- A command for each process of the query's samples (a CTE with node, pid and comm) that has none (GPU rows carry no
-- comm yet): the one the CPU sampler saw it run most in [since, until), the greater name on a tie. A process never
-- sampled on CPU has no row; a LEFT JOIN on these fills its comm with '' (join_use_nulls is off).
SELECT node, pid, argMax(comm, (count, comm)) AS comm
FROM
(
    SELECT node, pid, toString(comm) AS comm, sum(count) AS count
    FROM cpu_samples
    WHERE ts >= {since:DateTime} AND ts < {until:DateTime}
      AND (node, pid) IN (SELECT node, pid FROM samples WHERE comm = '')
    GROUP BY node, pid, comm
)
GROUP BY node, pid
