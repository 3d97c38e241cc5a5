-- Appended to error_rewrite.lua for routes that stream their body (video content): a
-- failure before the first byte arrives as a trailers-only gRPC response and is rewritten
-- as usual; a success is passed through as it streams — waiting for the trailers would
-- hold the whole video in memory — with the status the server asked for (206 for a byte
-- range). (The header_mutation filter strips the gRPC internals.)
function envoy_on_response(handle)
  local method = transcoder_failure(handle)
  if method ~= nil then
    rewrite_transcoder_failure(handle, method)
    return
  end
  local h = handle:headers()
  local grpc_status = h:get("grpc-status")
  if grpc_status ~= nil and grpc_status ~= "0" then
    rewrite_error(handle, grpc_status)
    return
  end
  local xs = h:get("x-http-status")
  if xs ~= nil then
    h:remove("x-http-status")
    h:replace(":status", xs)
  end
  -- A range's length, known before its first byte (gRPC metadata cannot carry
  -- content-length itself): sent as Content-Length instead of chunked framing.
  local length = h:get("x-content-length")
  if length ~= nil then
    h:remove("x-content-length")
    h:replace("content-length", length)
  end
end
