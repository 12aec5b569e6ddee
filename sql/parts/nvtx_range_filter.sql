-- The nvtx_range filter, an AND line of a WHERE over records with the launching thread's NVTX range path (nvtx_range):
-- '' takes them all; a text without ' > ' takes a path with an element equal to it, a text with ' > ' a path that
-- starts with those whole elements (the rule gpu_kernel_samples_by_stack spells out).
AND ({nvtx_range:String} = '' OR if(position({nvtx_range:String}, ' > ') = 0,
        has(splitByString(' > ', toString(nvtx_range)), {nvtx_range:String}),
        nvtx_range = {nvtx_range:String} OR startsWith(nvtx_range, concat({nvtx_range:String}, ' > '))))
