// The console's service worker: a <video src> cannot send the Authorization header, so this
// adds the signed-in key to the player's requests for a video's content — and to nothing
// else. It lets the browser ask byte ranges (play at once, seek) instead of downloading the
// whole file first. Each tab's key is held in memory only, for that tab's requests alone (two
// tabs may be signed in with different keys); when the worker was stopped and has none, it
// asks the tab that made the request (which keeps it in sessionStorage).
const CONTENT = /^\/api\/v1\/videos\/[^/]+\/content$/;
const keys = new Map();  // client (tab) id -> its key

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("message", (event) => {
  if (!event.data || event.data.type !== "key" || !event.source) return;
  if (event.data.key) keys.set(event.source.id, event.data.key);
  else keys.delete(event.source.id);
});

async function keyFrom(clientId) {
  if (!clientId) return null;
  if (keys.has(clientId)) return keys.get(clientId);
  const client = await self.clients.get(clientId);
  if (!client) return null;
  const channel = new MessageChannel();
  const answer = new Promise((resolve) => {
    channel.port1.onmessage = (event) => resolve(event.data || null);
    setTimeout(() => resolve(null), 2000);  // a tab that does not answer: no key
  });
  client.postMessage({ type: "key?" }, [channel.port2]);
  const key = await answer;
  if (key) keys.set(clientId, key);
  // Forget the tabs that closed.
  const open = new Set((await self.clients.matchAll()).map((c) => c.id));
  for (const id of keys.keys()) if (!open.has(id)) keys.delete(id);
  return key;
}

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (url.origin !== self.location.origin || event.request.method !== "GET" || !CONTENT.test(url.pathname)) return;
  event.respondWith((async () => {
    const headers = new Headers(event.request.headers);
    const found = await keyFrom(event.clientId || event.resultingClientId);
    if (found) headers.set("Authorization", `Bearer ${found}`);
    return fetch(url.href, { headers, cache: "no-store", credentials: "omit" });
  })());
});
