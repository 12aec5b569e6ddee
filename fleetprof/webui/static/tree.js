// The call tree of a flame graph answer: typed arrays over its nodes in preorder (parent, frame, depth, total, self,
// x, end), built in one pass: the stacks are sorted by frame name first, so stacks that share a prefix are neighbours
// and each one only adds the nodes past its common prefix with the previous one. No per-node objects, no hash map;
// siblings come out in name order, as in flamegraph.pl. `end[i]` is one past the last node of i's subtree, so a frame
// too narrow to see skips its whole subtree while drawing.

function compareText(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The call tree of a /api/flamegraph (or /diff) answer, as typed arrays in preorder; with `mergeProcesses`, the
 * processes' root frames are left out, so the stacks of every process merge. */
export function buildTree(data, mergeProcesses = false) {
  const { frames, binaries, stacks, counts } = data;
  const frameBinary = data.frame_binary;
  const base = data.base_counts || null;
  const nFrames = frames.length;
  const byName = Array.from({ length: nFrames }, (_, i) => i)
    .sort((a, b) => compareText(frames[a], frames[b]) || compareText(binaries[frameBinary[a]], binaries[frameBinary[b]]));
  const rank = new Int32Array(nFrames);
  byName.forEach((f, r) => { rank[f] = r; });

  // Every stack's frames as ranks, in one flat array (stack k at [start[k], start[k + 1])): comparisons stay in one
  // typed array instead of 100k small ones. skip[f]: 1 for a process's root frame when processes merge.
  const languages = data.languages || [];
  const processLanguage = languages.indexOf("process");
  const skip = new Uint8Array(nFrames);
  if (mergeProcesses && processLanguage >= 0) {
    data.frame_language.forEach((l, f) => { skip[f] = l === processLanguage ? 1 : 0; });
  }
  const n = stacks.length;
  const start = new Int32Array(n + 1);
  for (let k = 0; k < n; k++) {
    const s = stacks[k];
    start[k + 1] = start[k] + s.length - (s.length ? skip[s[0]] : 0);
  }
  const ranks = new Int32Array(start[n]);
  let longest = 0;
  for (let k = 0; k < n; k++) {
    const s = stacks[k];
    const at = start[k];
    const from = s.length ? skip[s[0]] : 0;
    for (let j = from; j < s.length; j++) ranks[at + j - from] = rank[s[j]];
    if (s.length - from > longest) longest = s.length - from;
  }
  const order = new Int32Array(n);
  for (let k = 0; k < n; k++) order[k] = k;
  order.sort((a, b) => {
    const ia = start[a], ib = start[b];
    const la = start[a + 1] - ia, lb = start[b + 1] - ib;
    const m = la < lb ? la : lb;
    for (let i = 0; i < m; i++) {
      const d = ranks[ia + i] - ranks[ib + i];
      if (d !== 0) return d;
    }
    return la - lb;
  });

  const capacity = start[n] + 1;
  const parent = new Int32Array(capacity);
  const frame = new Int32Array(capacity);
  const depth = new Uint16Array(capacity);
  const total = new Float64Array(capacity);
  const self = new Float64Array(capacity);
  const baseTotal = base ? new Float64Array(capacity) : null;
  const baseSelf = base ? new Float64Array(capacity) : null;
  parent[0] = -1;
  frame[0] = -1;
  const path = new Int32Array(longest + 1); // path[d]: the node at depth d of the stack being added
  let count = 1;
  let prevAt = 0;
  let prevLen = 0;
  for (let q = 0; q < n; q++) {
    const k = order[q];
    const at = start[k], len = start[k + 1] - at;
    let common = 0;
    const m = len < prevLen ? len : prevLen;
    while (common < m && ranks[at + common] === ranks[prevAt + common]) common++;
    for (let j = common; j < len; j++) {
      const node = count++;
      parent[node] = path[j];
      frame[node] = byName[ranks[at + j]];
      depth[node] = j + 1;
      path[j + 1] = node;
    }
    self[path[len]] += counts[k];
    if (base) baseSelf[path[len]] += base[k];
    prevAt = at;
    prevLen = len;
  }
  // totals: self plus the children's totals; children come after their parent in preorder
  for (let i = 0; i < count; i++) total[i] = self[i];
  for (let i = count - 1; i > 0; i--) total[parent[i]] += total[i];
  if (base) {
    for (let i = 0; i < count; i++) baseTotal[i] = baseSelf[i];
    for (let i = count - 1; i > 0; i--) baseTotal[parent[i]] += baseTotal[i];
  }

  // x: where each node starts, in value units; children follow each other from their parent's start.
  const x = new Float64Array(count);
  const next = new Float64Array(count);
  for (let i = 1; i < count; i++) {
    const p = parent[i];
    x[i] = next[p];
    next[p] += total[i];
    next[i] = x[i];
  }
  const end = new Int32Array(count);
  for (let i = 0; i < count; i++) end[i] = i + 1;
  for (let i = count - 1; i > 0; i--) if (end[i] > end[parent[i]]) end[parent[i]] = end[i];

  return {
    count, parent: parent.subarray(0, count), frame: frame.subarray(0, count), depth: depth.subarray(0, count),
    total: total.subarray(0, count), self: self.subarray(0, count), x, end, maxDepth: longest,
    baseTotal: baseTotal && baseTotal.subarray(0, count), baseSelf: baseSelf && baseSelf.subarray(0, count),
    frames, binaries, frameBinary, diff: Boolean(base), merged: mergeProcesses,
    languages, frameLanguage: data.frame_language || [],
  };
}
