// The console's service worker: a <video src> cannot send the Authorization header, so this
// adds the signed-in key to the player's requests for a video's content — and to nothing
// else. It lets the browser ask byte ranges (play at once, seek) instead of downloading the
// whole file first. The key is held in memory only; when the worker was stopped and has none,
// it asks the tab that made the request (which keeps it in sessionStorage).
const CONTENT = /^\/api\/v1\/videos\/[^/]+\/content$/;
let key = null;

self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));

self.addEventListener("message", (event) => {
  if (event.data && event.data.type === "key") key = event.data.key || null;
});

async function keyFrom(clientId) {
  if (key) return key;
  const client = clientId ? await self.clients.get(clientId) : null;
  if (!client) return null;
  const channel = new MessageChannel();
  const answer = new Promise((resolve) => {
    channel.port1.onmessage = (event) => resolve(event.data || null);
    setTimeout(() => resolve(null), 2000);  // a tab that does not answer: no key
  });
  client.postMessage({ type: "key?" }, [channel.port2]);
  key = await answer;
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
