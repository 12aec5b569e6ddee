// The flame graph's legend: what every color on screen means. Outside a diff, one entry per color category (see
// colors.js) with the share of the range's value in stacks that hold a frame of it (total time, callees included);
// in a diff, the color scale: how red (grew) and blue (shrank) intensity map to the change in share.

import { MATCH_COLOR, categoryColor, categoryLabel, categoryNote, diffColor } from "./colors.js";
import { percent } from "./format.js";

const BINARIES_SHOWN = 12; // native binaries named; the categories of their own are always shown

function item(color, text, note, category) {
  const entry = document.createElement("span");
  entry.className = "legend-item";
  entry.dataset.category = category;
  entry.title = note;
  const swatch = document.createElement("i");
  swatch.style.background = color;
  entry.append(swatch, text);
  return entry;
}

/** Fill `container` with the legend of `flame` (a FlameGraph with a model) over a range whose value is `total`. */
export function renderLegend(container, flame, total) {
  container.replaceChildren();
  container.classList.toggle("diff-scale", flame.model.diff);
  if (flame.model.diff) {
    renderDiffScale(container, flame.diffScale);
    return;
  }
  const head = document.createElement("span");
  head.className = "legend-head";
  head.textContent = "total time in:";
  container.append(head);
  let binaries = 0;
  let more = 0;
  for (const [category, value] of flame.categoryTotals()) {
    const isBinary = category.startsWith("binary:");
    if (isBinary && ++binaries > BINARIES_SHOWN) {
      more++;
      continue;
    }
    let text = `${categoryLabel(category)} ${percent(value, total)}`;
    if (category === "lost") text += ": the agent's stack map was full; raise its --stack-entries "
      + "(FLEETPROF_AGENT_STACK_ENTRIES)";
    container.append(item(categoryColor(category), text, categoryNote(category), category));
  }
  if (more) {
    const rest = document.createElement("span");
    rest.textContent = `+${more} more binaries`;
    container.append(rest);
  }
  if (flame.match) container.append(item(MATCH_COLOR, `search match ${percent(flame.matched, total)}`,
    "frames whose name the search matches", "match"));
}

/** The diff's color scale: a bar from the largest shrink (blue) through no change to the largest growth (red), in
 * points of share of each range, and what is drawn how. */
function renderDiffScale(container, scale) {
  const points = (v) => `${v > 0 ? "+" : v < 0 ? "−" : ""}${Math.abs(100 * v).toFixed(1)}`;
  const steps = [];
  for (let k = -10; k <= 10; k++) steps.push(diffColor((k / 10) * scale, scale));
  const bar = document.createElement("span");
  bar.className = "scale-bar";
  bar.style.background = `linear-gradient(to right, ${steps.join(", ")})`;
  const label = (text, cls) => {
    const el = document.createElement("span");
    el.className = cls;
    el.textContent = text;
    return el;
  };
  container.append(label("change in share of its range:", "legend-head"),
    label(`${points(-scale)} points (shrank)`, "scale-min"), bar, label(`${points(scale)} points (grew)`, "scale-max"),
    label("width: the range shown; a changed frame is drawn at least 3 px wide; frames gone from it are not drawn",
      "scale-note"));
}
