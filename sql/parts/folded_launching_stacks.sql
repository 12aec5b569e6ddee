-- The launching CPU stack of each stack id in the query's samples (a CTE with a stack_id column), as folded text
-- "root;…;caller": the GPU stack without its GPU_KERNEL leaf frame (the kernel, or the copy's or set's label, that the
-- correlator appends), so stacks that differ only in their leaf or in addresses fold alike. The stack_names view
-- (migration 0009) picks one definition per stack and frame id; a stack without one reads "[unknown stack 0x…]"; a ';'
-- or newline inside a function name becomes ':' or ' ', as in folded flame graphs.
SELECT s.stack_id AS stack_id,
       arrayStringConcat(arrayMap(fn -> replaceAll(replaceAll(fn, ';', ':'), '\n', ' '),
           if(empty(n.functions), [concat('[unknown stack 0x', lower(hex(s.stack_id)), ']')],
              arrayFilter((fn, kind) -> kind != 'GPU_KERNEL', n.functions, n.kinds))),
           ';') AS stack
FROM (SELECT DISTINCT stack_id FROM samples) AS s
LEFT JOIN
(
    -- IN on the view reaches the stacks table's sorting key: only the sampled stacks' granules are read
    SELECT stack_id, functions, kinds FROM stack_names WHERE stack_id IN (SELECT stack_id FROM samples)
) AS n ON n.stack_id = s.stack_id
