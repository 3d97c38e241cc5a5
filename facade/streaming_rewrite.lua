-- Appended to error_rewrite.lua for routes that stream their body (video content): a
-- failure before the first byte arrives as a trailers-only gRPC response and is rewritten
-- as usual; a success is passed through as it streams — waiting for the trailers would
-- hold the whole video in memory.
function envoy_on_response(handle)
  if is_transcoder_failure(handle) then
    rewrite_transcoder_failure(handle)
    return
  end
  local h = handle:headers()
  local grpc_status = h:get("grpc-status")
  if grpc_status ~= nil and grpc_status ~= "0" then
    rewrite_error(handle, grpc_status)
    return
  end
  h:remove("grpc-status"); h:remove("grpc-message"); h:remove("grpc-accept-encoding")
  h:remove("grpc-status-details-bin"); h:remove("x-envoy-upstream-service-time")
  h:remove("x-http-status")
end
