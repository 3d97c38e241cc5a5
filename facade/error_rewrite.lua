-- The REST side of the error model. First in http_filters, so on the response path it runs
-- LAST (encoder filters run in reverse order): after the transcoder, and over Envoy's own
-- replies (flood protection, 413, 404...).
--
-- Globals rendered before this file from the operator's settings (facade/envoy_config.py):
--   ALLOWED_ORIGINS: nil (any origin) or a set of the origins allowed to call from a browser.
--   MAX_REQUEST_BYTES: the request body limit (the buffer filter enforces it on the bytes).
-- and from the error table (server/errors.py):
--   GRPC_FAILURES: gRPC code -> { HTTP status, JSON error body }, for failures that did not
--   come from a gateway handler; UNEXPECTED_FAILURE: the same for any other code.
--   ERROR_MESSAGES: HTTP status -> its default message.
--
-- * Request whose Content-Length is over the limit: 413 at once, before its body is read.
-- * Request with an Origin that is not allowed: 400 before anything else runs (preflights
--   included, so they get no allow headers). OPTIONS that is no preflight: 404.
-- * Flood protection's 429: X-RateLimit-Reset (epoch ms) computed from the refill window the
--   rate limit filter put in x-ratelimit-window-ms, which is removed.
-- * gRPC failure: the server put the HTTP status and the documented JSON body in metadata
--   (x-http-status, x-error-body): apply them, copy Retry-After / X-RateLimit-*, and strip
--   every gRPC internal. A failure without them (from the gRPC stack itself) gets a fixed,
--   documented message: internals never reach the client.
-- * gRPC success with x-http-status (202, 204): apply that status.
-- * gRPC success on a route whose server sends response headers as trailing metadata (one
--   gRPC operation less than initial metadata of their own): HEADERS_FROM_TRAILERS, set for
--   those routes only (facade/envoy_config.py), names the trailers that become headers.

-- nil: no trailer becomes a header (see above).
HEADERS_FROM_TRAILERS = nil

local INTERNAL = { "x-http-status", "x-error-body", "grpc-status", "grpc-message",
                   "grpc-status-details-bin", "grpc-accept-encoding", "content-length",
                   "x-envoy-upstream-service-time" }

local function copied_header(name)
  return name == "retry-after" or name:sub(1, 12) == "x-ratelimit-"
end

-- The request headers that go on to the server (and the filters after this one): what the
-- server reads (authorization, x-session-id, x-request-id, traceparent/tracestate), what the
-- transcoder and the cors filter read, and what Envoy itself set for this hop. Every other
-- client header is dropped here: the server never sees a header it does not use, and names
-- or values gRPC refuses (grpc-*, *-bin, "x!y") cannot fail the call.
local FORWARDED = {
  ["authorization"] = true, ["content-type"] = true, ["content-length"] = true,
  ["transfer-encoding"] = true, ["x-session-id"] = true, ["x-request-id"] = true,
  ["traceparent"] = true, ["tracestate"] = true, ["origin"] = true,
  ["access-control-request-method"] = true, ["access-control-request-headers"] = true,
  ["x-forwarded-for"] = true, ["x-forwarded-proto"] = true,
}

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
  local method = h:get(":method")
  if method == "GET" or method == "HEAD" then
    handle:streamInfo():dynamicMetadata():set("gateway.request", "bodiless", true)
  end
  if h:get(":method") == "OPTIONS" and h:get("access-control-request-method") == nil then
    handle:respond({ [":status"] = "404" }, ERROR_MESSAGES[404])  -- only CORS preflights exist
    return
  end
  local length = tonumber(h:get("content-length") or "0")
  if length ~= nil and length > MAX_REQUEST_BYTES then
    handle:respond({ [":status"] = "413" }, ERROR_MESSAGES[413])
    return
  end
  if ALLOWED_ORIGINS == nil then return end
  local origin = h:get("origin")
  if origin == nil or ALLOWED_ORIGINS[origin] then return end
  handle:respond({ [":status"] = "400" }, "Request blocked by CORS: origin not allowed")
end

-- The flood protection's 429 carries the limit and remaining; add when it resets.
local function finish_rate_limited(h, window_ms)
  h:remove("x-ratelimit-window-ms")
  h:remove("x-envoy-ratelimited")
  local reset = os.time() * 1000 + (tonumber(window_ms) or 1000)
  h:replace("x-ratelimit-reset", string.format("%d", reset))
end

