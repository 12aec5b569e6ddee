// What a flame graph frame's color says. Frames fall into categories, each with a color of its own, so the legend can
// name every color on screen: each process's root frame, GPU kernels, the kernel, Python, JIT code, frames whose
// stack the agent lost, unknown frames, and then native code colored by binary (or all of it one color, by
// language). A frame's lightness varies a little with its name, so neighbours of one category stay apart.

export const CATEGORIES = {
  process: { label: "process", rgb: [96, 125, 139], note: "each process's stacks start at a frame of its own: command (pid)" },
  gpu: { label: "GPU kernels", rgb: [39, 174, 96], note: "GPU kernels, the leaves of their launching CPU stacks" },
  nvtx: { label: "NVTX ranges", rgb: [142, 68, 173], note: "NVTX range paths of the launches: [nvtx] forward" },
  kernel: { label: "kernel ([kernel.kallsyms])", rgb: [192, 57, 43], note: "Linux kernel code" },
  python: { label: "python", rgb: [55, 118, 171], note: "Python functions (the frames' language)" },
  jit: { label: "[jit]", rgb: [212, 172, 13], note: "code a JIT compiler generated (named by a perf map)" },
  native: { label: "native", rgb: [230, 126, 34], note: "machine code of binaries and libraries" },
  lost: { label: "[stack lost]", rgb: [66, 66, 66], dark: true,
    note: "the agent's stack map was full, so these samples lost their stack: raise the agent's --stack-entries "
      + "(FLEETPROF_AGENT_STACK_ENTRIES)" },
  unknown: { label: "[unknown …]", rgb: [205, 205, 205], flat: true,
    note: "frames or stacks without a name ([unknown 0x…], [unknown stack 0x…])" },
};
// Native binaries, by binary: hues kept apart from the categories' own.
const PALETTE = [[255, 127, 14], [148, 103, 189], [140, 86, 75], [227, 119, 194], [188, 189, 34], [23, 190, 207],
  [0, 128, 128], [205, 133, 63]];
export const MATCH_COLOR = "#e040fb";
export const ROOT_COLOR = "rgb(190, 190, 190)";

export function hash(text) {
  let h = 2166136261; // FNV-1a
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 16777619);
  return h >>> 0;
}

const binaryKeys = new Map(); // binary -> its category, made once (a graph has 20k frames in a few dozen binaries)
const shadesOf = new Map(); // category -> its 7 fills, made once

/** The category of a frame: a key of CATEGORIES, or (native code colored by binary) "binary:" and its name. */
export function frameCategory(name, binary, language, by = "binary") {
  if (language === "process") return "process";
  if (name.startsWith("[stack lost")) return "lost";
  if (name.startsWith("[unknown")) return "unknown";
  if (language === "gpu" || binary === "[gpu]") return "gpu";
  if (language === "nvtx" || binary === "[nvtx]") return "nvtx";
  if (language === "kernel" || binary === "[kernel.kallsyms]") return "kernel";
  if (language === "python") return "python";
  if (binary === "[jit]") return "jit";
  if (by === "language") return language && language !== "unknown" ? "native" : "unknown";
  if (!binary) return "unknown";
  let key = binaryKeys.get(binary);
  if (key === undefined) binaryKeys.set(binary, (key = `binary:${binary}`));
  return key;
}

function baseColor(category) {
  if (category.startsWith("binary:")) return PALETTE[hash(category.slice(7)) % PALETTE.length];
  return CATEGORIES[category].rgb;
}

/** The legend's label of a category. */
export function categoryLabel(category) {
  return category.startsWith("binary:") ? category.slice(7) : CATEGORIES[category].label;
}

export function categoryNote(category) {
  return category.startsWith("binary:") ? "native code of this binary" : CATEGORIES[category].note;
}

/** The legend's swatch: the category's color as frames show it at their middle lightness. */
export function categoryColor(category) {
  return mixed(baseColor(category), category, 0.57);
}

/** A frame's fill: its category's color, lightened toward white by one of 7 steps that follows its name. */
export function frameColor(category, name) {
  let shades = shadesOf.get(category);
  if (shades === undefined) {
    shades = Array.from({ length: 7 }, (_, k) => mixed(baseColor(category), category, 0.45 + k * 0.04));
    shadesOf.set(category, shades);
  }
  return shades[hash(name) % 7];
}

/** The color of a frame's label on its fill. */
export function textColor(category) {
  return CATEGORIES[category]?.dark ? "#fff" : "#111";
}

function mixed([r, g, b], category, mix) {
  const info = CATEGORIES[category];
  if (info?.flat) return `rgb(${r}, ${g}, ${b})`;
  if (info?.dark) return `rgb(${r}, ${g}, ${b})`; // dark, with white text
  const m = (c) => Math.round(c + (255 - c) * mix); // toward white: text on it stays readable
  return `rgb(${m(r)}, ${m(g)}, ${m(b)})`;
}

/** A diff's color for a change `delta` on a scale whose end is `scale`: red grew, blue shrank, 21 shades. */
export function diffColor(delta, scale) {
  const level = Math.round(Math.min(1, Math.abs(delta) / scale) * 20) / 20;
  const light = 96 - 46 * level;
  return delta >= 0 ? `hsl(0, 85%, ${light}%)` : `hsl(215, 85%, ${light}%)`;
}
