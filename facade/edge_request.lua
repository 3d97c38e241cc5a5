-- The request side of the edge protection (docs/operating.md). It runs only for the
-- requests that need it: facade/envoy_config.py wraps this filter in a matcher that skips it
-- when a request is a plain REST call (an /api/v1/ path, no upgrade, no CONNECT or OPTIONS, a
-- Content-Length well under the limit, an allowed or absent Origin, printable forwarded
-- headers). Those are forwarded as they are; a native header_mutation filter after this one
-- drops every header not in FORWARDED, for them and for these.
--
-- Globals rendered before this file (facade/envoy_config.py):
--   ALLOWED_ORIGINS: nil (any origin) or a set of the origins allowed to call from a browser.
--   MAX_REQUEST_BYTES: the body limit of the media routes (MEDIA_PATHS: the transcoder
--     enforces it on a JSON body's bytes, the server on a streamed one's).
--   MAX_CONTROL_BODY_BYTES: the body limit of every other route (JSON of a few KiB).
--   FORWARDED: the set of request headers that go on to the server.
--   BODY_ROUTES: method -> the Lua patterns of the paths of its routes with a body.
--   ERROR_MESSAGES: HTTP status -> its default message.
--
-- * Request whose Content-Length is over its route's limit: 413 at once, before its body is
--   read.
-- * Request to a route with a body (BODY_ROUTES) without a well-formed key: 401 at once,
--   before its body is read or buffered (every such route needs a key; the server would
--   refuse it with the same words, but only once the transcoder had buffered the body).
-- * Request with an Origin that is not allowed: 400 before anything else runs (preflights
--   included, so they get no allow headers). OPTIONS that is no preflight: 404.

-- Drops what is not forwarded; returns the name of a forwarded header whose value is not
-- printable ASCII (gRPC metadata must be: the server's gRPC stack would log the value, an API
-- key perhaps, before refusing it), or nil.
local function keep_only_forwarded(h)
  local dropped = {}
  local unprintable = nil
  for name, value in pairs(h) do
    if name:sub(1, 1) ~= ":" then
      if not FORWARDED[name] then
        dropped[#dropped + 1] = name
      elseif unprintable == nil and value:find("[^\t -~]") then
        unprintable = name
      end
    end
  end
  for _, name in ipairs(dropped) do h:remove(name) end
  return unprintable
end

-- The server's words (server/auth.py, bearer_token) for an Authorization it cannot use, or
-- nil when the value has the shape of a key (the server still checks the key itself).
local function unusable_authorization(value)
  if value == nil then
    return "Missing Authorization header: send 'Authorization: Bearer <API key>'"
  end
  value = value:gsub("^%s+", ""):gsub("%s+$", "")
  local space = value:find(" ", 1, true)
  local token = space and value:sub(space + 1):gsub("^%s+", "") or ""
  if space == nil or value:sub(1, space - 1):lower() ~= "bearer" or token == "" then
    return "Malformed Authorization header: expected 'Bearer <API key>'"
  end
  local kind, digits = token:match("^sk%-gw%-(%w%w)%-([0-9a-f]+)$")
  if (kind ~= "v1" and kind ~= "op") or #digits ~= 64 then
    return "Invalid API key"
  end
  return nil
end

-- Whether `method` `path` is a route with a body (an unknown one stays a 404 of the router).
local function has_body_route(method, path)
  local patterns = BODY_ROUTES[method]
  if patterns == nil then return false end
  local bare = path:match("^[^?]*")
  for _, pattern in ipairs(patterns) do
    if bare:find(pattern) then return true end
  end
  return false
end

function envoy_on_request(handle)
  local h = handle:headers()
  -- Local replies: local_reply_config turns the text into the documented error body.
  local path = h:get(":path") or ""
  if path == "/console" or path:sub(1, 9) == "/console?" then
    -- The console lives under /console/ (its pages link relative to it).
    handle:respond({ [":status"] = "308", ["location"] = "/console/" }, "")
    return
  end
  if path == "/console/" or path:sub(1, 10) == "/console/?" then
    -- The console's pages are one document; which page shows is in the #fragment.
    h:replace(":path", "/console/index.html")
    path = "/console/index.html"
  end
  if path:sub(1, 8) ~= "/api/v1/" and path:sub(1, 9) ~= "/console/" then
    -- Only the REST API and the console are public (gRPC callers use the server's port).
    handle:respond({ [":status"] = "404" }, ERROR_MESSAGES[404])
    return
  end
  if h:get("upgrade") ~= nil or h:get(":method") == "CONNECT" then
    -- No route speaks WebSocket (or any other upgrade); without this the request would wait
    -- for a body that never ends.
    handle:respond({ [":status"] = "400" }, "Protocol upgrades (WebSocket) are not supported")
    return
  end
  local unprintable = keep_only_forwarded(h)
  if unprintable ~= nil then
    handle:respond({ [":status"] = "400" },
      "Header " .. unprintable .. " must be printable ASCII")
    return
  end
  if h:get(":method") == "OPTIONS" and h:get("access-control-request-method") == nil then
    handle:respond({ [":status"] = "404" }, ERROR_MESSAGES[404])  -- only CORS preflights exist
    return
  end
  local length = tonumber(h:get("content-length") or "0")
  local limit = MAX_CONTROL_BODY_BYTES
  if MEDIA_PATHS[path:match("^[^?]*")] then limit = MAX_REQUEST_BYTES end
  if length ~= nil and length > limit then
    handle:respond({ [":status"] = "413" }, ERROR_MESSAGES[413])
    return
  end
  if has_body_route(h:get(":method"), path) then
    local refused = unusable_authorization(h:get("authorization"))
    if refused ~= nil then
      handle:respond({ [":status"] = "401" }, refused)
      return
    end
  end
  if ALLOWED_ORIGINS == nil then return end
  local origin = h:get("origin")
  if origin == nil or ALLOWED_ORIGINS[origin] then return end
  handle:respond({ [":status"] = "400" }, "Request blocked by CORS: origin not allowed")
end