local function rewrite_error(handle, grpc_status)
  local h = handle:headers()
  local status = h:get("x-http-status")
  local body = h:get("x-error-body")
  local copy = {}
  for k, v in pairs(h) do
    if copied_header(k) then copy[k] = v end
  end
  -- Trailers-only response: the stream has ended and body(true) returns an empty buffer.
  -- Headers then trailers (the server sent metadata before failing): body(true) yields until
  -- the trailers and returns nil, so read the trailers and ask again.
  local b = handle:body(true)
  if b == nil then
    local t = handle:trailers()
    if t ~= nil then
      status = status or t:get("x-http-status")
      body = body or t:get("x-error-body")
      for k, v in pairs(t) do
        if copied_header(k) then copy[k] = v end
      end
      for k, _ in pairs(copy) do t:remove(k) end
      for _, k in ipairs(INTERNAL) do t:remove(k) end
    end
    b = handle:body(true)
  end
  if status == nil or body == nil then
    local failure = GRPC_FAILURES[tonumber(grpc_status)] or UNEXPECTED_FAILURE
    status = tostring(failure[1])
    body = failure[2]
  end
  h = handle:headers()  -- header wrappers taken before a yield are invalid afterwards
  for _, k in ipairs(INTERNAL) do h:remove(k) end
  h:replace(":status", status)
  h:replace("content-type", "application/json")
  for k, v in pairs(copy) do h:replace(k, v) end
  b:setBytes(body)
end

-- The transcoder's own 400s (a body that is not JSON, or a value of the wrong type) quote
-- the request: "Unexpected token.\n{"value": s3cr3t...", "value: invalid value 1234 for
-- type TYPE_STRING". Error messages never echo a request: answer with a fixed message,
-- naming the top-level field when the transcoder named one (a field of the contract).
-- local_reply_config marks them with x-gateway-transcoder-failure (facade/envoy_config.py).
local function is_transcoder_failure(handle)
  return handle:headers():get("x-gateway-transcoder-failure") ~= nil
end

local function rewrite_transcoder_failure(handle)
  local b = handle:body(true)
  local text = ""
  if b ~= nil and b:length() > 0 then text = b:getBytes(0, b:length()) end
  local field = text:match('"message":"([%a_][%w_]*)[%.%[:]')
  local body
  if field ~= nil and #field <= 64 then
    body = '{"error":{"code":400,"message":"Invalid value for ' .. field ..
      '","metadata":{"param":"' .. field .. '"}}}'
  elseif handle:streamInfo():dynamicMetadata():get("gateway.request") ~= nil then
    -- a request without a body: what the transcoder could not read is its query string
    body = '{"error":{"code":400,"message":"Invalid query parameters"}}'
  else
    body = '{"error":{"code":400,"message":"Request body is not valid JSON"}}'
  end
  if b == nil then return end  -- the transcoder's replies always carry a body
  local h = handle:headers()
  h:remove("x-gateway-transcoder-failure")
  h:remove("content-length")
  h:replace("content-type", "application/json")
  b:setBytes(body)
end

function envoy_on_response(handle)
  if is_transcoder_failure(handle) then
    rewrite_transcoder_failure(handle)
    return
  end
  local h = handle:headers()
  local window_ms = h:get("x-ratelimit-window-ms")
  if window_ms ~= nil then
    finish_rate_limited(h, window_ms)
    return
  end
  local grpc_status = h:get("grpc-status")
  if grpc_status ~= nil and grpc_status ~= "0" then
    rewrite_error(handle, grpc_status)
    return
  end
  h:remove("grpc-status"); h:remove("grpc-message"); h:remove("grpc-accept-encoding")
  h:remove("grpc-status-details-bin")
  h:remove("x-envoy-upstream-service-time")
  local xs = h:get("x-http-status")
  if xs ~= nil then
    h:remove("x-http-status")
    h:replace(":status", xs)
    if xs == "204" then
      h:remove("content-type")
      handle:body(true):setBytes("")
      handle:headers():remove("content-length")
    end
  end
  if HEADERS_FROM_TRAILERS ~= nil then
    -- Wait for the whole body first: the headers are then held until the trailers are in
    -- (trailers() alone lets them go on). The transcoder holds a unary answer's headers
    -- until its end anyway.
    handle:body(true)
  end
  -- The transcoder forwards grpc-status/grpc-message as trailers too; HTTP/2 clients would
  -- see them. Strip them (this waits for the end of the stream).
  local t = handle:trailers()
  if t ~= nil then
    t:remove("grpc-status"); t:remove("grpc-message"); t:remove("grpc-status-details-bin")
    if HEADERS_FROM_TRAILERS ~= nil then
      h = handle:headers()  -- header wrappers taken before a yield are invalid afterwards
      for _, name in ipairs(HEADERS_FROM_TRAILERS) do
        local value = t:get(name)
        if value ~= nil then
          t:remove(name)
          h:replace(name, value)
        end
      end
    end
  end
end
