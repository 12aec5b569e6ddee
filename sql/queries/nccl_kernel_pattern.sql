-- The regular expression (RE2) that NCCL's kernel names match, mangled or demangled: fleetprof/collectives.py's
-- NCCL_KERNEL, letter for letter (tests/test_collectives_sql.py compares them). Written once in SQL: the queries that
-- hide or isolate collectives, and nccl_kernels, include it in parentheses as the pattern of match(kernel_name, …),
-- where it is a scalar subquery, a constant; match() on a LowCardinality column runs once per distinct name.
SELECT concat('^(?:_Z[0-9]+)?(?:void )?(?:ncclDevKernel|ncclDevKernelDebug|ncclKernel|ncclKernelDebug',
              '|ncclSymDevKernel|ncclSymkDevKernel)_') AS pattern
