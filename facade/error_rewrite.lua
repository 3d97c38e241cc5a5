-- The REST side of the error model. First in http_filters, so on the response path it runs
-- LAST (encoder filters run in reverse order): after the transcoder, and over Envoy's own
-- replies (flood protection, 413, 404...). Only a native header_mutation filter runs after it:
-- it strips the gRPC internals (grpc-* headers and trailers, x-envoy-upstream-service-time)
-- from every response, so a plain success needs nothing of this script, and
-- facade/envoy_config.py wraps it in a matcher that skips it for those: it runs for a
-- response with a grpc-status other than 0, x-http-status, x-ratelimit-window-ms,
-- x-gateway-transcoder-failure or x-gateway-headers-from-trailers. The request side is
-- facade/edge_request.lua.
--
-- Globals rendered before this file from the error table (server/errors.py):
--   GRPC_FAILURES: gRPC code -> { HTTP status, JSON error body }, for failures that did not
--   come from a gateway handler; UNEXPECTED_FAILURE: the same for any other code.
--
-- * Flood protection's 429: X-RateLimit-Reset (epoch ms) computed from the refill window the
--   rate limit filter put in x-ratelimit-window-ms, which is removed.
-- * gRPC failure: the server put the HTTP status and the documented JSON body in metadata
--   (x-http-status, x-error-body): apply them, copy Retry-After / X-RateLimit-*, and strip
--   every gRPC internal. A failure without them (from the gRPC stack itself) gets a fixed,
--   documented message: internals never reach the client.
-- * gRPC success with x-http-status (202, 204): apply that status.
-- * gRPC success on a route whose server sends response headers as trailing metadata (one
--   gRPC operation less than initial metadata of their own): HEADERS_FROM_TRAILERS, set for
--   those routes only (facade/envoy_config.py, which also marks their responses with
--   x-gateway-headers-from-trailers), names the trailers that become headers.

-- nil: no trailer becomes a header (see above).
HEADERS_FROM_TRAILERS = nil

local INTERNAL = { "x-http-status", "x-error-body", "grpc-status", "grpc-message",
                   "grpc-status-details-bin", "grpc-accept-encoding", "content-length",
                   "x-envoy-upstream-service-time" }

local function copied_header(name)
  return name == "retry-after" or name == "content-range" or name:sub(1, 12) == "x-ratelimit-"
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
-- The marker's value is the request's method (before the transcoder made it a POST).
local function transcoder_failure(handle)
  return handle:headers():get("x-gateway-transcoder-failure")
end

local function rewrite_transcoder_failure(handle, method)
  local b = handle:body(true)
  local text = ""
  if b ~= nil and b:length() > 0 then text = b:getBytes(0, b:length()) end
  local field = text:match('"message":"([%a_][%w_]*)[%.%[:]')
  local body
  if field ~= nil and #field <= 64 then
    body = '{"error":{"code":400,"message":"Invalid value for ' .. field ..
      '","metadata":{"param":"' .. field .. '"}}}'
  elseif method == "GET" or method == "HEAD" then
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
  local method = transcoder_failure(handle)
  if method ~= nil then
    rewrite_transcoder_failure(handle, method)
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
  -- Success: the header_mutation filter strips the gRPC internals (headers and trailers) and
  -- the x-gateway-* marks.
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
  if HEADERS_FROM_TRAILERS == nil then return end
  -- Wait for the whole body first: the headers are then held until the trailers are in
  -- (trailers() alone lets them go on). The transcoder holds a unary answer's headers until
  -- its end anyway.
  handle:body(true)
  local t = handle:trailers()
  if t == nil then return end
  h = handle:headers()  -- header wrappers taken before a yield are invalid afterwards
  for _, name in ipairs(HEADERS_FROM_TRAILERS) do
    local value = t:get(name)
    if value ~= nil then
      t:remove(name)
      h:replace(name, value)
    end
  end
end
