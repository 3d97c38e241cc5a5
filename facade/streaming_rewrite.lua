-- Appended to error_rewrite.lua for routes that stream their body (video content): a
-- failure before the first byte arrives as a trailers-only gRPC response and is rewritten
-- as usual; a success is passed through as it streams — waiting for the trailers would
-- hold the whole video in memory. (The header_mutation filter strips the gRPC internals.)
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
  -- A byte range (206, with its Content-Range) is the one other status a stream answers.
  local xs = h:get("x-http-status")
  if xs ~= nil then
    h:remove("x-http-status")
    h:replace(":status", xs)
  end
end
