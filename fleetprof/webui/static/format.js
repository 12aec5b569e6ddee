// How the page writes values and times, in one place: one time format everywhere (24-hour UTC, as the CLI and the
// API speak, and as the charts' axes are drawn), values in their unit, and the round tick values of chart axes.

export const TIME_ZONE = "UTC";

/** 'YYYY-MM-DD HH:MM:SS' in UTC: the range inputs (the server reads it back as ISO-8601 without a zone: UTC), the
 * labels and the charts' hover values. */
export function formatTime(ms) {
  return new Date(ms).toISOString().slice(0, 19).replace("T", " ");
}

/** An axis tick of a time axis: the same format cut to what the spacing of the ticks needs. */
export function formatTimeTick(ms, spacingS, spanS) {
  const text = formatTime(ms);
  if (spacingS >= 86400) return text.slice(5, 10); // MM-DD
  if (spacingS < 60) return text.slice(11, 19); // HH:MM:SS
  return (spanS > 86400 ? `${text.slice(5, 10)} ` : "") + text.slice(11, 16); // [MM-DD ]HH:MM
}

/** A value in the flame graph's unit, for people. */
export function formatValue(value, unit) {
  if (unit === "ns") {
    if (value >= 1e9) return `${(value / 1e9).toFixed(3)} s`;
    if (value >= 1e6) return `${(value / 1e6).toFixed(3)} ms`;
    if (value >= 1e3) return `${(value / 1e3).toFixed(1)} µs`;
    return `${value} ns`;
  }
  return `${value.toLocaleString("en-US")} ${value === 1 ? "sample" : "samples"}`;
}

export function percent(part, whole) {
  return whole > 0 ? `${((100 * part) / whole).toFixed(1)}%` : "-";
}

/** The round step (1, 2 or 5 times a power of ten) that cuts `span` into about `count` parts. */
export function niceStep(span, count = 4) {
  if (!(span > 0)) return 1;
  const raw = span / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const factor = [1, 2, 5, 10].find((f) => f * power >= raw);
  return factor * power;
}

/** The top of an axis from 0 that holds `max`: the next multiple of its round step. */
export function niceMax(max, count = 4) {
  if (!(max > 0)) return 1;
  const step = niceStep(max, count);
  return Math.ceil(max / step - 1e-9) * step;
}

/** Round tick values from min to max (both on the grid of the round step). */
export function niceTicks(min, max, count = 4) {
  const step = niceStep(max - min, count);
  const ticks = [];
  for (let k = Math.ceil(min / step - 1e-9); k * step <= max + step * 1e-9; k++) ticks.push(round(k * step, step));
  return ticks;
}

function round(value, step) {
  const decimals = Math.max(0, -Math.floor(Math.log10(step)));
  return Number(value.toFixed(decimals));
}

/** Tick labels for values on one grid: as many decimals as the step needs, thousands as k, millions as M. */
export function formatTicks(values) {
  const step = values.length > 1 ? Math.abs(values[1] - values[0]) : Math.abs(values[0] || 1);
  return values.map((v) => formatNumber(v, step));
}

export function formatNumber(v, step = null) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  const scaled = (d, suffix) => {
    const s = (step ?? a) / d;
    const decimals = s > 0 && s < 1 ? Math.min(3, -Math.floor(Math.log10(s))) : 0;
    return `${(v / d).toFixed(decimals)}${suffix}`;
  };
  if (a >= 1e6) return scaled(1e6, "M");
  if (a >= 1e4) return scaled(1e3, "k");
  if (step === null) return Number.isInteger(v) || a >= 100 ? `${Math.round(v)}` : v.toFixed(a >= 10 ? 1 : 2);
  return scaled(1, "");
}
