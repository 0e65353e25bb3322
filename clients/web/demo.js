// Shared helpers of the demo pages (clients/web/*.html), an ES module with no dependencies.
// The API key: with server.api_keys set every request needs one, and a page gets it as
// ?api_key=<key> in its own URL; pages load this module as "./demo.js" + keyQuery so it (and what
// it loads) carries the key too. The key is only ever sent to this server.
"use strict";

const pageKey = new URLSearchParams(location.search).get("api_key");
export const apiKey = pageKey || new URL(import.meta.url).searchParams.get("api_key") || "";
export const keyQuery = apiKey ? "?api_key=" + encodeURIComponent(apiKey) : "";

export const PAGES = [
  ["", "Home", "what this server serves"],
  ["voice", "Voice", "talk to the voice model (OpenAI Realtime, server VAD, barge-in)"],
  ["duplex", "Duplex", "talk with the full-duplex model (listens and speaks at once; resume after a drop)"],
  ["world", "World", "drive the world model with the keyboard and mouse"],
  ["robot", "Robot", "send observations to the robot policy (OpenPI), plot its action chunks"],
  ["status", "Status", "sessions, capacity, batch sizes and latencies, live"],
];

/** `path` (absolute, on this server) with the page's API key added to its query. */
export function withKey(path, params = {}) {
  const url = new URL(path, location.origin);
  for (const [k, v] of Object.entries(params)) url.searchParams.set(k, v);
  if (apiKey) url.searchParams.set("api_key", apiKey);
  return url.pathname + url.search;
}

/** ws://host or wss://host of this server. */
export const wsOrigin = (location.protocol === "https:" ? "wss://" : "ws://") + location.host;

/** The websocket URL of `path` on this server (same host; the key in the query). */
export function wsUrl(path, params = {}) {
  return wsOrigin + withKey(path, params);
}

/** GET a JSON document of this server; throws an Error with a readable message. */
export async function fetchJson(path) {
  const response = await fetch(withKey(path), {headers: {Accept: "application/json"}});
  if (!response.ok) throw new Error(`${path}: HTTP ${response.status} ${(await response.text()).trim()}`);
  return response.json();
}

/** The stylesheet and the navigation bar every page shares; `current` is the page's name. */
export function frame(current) {
  const css = document.createElement("link");
  css.rel = "stylesheet";
  css.href = "demo.css" + keyQuery;
  document.head.append(css);
  const nav = document.createElement("nav");
  nav.setAttribute("aria-label", "demo pages");
  for (const [name, title] of PAGES) {
    const a = document.createElement("a");
    a.href = withKey("/demo/" + name);
    a.textContent = title;
    if (name === current) a.setAttribute("aria-current", "page");
    nav.append(a);
  }
  document.body.prepend(nav);
}

/** Session kinds enabled on this server (from /v1/models), or null when it could not be read. An
 * unavailable kind (its weights not installed) counts: connecting to it is closed 1008 with the reason. */
export async function servedKinds() {
  try {
    const models = await fetchJson("/v1/models");
    return new Set([...models.session_kinds, ...Object.keys(models.unavailable_kinds || {})]);
  } catch (e) {
    return null;
  }
}

// what a websocket close means to a person (the server's close codes, realtime/ws.py)
const CLOSES = {
  1000: "closed",
  1001: "the server is shutting down",
  1006: "connection lost (no close frame): is the server running?",
  1008: "refused by the server",
  1009: "a message was too large for the server",
  1011: "the server hit an internal error",
  1013: "the server is busy (all sessions in use, or still loading): try again shortly",
};

/** A one-line description of a websocket close event. */
export function closeText(event) {
  const what = CLOSES[event.code] || "closed";
  return `${what} (code ${event.code}${event.reason ? ": " + event.reason : ""})`;
}

const MAX_ERRORS_SHOWN = 20;

/** Show `text` in the page's status line (#status, role=status) and, for errors, in #errors. */
export function say(text, isError = false) {
  document.getElementById("status").textContent = text;
  if (!isError) return;
  const list = document.getElementById("errors");
  const item = document.createElement("li");
  item.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  list.prepend(item);
  while (list.children.length > MAX_ERRORS_SHOWN) list.lastChild.remove();
}
