"""The hot REST routes answered over HTTP/1.1 in the server process: Envoy proxies them
here as they came (no transcoding into gRPC), so they skip the gRPC hop — the transcoder on
Envoy's side and grpc.aio's on ours. Every other route, and every internal caller, goes
through the gRPC contract (proto/). The routes here call the same domain code as their
gRPC methods, and are observed and refused as an rpc is (server/services/rpc.py)."""
