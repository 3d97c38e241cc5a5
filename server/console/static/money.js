// Money in the console, one way: amounts are exact to the micro-dollar (the API's have at most
// six decimal places), so they are shown in full — at least two decimals, no trailing zeros
// beyond them ("$10.00", "$0.002", "$9.991739") — in balances, charges, tables and axes alike.

// A JSON number of USD as integer micro-dollars (exact for every amount the API can send).
export function micros(value) {
  return Math.round(Number(value) * 1e6);
}

export function usd(value) {
  if (value === null || value === undefined || value === "") return "—";
  const n = Number(value);
  if (!Number.isFinite(n)) return "—";
  const m = Math.round(n * 1e6);
  const whole = Math.floor(Math.abs(m) / 1e6);
  let fraction = String(Math.abs(m) % 1e6).padStart(6, "0").replace(/0+$/, "");
  if (fraction.length < 2) fraction = fraction.padEnd(2, "0");
  return `${m < 0 ? "-" : ""}$${whole.toLocaleString("en-US")}.${fraction}`;
}

export function usdFromMicros(value) {
  return usd(value / 1e6);
}

// What a person typed in an amount field, as the API takes it: nothing is null; a decimal
// (signed or not) is sent as the number written, anything else as typed, so the gateway's one
// grammar accepts it or refuses it in its own words (never the browser's).
export function amount(text) {
  const typed = String(text).trim();
  if (typed === "") return null;
  return /^-?[0-9]+(\.[0-9]+)?$/.test(typed) ? Number(typed) : typed;
}
